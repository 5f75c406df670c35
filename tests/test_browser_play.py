"""Browser tests of Play/Pause (a gr.Timer steps the run on its own until paused or the run ends) and of
an iteration number typed into the slider's box.

Uses the same app fixture as test_browser.py (the embedded model, or a tiny one) and the same skip rule.
"""

import re

import pytest

from test_browser import ARGS, CHROMIUM, app_url, open_app  # noqa: F401  (app_url: the app fixture)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")


def _iteration(page) -> int:
    return int(page.locator("#token-grid .token-grid-wrap").first.get_attribute("data-iteration"))


def test_play_advances_and_pause_stops(app_url):  # noqa: F811
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = open_app(browser, app_url, "class Stack:\n    def __init__(self):\n", 96)
            page.locator("#step-btn").click()
            expect(page.locator('#token-grid [data-iteration="1"]')).to_be_visible(timeout=60_000)

            page.locator("#play-btn").click()
            expect(page.locator("#play-btn")).to_have_text(re.compile("Pause"), timeout=60_000)
            page.wait_for_function(
                "() => Number(document.querySelector('#token-grid .token-grid-wrap')?.dataset.iteration) >= 3",
                timeout=60_000)
            page.locator("#play-btn").click()
            expect(page.locator("#play-btn")).to_have_text(re.compile("Play"), timeout=60_000)
            page.wait_for_timeout(1500)  # a tick already queued may still land
            paused_at = _iteration(page)
            page.wait_for_timeout(2500)
            assert _iteration(page) == paused_at, "the run kept stepping after Pause"

            box = page.locator("#iteration input[type=number]")
            box.fill("1")
            box.press("Enter")  # no focus change: the view must follow the typed number anyway
            expect(page.locator('#token-grid [data-iteration="1"]')).to_be_visible(timeout=15_000)
        finally:
            browser.close()


def test_steps_pressed_during_a_step_each_run_and_are_said(app_url):  # noqa: F811
    """Five quick Step presses gave 2 iterations and no word about the others (Gradio drops a button's click while
    its event runs); now each press counts, the waiting ones are said, and all five iterations are computed."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = open_app(browser, app_url, "class Stack:\n    def __init__(self):\n", 96)
            page.evaluate("""() => { const button = document.getElementById('step-btn');
                window.stepLines = [];
                new MutationObserver(() => window.stepLines.push(document.getElementById('step-queue').textContent))
                    .observe(document.getElementById('step-queue'), {childList: true, characterData: true,
                                                                     subtree: true});
                for (let i = 0; i < 5; i++) button.click();  // one after another, before the first Step answers
            }""")
            page.wait_for_function(
                "() => Number(document.querySelector('#token-grid .token-grid-wrap')?.dataset.iteration) >= 5",
                timeout=120_000)
            page.wait_for_function("() => document.getElementById('step-queue').textContent === ''", timeout=60_000)
            page.wait_for_timeout(1500)  # a sixth Step, were one started, would land meanwhile
            assert _iteration(page) == 5
            lines = page.evaluate("() => window.stepLines")
            assert lines == [f"{n} more Steps pressed: they run one after another." for n in (4, 3, 2)] + [
                "1 more Step pressed: it runs when this one ends.", ""], lines  # said, then run one by one
        finally:
            browser.close()
