"""Browser test: Debian's chromium through Playwright opens the page, steps three times and runs a race.

Checks that the token grid, the mask heatmap and the race counters rendered, and saves screenshots to
test-artifacts/. Skipped where /usr/bin/chromium is absent (CI installs it in .ci/run).
"""

import re
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    """The app on the embedded model when it has weights, else on a tiny model folder built here."""
    import app
    from conftest import EMBEDDED
    from helpers import serve, tiny_llama

    if (EMBEDDED / "model.safetensors").exists():
        model_path = str(EMBEDDED)
    else:
        folder = tmp_path_factory.mktemp("tiny-browser")
        model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
        model.model.config.mask_token_id = 1
        model.model.float().save_pretrained(folder)
        model.tokenizer.save_pretrained(folder)
        model_path = str(folder)
    yield from serve(app.build_demo(model_path,
                            max_seconds=None))  # no clock limit: a busy machine must not cut a race


def open_app(browser, url: str, prompt: str, limit: int):
    """A new page on the app, loaded, with ``prompt`` and the new-token ``limit`` typed in."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url, wait_until="domcontentloaded")
    page.locator("#step-btn").wait_for(timeout=60_000)
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#limit input").fill(str(limit))
    page.locator("#limit input").press("Tab")
    return page


# The Benchmark tab's three report charts, found by their titles.
BENCH_CHARTS = ("[...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd.layout && gd.layout.title && "
                "/^(Paired ratios|Timing decomposition|Tokens\\/NFE)/.test(String(gd.layout.title.text)))")


def open_benchmark(page, timeout: int = 30_000) -> None:
    """Open the Benchmark tab and wait for its report: the table and the three charts (the table can arrive before
    Plotly has drawn the charts beside it, as seen in CI, so a test reading either waits for both)."""
    page.get_by_role("tab", name="Benchmark").click()
    page.wait_for_function("document.querySelectorAll('.bench-summary table').length > 0", timeout=timeout)
    page.wait_for_function(f"() => {BENCH_CHARTS}.length === 3", timeout=timeout)


def test_page_steps_races_and_renders(app_url):
    from playwright.sync_api import expect, sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = open_app(browser, app_url, "def fibonacci(n):\n", 24)
            for k in (1, 2, 3):
                page.locator("#step-btn").click()
                expect(page.locator(f'#token-grid [data-iteration="{k}"]')).to_be_visible(timeout=60_000)
            grid = page.locator("#token-grid table.token-grid")
            expect(grid).to_be_visible()
            assert page.locator("#token-grid .chip").count() > 5
            assert "Iteration 3" in page.locator("#token-grid .token-grid-head").inner_text()
            expect(page.locator("#mask-plot .js-plotly-plot")).to_be_visible(timeout=30_000)
            assert page.locator("#mask-plot .heatmaplayer, #mask-plot .hm").count() > 0
            assert page.locator('#step-stats [data-stat="nfe"]').count() == 1
            page.screenshot(path=str(ARTIFACTS / "step.png"), full_page=True)

            page.get_by_role("tab", name="Race").click()
            page.locator("#race-btn").click()
            for lane in ("linear", "quadratic", "packed"):
                expect(page.locator(f'#race-lanes [data-lane="{lane}"][data-done="1"]')).to_be_visible(timeout=90_000)
            nfe = page.locator('#race-lanes [data-lane="packed"] [data-counter="nfe"]').inner_text()
            tokens = page.locator('#race-lanes [data-lane="packed"] [data-counter="tokens"]').inner_text()
            assert int(nfe) > 0 and int(tokens) > 0
            throughput = page.locator('#race-lanes [data-lane="linear"] [data-counter="throughput"]').inner_text()
            assert re.search(r"\d", throughput)
            expect(page.locator("#race-badge [data-badge]").first).to_be_visible()
            assert "identical to AR" in page.locator("#race-badge").inner_text()
            expect(page.locator("#race-nfe .js-plotly-plot")).to_be_visible(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "race.png"), full_page=True)

            page.get_by_role("tab", name="Explain").click()
            expect(page.locator("#cost-plot .js-plotly-plot")).to_be_visible(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "explain.png"), full_page=True)
        finally:
            browser.close()
