"""Browser tests of the teaching features: Linear-SS stepped call by call, the narration under the grid,
the mask plot's row and key labels, the race verdict and summary, and a race with the scripted drafter.

Debian's chromium through Playwright, the same app fixture as test_browser.py (the embedded model, or a
tiny one) and the same skip rule. Saves screenshots to test-artifacts/teach-*.png (one per passing test,
teach-linear-call-1.png for Linear-SS after its drafting call only).
"""

import re

import pytest

from test_browser import ARGS, ARTIFACTS, CHROMIUM, app_url, open_app  # noqa: F401  (app_url: the app fixture)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")

STEP_MS = 60_000  # ms: one Step (the first one loads the model)
RACE_MS = 120_000  # ms: a whole race and its replay at 24 new tokens


@pytest.fixture(scope="module")
def browser():
    """One headless chromium for the module (each test opens its own page: a new Gradio session)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser, app_url):  # noqa: F811
    """A fresh page (its own browser context, so its own session) on the app, closed after the test."""
    page = open_app(browser, app_url, "def fibonacci(n):\n", 24)
    yield page
    page.context.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"teach-{name}.png"), full_page=True)


def _choose(page, radio_id: str, label: str) -> None:
    """Click the option of Gradio radio ``#radio_id`` whose label starts with ``label``."""
    option = page.locator(f"#{radio_id} label").filter(has_text=re.compile("^\\s*" + re.escape(label)))
    option.first.click()
    # Gradio keeps the input inside the label; wait until the browser shows it checked.
    page.wait_for_function(
        """([id, text]) => [...document.querySelectorAll(`#${id} label`)].some(
               l => l.innerText.trim().startsWith(text) && l.querySelector('input')?.checked)""",
        arg=[radio_id, label], timeout=10_000)


PLOT_JS = """(id) => {
    const gd = document.querySelector(`#${id} .js-plotly-plot`);
    if (!gd || !gd.data) return null;
    const svgText = (sel) => [...gd.querySelectorAll(sel)].map(t => t.textContent);
    return {
        title: (gd.layout && gd.layout.title && gd.layout.title.text) || '',
        traces: gd.data.map(t => ({type: t.type || 'scatter', name: t.name || '',
                                   x: t.type === 'heatmap' ? [] : Array.from(t.x || []),
                                   y: t.type === 'heatmap' ? [] : Array.from(t.y || [])})),
        annotations: svgText('.annotation-text'),
        yticks: svgText('.yaxislayer-above .ytick text, .yaxislayer-above text'),
        xticks: svgText('.xaxislayer-above .xtick text, .xaxislayer-above text'),
    };
}"""


def _plot(page, elem_id: str) -> dict | None:
    """What the Plotly chart in ``#elem_id`` holds: title, traces (type, name), SVG annotation and tick texts."""
    return page.evaluate(PLOT_JS, elem_id)


def _wait_plot(page, elem_id: str, predicate: str, timeout: int = 30_000) -> dict:
    """Wait until ``predicate`` (a JS expression over ``p``, the PLOT_JS object) holds; return the plot."""
    page.wait_for_function(f"(id) => {{ const p = ({PLOT_JS})(id); return !!p && ({predicate}); }}",
                           arg=elem_id, timeout=timeout)
    return _plot(page, elem_id)


def _heatmaps(plot: dict) -> int:
    return sum(t["type"] == "heatmap" for t in plot["traces"])


def _step(page, iteration: int, narration: str) -> None:
    """Press Step; wait for grid iteration ``iteration`` whose narration contains ``narration``."""
    page.locator("#step-btn").click()
    page.wait_for_function(
        """([k, text]) => {
            const wrap = document.querySelector('#token-grid .token-grid-wrap');
            const p = document.querySelector('#token-grid p.narration');
            return wrap && wrap.dataset.iteration === String(k) && p && p.textContent.includes(text);
        }""", arg=[iteration, narration], timeout=STEP_MS)


def _narration(page) -> str:
    return page.locator("#token-grid p.narration").inner_text()


def _stats(page) -> str:
    return page.locator("#step-stats").inner_text()


def _linear_first_call(page) -> None:
    """Linear-SS stepped by call: Step twice (the prefill, then iteration 2's drafting call only)."""
    _choose(page, "schedule", "Linear-SS")
    # "Step by" is an unqueued event (POST .../run/predict): let the server hold it before the first Step.
    with page.expect_response(lambda r: r.url.endswith("/run/predict") and '["call"]' in (r.request.post_data or ""),
                              timeout=10_000) as answer:
        _choose(page, "step-by", "call")
    assert answer.value.ok
    _step(page, 1, "Prefill")
    _step(page, 2, "Nothing is verified yet")


def test_linear_ss_steps_call_by_call(page):
    _linear_first_call(page)
    stats = _stats(page)
    assert "call 1 of 2" in stats and "after call 2" in stats, stats
    assert "Call 1 (drafting)" in _narration(page)
    plot = _wait_plot(page, "mask-plot", "p.title.startsWith('Iteration 2')")
    assert _heatmaps(plot) == 1, plot["traces"]
    assert any(a.startswith("call 1:") for a in plot["annotations"]), plot["annotations"]
    assert not any(a.startswith("call 2:") for a in plot["annotations"]), plot["annotations"]
    _shot(page, "linear-call-1")

    _step(page, 2, "call 2 (verification)")  # the same iteration, now with its verification call
    text = _narration(page)
    assert "Nothing is verified yet" not in text and "h = " in text and "A = " in text, text
    page.wait_for_function("() => !document.querySelector('#step-stats').innerText.includes('call 1 of 2')",
                           timeout=10_000)
    assert "after call 2" not in _stats(page)
    plot = _wait_plot(page, "mask-plot", "p.traces.filter(t => t.type === 'heatmap').length === 2")
    assert plot["title"].startswith("Iteration 2"), plot["title"]
    titles = [a for a in plot["annotations"] if re.match(r"call \d:", a)]
    assert [t[:7] for t in titles] == ["call 1:", "call 2:"], plot["annotations"]
    _shot(page, "linear-by-call")


