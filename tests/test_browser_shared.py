"""Browser tests for what a busy machine shows (issue 39): lanes the time limit cut off look different from finished
ones and claim nothing, and a sampled Step says why the appended correction is not the verifier's token.

Debian's chromium through Playwright, as test_browser.py; skipped without it.
"""

from __future__ import annotations

import pytest

from test_browser import ARTIFACTS, CHROMIUM, app_url, open_app  # noqa: F401  (app_url: the app without a limit)
from test_browser_teach import browser  # noqa: F401  (the module's chromium)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")
PROMPT = "def fibonacci(n):\n"


@pytest.fixture(scope="module")
def cut_url():
    """The app on the embedded model with a time limit far too short for a race of 128 tokens: every lane is cut."""
    import app
    from helpers import serve
    from serve.models import DEFAULT_MODEL

    yield from serve(app.build_demo(DEFAULT_MODEL, max_seconds=0.4))


def test_cut_off_lanes_are_dashed_orange_and_claim_no_agreement(browser, cut_url):  # noqa: F811
    page = open_app(browser, cut_url, PROMPT, 128)
    try:
        page.get_by_role("tab", name="Race").click()
        page.locator("#race-btn").click()
        page.locator("#race-lanes .lane.lane-cut").first.wait_for(timeout=120_000)
        page.wait_for_timeout(1000)  # the replay of runs under half a second is over
        style = page.evaluate("""() => { const lane = document.querySelector('#race-lanes .lane.lane-cut');
            const done = lane.querySelector('.done.cut'); const s = getComputedStyle(lane);
            return [s.borderTopStyle, s.borderTopColor, getComputedStyle(done).color,
                    document.querySelectorAll('#race-lanes .lane.lane-cut').length,
                    document.querySelectorAll('#race-lanes .lane').length]; }""")
        border, border_color, text_color, cut, lanes = style
        assert border == "dashed" and border_color == "rgb(194, 65, 12)", style
        assert text_color == "rgb(154, 52, 18)", style  # not the green of "finished"
        assert cut == lanes, style  # 128 tokens in 0.4 s: no lane finishes
        status = page.locator("#race-status").inner_text()
        assert "Nothing could be measured" in status and "Measured" not in status, status
        badge = page.locator("#race-badge").inner_text()
        assert "identical to AR" not in badge and "= AR output" not in page.locator("#race-lanes").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "race-cut-off.png"), full_page=True)
    finally:
        page.context.close()


def test_a_sampled_step_explains_a_correction_that_is_not_the_verifiers_token(browser, app_url):  # noqa: F811
    page = open_app(browser, app_url, PROMPT, 64)
    try:
        box = page.locator("#temperature input[type=number]")
        box.fill("1")
        box.press("Tab")
        note = page.locator("#token-grid [data-note='residual']")
        for k in range(1, 25):
            page.locator("#step-btn").click()
            page.locator(f'#token-grid [data-iteration="{k}"]').wait_for(timeout=60_000)
            if note.count():
                break
        assert note.count() == 1, "24 sampled iterations without a correction other than the verifier's argmax"
        text = note.inner_text()
        assert "was appended" in text and "residual distribution" in text and "argmax" in text, text
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "step-residual.png"), full_page=True)
    finally:
        page.context.close()


def test_a_new_race_dims_and_labels_the_earlier_one_until_it_answers(browser, cut_url):  # noqa: F811
    """The earlier race's badge, lanes, charts and table stayed on screen as they were while a new race ran: read as
    the new one's (issue 39)."""
    page = open_app(browser, cut_url, PROMPT, 16)
    try:
        page.get_by_role("tab", name="Race").click()
        page.locator("#race-btn").click()
        page.locator("#race-summary table").wait_for(timeout=120_000)
        assert page.locator(".race-earlier").count() == 0
        # The marks are seen the moment they are set, whatever the machine's speed: a polled look could come after
        # the new race has answered and they are gone again. One snapshot of every output and of the lanes' label.
        page.evaluate("""() => { const lanes = document.getElementById('race-lanes');
            new MutationObserver((changes, observer) => { if (!lanes.classList.contains('race-earlier')) return;
                window.earlierSeen = {ids: [...document.querySelectorAll('.race-earlier')].map(e => e.id),
                                      label: getComputedStyle(lanes, '::before').content};
                observer.disconnect(); }).observe(lanes, {attributes: true, attributeFilter: ['class']}); }""")
        page.locator("#race-btn").click()
        seen = page.wait_for_function("() => window.earlierSeen", timeout=120_000).json_value()
        marked, label = seen["ids"], seen["label"]
        assert "Earlier race" in label, label
        assert {"race-lanes", "race-summary", "race-badge"} <= set(marked), marked
        page.wait_for_function("() => !document.querySelector('.race-earlier')", timeout=120_000)
    finally:
        page.context.close()


def test_the_earlier_races_table_never_stands_unmarked_beside_a_new_verdict(browser, cut_url):  # noqa: F811
    """The marks went when the new race answered, and the earlier race's table stayed, undimmed, beside the new
    verdict until the replay's first frame (issue 53). What the table holds the moment its mark
    goes is read by a MutationObserver, whatever the machine's speed."""
    page = open_app(browser, cut_url, PROMPT, 16)
    try:
        page.get_by_role("tab", name="Race").click()
        page.locator("#race-btn").click()
        page.locator("#race-summary table").wait_for(timeout=120_000)
        earlier = page.locator("#race-summary table.race-summary").inner_text()
        page.evaluate("""() => { const table = document.getElementById('race-summary');
            new MutationObserver((changes, observer) => {
                if (table.classList.contains('race-earlier')) { window.tableMarked = true; return; }
                if (!window.tableMarked) return;
                const shown = table.querySelector('table.race-summary');
                window.tableUnmarked = shown ? shown.innerText : ''; observer.disconnect();
            }).observe(table, {attributes: true, attributeFilter: ['class']}); }""")
        page.locator("#race-btn").click()
        page.wait_for_function("() => window.tableUnmarked !== undefined", timeout=120_000)
        shown = page.evaluate("window.tableUnmarked")
        assert shown != earlier, shown  # no table yet (it follows the replay), or the new race's own
    finally:
        page.context.close()
