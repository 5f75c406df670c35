"""Browser tests of refusals and verdicts (issue 30, items 2 and 3): one message per refusal, in the tab's own
result area, however often the button is clicked; the Benchmark tab's refusal in its status with its charts
left as they were; the race verdict gives every lane a speed ratio with an interval over paired slices.

Debian's chromium through Playwright (skipped without it, as test_browser.py).
"""

import pytest

from test_browser import ARTIFACTS, CHROMIUM, open_app
from test_browser_page import _set_block, _step
from test_browser_teach import _choose, browser  # noqa: F401  (browser: the module's chromium fixture)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")

PROMPT = "def fibonacci(n):\n"
RACE_MS = 120_000


def _one_race_rows() -> int:
    """A row budget that admits one measurement of the default race lanes at 24 new tokens, but not two."""
    from packed_ss.config import DecodeConfig
    from packed_ss.models import DualModeModel
    from serve.limits import worst_case_rows
    from serve.models import DEFAULT_MODEL

    model = DualModeModel.from_pretrained(DEFAULT_MODEL, device="cpu")
    lanes = ["ar", "linear", "quadratic", "packed", "lookup", "packed-mixed"]
    once = sum(rows for _, _, rows in worst_case_rows(lanes, len(model.encode(PROMPT)),
                                                      DecodeConfig(block_size=8, max_new_tokens=24)))
    return once + once // 2


@pytest.fixture(scope="module")
def app_url():
    """The app on the embedded model with a row budget for one measurement of a race."""
    import app
    from helpers import serve
    from serve.models import DEFAULT_MODEL

    yield from serve(app.build_demo(DEFAULT_MODEL, max_rows=_one_race_rows(),
                            max_seconds=None))  # no clock limit: a busy machine must not cut a race


@pytest.fixture
def page(browser, app_url):  # noqa: F811
    page = open_app(browser, app_url, PROMPT, 24)
    yield page
    page.context.close()


def _messages(page) -> dict:
    """Counts of what the page shows as messages: error lines per result area, and Gradio's pop-ups."""
    return page.evaluate("""() => ({
        step: document.querySelectorAll('#step-notice .pss-error').length,
        everywhere: document.querySelectorAll('.pss-error').length,
        toasts: document.querySelectorAll('.toast-body, [data-testid="toast-body"]').length,
        text: [...document.querySelectorAll('.pss-error')].map(e => e.innerText),
    })""")


def test_a_refused_step_shows_one_message_in_its_result_area_however_often_it_is_clicked(page):
    _choose(page, "schedule", "Quadratic-SS")
    _set_block(page, 32)
    page.locator("#limit input").fill("128")
    page.locator("#limit input").press("Tab")
    for clicks in (1, 2, 3):
        page.locator("#step-btn").click()
        page.wait_for_function("document.querySelectorAll('#step-notice .pss-error').length > 0", timeout=60_000)
        page.wait_for_timeout(700)  # any pop-up would have appeared by now
        shown = _messages(page)
        assert shown["step"] == 1 and shown["everywhere"] == 1 and shown["toasts"] == 0, (clicks, shown)
    line = shown["text"][0]
    assert "model rows" in line and "lower the block size, the new-token limit or the prompt length" in line, line
    assert "lanes" not in line  # the Step tab has none
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "refusal-step.png"), full_page=True)
    _set_block(page, 4)  # the session stays usable: a lighter setting steps
    _step(page)
    assert _messages(page)["everywhere"] == 0


def test_a_refused_benchmark_says_so_in_its_status_and_keeps_its_charts(page):
    page.get_by_role("tab", name="Benchmark").click()
    charts = "document.querySelectorAll('.tabitem:not([style*=\"display: none\"]) .js-plotly-plot').length"
    page.wait_for_function(f"{charts} > 0", timeout=60_000)
    before = page.evaluate(charts)
    page.get_by_text("Run a small benchmark").click()  # its accordion starts closed
    block = page.locator("#bench-block-size textarea, #bench-block-size input").first
    for _ in range(5):  # the page's own load events may still set the box's value: fill until it stays
        block.fill("bogus=8")
        block.press("Tab")
        page.wait_for_timeout(500)
        if block.input_value() == "bogus=8":
            break
    assert block.input_value() == "bogus=8"
    for _ in range(2):
        page.locator("#bench-run").click()
        page.wait_for_function("document.querySelectorAll('#bench-status .pss-error').length > 0", timeout=60_000)
        page.wait_for_timeout(700)
        shown = _messages(page)
        assert shown["everywhere"] == 1 and shown["toasts"] == 0, shown
    assert "bogus" in shown["text"][0]
    assert page.evaluate(charts) == before  # the report's charts stay
    assert page.locator("text=Error").count() == 0  # no panel reads "Error"
    page.screenshot(path=str(ARTIFACTS / "refusal-benchmark.png"), full_page=True)


def test_a_race_measured_in_turns_gives_every_lane_a_speed_ratio_with_an_interval(page):
    page.get_by_role("tab", name="Race").click()
    page.locator("#race-btn").click()
    badge = page.locator("#race-badge [data-badge='verdict']")
    badge.wait_for(timeout=RACE_MS)
    verdict = badge.inner_text()
    assert "(95% interval over" in verdict and "paired slices" in verdict, verdict
    assert "Ranking by tokens per second of decoder time: 1." in verdict and "6." in verdict, verdict
    status = page.locator("#race-status").inner_text()
    assert "Measured 6 lanes side by side in" in status, status
    page.screenshot(path=str(ARTIFACTS / "race-in-turns.png"), full_page=True)