def test_linear_first_call_claims_no_h_or_a(page):
    """After the drafting call only, nothing pretends the draft was verified (no h = 0 or mean A 0.00)."""
    _linear_first_call(page)
    assert "after call 2" in _stats(page)
    heading = page.locator("#token-grid .token-grid-head").inner_text()
    assert not re.search(r"\bh = \d|\bA = \d", heading), heading
    mean_a = page.locator('#step-stats [data-stat="mean_accept"] .v').inner_text()
    assert mean_a == "–", mean_a


def test_packed_narration_tells_h_and_a(page):
    _choose(page, "schedule", "Packed-SS")
    _step(page, 1, "Prefill")
    _step(page, 2, "One call verified the old draft")
    text = _narration(page)
    assert "h = " in text and "A = " in text, text
    assert re.search(r"accepted h = \d+ of the \d+ draft tokens and appended A = \d+", text), text
    _shot(page, "packed-narration")


def test_mask_plot_labels_rows_and_keys(page):
    _choose(page, "schedule", "Packed-SS")
    _step(page, 1, "Prefill")
    _step(page, 2, "One call verified the old draft")
    plot = _wait_plot(page, "mask-plot", "p.title.startsWith('Iteration 2') && p.yticks.length > 0")
    assert _heatmaps(plot) == 1, plot["traces"]
    assert any(t.startswith("verify · ") for t in plot["yticks"]), plot["yticks"]
    assert any(t.startswith("draft · ") for t in plot["yticks"]), plot["yticks"]
    assert any("verify keys" in t for t in plot["xticks"]), plot["xticks"]
    assert any("draft keys" in t for t in plot["xticks"]), plot["xticks"]
    assert any(t.startswith("cache ×") for t in plot["xticks"]), plot["xticks"]
    page.locator("#mask-plot").scroll_into_view_if_needed()
    _shot(page, "mask-labels")


def _race(page) -> None:
    """Open the Race tab, press Race, wait for the verdict, the AR lane and the final summary."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Race").click()
    page.locator("#race-btn").click()
    expect(page.locator("#race-badge")).to_contain_text("Ranking by tokens per second of decoder time", timeout=RACE_MS)
    expect(page.locator('#race-lanes [data-lane="ar"]')).to_be_attached(timeout=RACE_MS)
    expect(page.locator("#race-summary table.race-summary")).to_be_visible(timeout=RACE_MS)


def test_race_verdict_summary_and_theorem_chart(page):
    _race(page)
    verdict = page.locator('#race-badge [data-badge="verdict"]').inner_text()
    heads = r"(Fastest: |No clear winner: |No winner can be judged: )"
    assert re.search(heads + r".+Ranking by tokens per second of decoder time", verdict, re.S), verdict
    for lane in ("ar", "linear", "quadratic", "packed", "lookup", "packed-mixed"):
        assert page.locator(f'#race-lanes [data-lane="{lane}"]').count() == 1, lane
    header = page.locator("#race-summary table.race-summary tr").first.inner_text()
    assert "speed ÷ AR" in header, header
    # header + AR, Linear, Quadratic, Packed and the two optional lanes on by default: the prompt-lookup peer
    # and Packed-SS + n-gram
    assert page.locator("#race-summary table.race-summary tr").count() == 7
    assert "Packed-SS + n-gram" in page.locator("#race-summary").inner_text()
    plot = _wait_plot(page, "race-theorem", "p.traces.length >= 2", timeout=30_000)
    assert "Theorem 3.2" in plot["title"], plot["title"]
    _shot(page, "race-verdict")


def _calls_for(path: dict, n: int) -> float:
    """Calls a Theorem 3.2 path (x: tokens so far, y: calls so far) needed for the first ``n`` tokens."""
    return min((y for x, y in zip(path["x"], path["y"]) if x >= n), default=float("inf"))


def test_scripted_drafter_race(page):
    _choose(page, "drafter", "scripted")
    quality = page.locator("#drafter-quality input[type=number]")
    quality.fill("1")
    quality.press("Tab")
    page.wait_for_function("() => document.querySelector('#drafter-quality input[type=range]').value === '1'",
                           timeout=10_000)
    _race(page)
    verdict = page.locator('#race-badge [data-badge="verdict"]').inner_text()
    assert "scripted drafter" in verdict.replace("\xa0", " "), verdict
    assert "q=1" in verdict, verdict
    plot = _wait_plot(page, "race-theorem", "p.traces.length >= 2", timeout=30_000)
    names = [t["name"] for t in plot["traces"]]
    assert any(n.startswith("Linear-SS") for n in names), names
    assert any(n.startswith("Packed-SS") for n in names), names
    # Theorem 3.2 (monotone drafter, greedy): Packed-SS never needs more calls than Linear-SS for the first n tokens.
    paths = {t["name"].split(" ")[0]: t for t in plot["traces"]}
    linear, packed = paths["Linear-SS"], paths["Packed-SS"]
    for n in range(1, int(max(packed["x"][-1], linear["x"][-1])) + 1):
        assert _calls_for(packed, n) <= _calls_for(linear, n), (n, packed, linear)
    _shot(page, "race-scripted")
