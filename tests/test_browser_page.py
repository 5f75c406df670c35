"""Browser tests of what the page says and how it is laid out: the model note, the race verdict's reason,
block diffusion's labels, readable mask labels at 32 rows, the n-gram replacement style, the any-order
placeholder, the order choice only for an any-order model, the Benchmark tab's distinct colours and symbols and
a table that fits, and the Step button above the fold of a 1400 x 900 window.

Debian's chromium through Playwright (skipped without it, as test_browser.py). The app offers the embedded
model and the shipped any-order model. Where a test needs an iteration with a given property (a proposal
replaced by an n-gram token, a position left open), the engine finds it first, so the page is stepped to it.
"""

import re

import pytest

from test_browser import ARTIFACTS, BENCH_CHARTS, CHROMIUM, open_app, open_benchmark
from test_browser_teach import _choose, browser  # noqa: F401  (browser: the module's chromium fixture)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")

STEP_MS = 60_000  # ms: one Step (the first one loads the model)
RACE_MS = 120_000  # ms: a whole race at 24 new tokens
MIXED_PROMPT = "def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n"


@pytest.fixture(scope="module")
def both_url():
    """The app on the embedded model, with the any-order model offered too."""
    import app
    from helpers import serve
    from serve.models import ANY_ORDER_MODEL, DEFAULT_MODEL

    yield from serve(app.build_demo(DEFAULT_MODEL, allowed_models=[ANY_ORDER_MODEL],
                            max_seconds=None))  # no clock limit: a busy machine must not cut a race


@pytest.fixture
def page(browser, both_url):  # noqa: F811
    page = open_app(browser, both_url, "def fibonacci(n):\n", 24)
    page.set_viewport_size({"width": 1400, "height": 900})
    yield page
    page.context.close()


def _step(page, times: int = 1) -> None:
    for _ in range(times):
        before = page.locator("#token-grid [data-iteration]").first.get_attribute("data-iteration")
        page.locator("#step-btn").click()
        page.wait_for_function(
            "(b) => { const g = document.querySelector('#token-grid [data-iteration]');"
            " return g && g.getAttribute('data-iteration') !== b; }", arg=before, timeout=STEP_MS)


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"page-{name}.png"), full_page=True)


def _set_prompt(page, text: str) -> None:
    page.locator("#prompt textarea").fill(text)
    page.locator("#prompt textarea").press("Tab")


def _set_block(page, block: int) -> None:
    box = page.locator("input[aria-label^='number input for Block size']")
    box.fill(str(block))
    box.press("Enter")


def test_step_button_above_the_fold_and_the_model_note_beside_the_text(page):
    box = page.locator("#step-btn").bounding_box()
    assert box["y"] + box["height"] <= 900, f"the Step button ends at y = {box['y'] + box['height']:.0f} px"
    _step(page)
    grid = page.locator("#token-grid").bounding_box()
    assert grid["y"] < 900, "the grid starts below the fold"
    note = page.locator("#token-text .model-note").inner_text()
    assert "embedded demo model" in note and "not meant to make sense" in note and "--model" in note
    assert "5.5M parameters" in note
    _shot(page, "step-fold")


def test_race_verdict_says_why_and_gives_the_papers_comparisons(page):
    page.get_by_role("tab", name="Race").click()
    page.locator("#race-btn").click()
    badge = page.locator("#race-badge [data-badge='verdict']")
    badge.wait_for(timeout=RACE_MS)
    verdict = badge.inner_text()
    # the reason, or (where the machine's load made multi-row calls measure cheaper than one row) why there is none
    why = re.search(r"Why: .+ accepted \d+\.\d\d tokens per call.+cost \d+\.\d\dx AR's one-row calls on this "
                    r"machine", verdict)
    noise = re.search(r"Noise, not a reason: .+ measured \d+\.\d\dx AR's one-row calls", verdict)
    assert why or noise, verdict
    assert "The paper's comparisons, speed over speed: Packed-SS / Linear-SS" in verdict
    for baseline in ("Linear-SS", "Quadratic-SS", "Autoregressive"):
        assert re.search(rf"Packed-SS / {baseline} \d+\.\d\d \[\d+\.\d+, \d+\.\d+\]", verdict), (baseline, verdict)
    note = page.locator("#race-status .model-note").inner_text()
    assert "embedded demo model" in note
    page.wait_for_function("document.querySelector('#race-summary td[data-col=\"cost-ratio\"]') !== null",
                           timeout=RACE_MS)
    wrap = page.evaluate("""() => { const w = document.querySelector('#race-summary .race-summary-wrap');
        const panel = document.querySelector('#race-summary').getBoundingClientRect();
        return [w.getBoundingClientRect().right, panel.right, w.scrollWidth, w.clientWidth]; }""")
    assert wrap[0] <= wrap[1] + 1 and wrap[2] <= wrap[3] + 1, f"the race table does not fit its panel: {wrap}"
    legend = page.locator("#race-lanes [data-legend='sources']").inner_text()
    assert "Text colours" in legend and "autoregressive" in legend
    columns = int(page.locator("#race-lanes .race-lanes").first.get_attribute("data-columns"))
    lanes = page.locator("#race-lanes .lane").count()
    assert lanes % columns != 1 or lanes == 1, f"{lanes} lanes in {columns} columns leave one alone"
    _shot(page, "race-verdict")


def test_block_diffusion_is_shown_as_unmasking_and_committing(page):
    _choose(page, "schedule", "Block diffusion")
    _step(page, 2)
    grid = page.locator("#token-grid").inner_text()
    assert "h and A after the verification call" not in grid and "h = 0" not in grid
    assert re.search(r"\d+ masks? unmasked · block \d+ of \d+ filled", grid), grid[:300]
    assert page.locator("#token-grid .chip.unmasked").count() >= 1
    assert page.locator("#token-grid .chip.discarded").count() == 0
    stats = page.locator("#step-stats").inner_text()
    assert "masks unmasked" in stats.lower() and "block filled" in stats.lower()
    _shot(page, "diffusion")


def test_mask_plot_labels_do_not_overlap_at_32_rows(page):
    _set_block(page, 16)  # Packed-SS at B = 16: 32-row calls, every row labelled
    _step(page, 2)
    page.wait_for_function("document.querySelectorAll('#mask-plot .ytick text').length >= 32", timeout=STEP_MS)
    boxes = page.evaluate("""() => [...document.querySelectorAll('#mask-plot .ytick text')]
        .map(t => t.getBoundingClientRect()).filter(r => r.height > 0)
        .map(r => [r.top, r.bottom]).sort((a, b) => a[0] - b[0])""")
    assert len(boxes) >= 32
    overlaps = [(a, b) for a, b in zip(boxes, boxes[1:]) if b[0] < a[1] - 0.5]
    assert not overlaps, f"{len(overlaps)} overlapping row labels, e.g. {overlaps[:2]}"
    _shot(page, "mask-32-rows")


def _first_iteration(schedule: str, prompt: str, model_dir, predicate, **config) -> int:
    """The first iteration (1-based) of the engine's run of ``schedule`` for which ``predicate(record)``."""
    from packed_ss import DecodeConfig, decode
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(str(model_dir))
    for k, record in enumerate(decode(model, model.encode(prompt), DecodeConfig(**config), schedule), 1):
        if predicate(record):
            return k
    raise AssertionError("no such iteration")


def _replaced(record) -> bool:
    nxt = dict(zip(range(record.prefix_len_after, record.prefix_len_after + len(record.next_draft)),
                   record.next_draft_sources))
    filled = record.prefix_len_before + len(record.appended)
    return any(i not in record.kept and record.proposal_start + i >= filled and nxt.get(record.proposal_start + i)
               == "n-gram" for i in range(len(record.proposals)))


def test_a_proposal_the_ngram_replaced_has_its_own_style(page):
    from serve.models import DEFAULT_MODEL

    k = _first_iteration("packed-mixed", MIXED_PROMPT, DEFAULT_MODEL, _replaced, block_size=8, max_new_tokens=24)
    _set_prompt(page, MIXED_PROMPT)
    _choose(page, "schedule", "Packed-SS + n-gram")
    _step(page, k)
    replaced = page.locator("#token-grid .chip.replaced")
    assert replaced.count() >= 1
    assert "n-gram" in replaced.first.get_attribute("title")
    assert page.locator(".legend .chip.replaced").count() == 1  # its legend entry
    _shot(page, "ngram-replaced")


def test_any_order_open_positions_show_a_placeholder_and_the_order_choice_follows_the_model(page):
    from serve.models import ANY_ORDER_MODEL

    assert not page.locator("#order").is_visible()  # the embedded model verifies left to right only
    model = page.locator("#model-box input")
    model.click()
    page.get_by_role("option", name="assets/model-anyorder").click()
    page.locator("#order").wait_for(state="visible", timeout=60_000)
    _choose(page, "order", "by confidence")

    filled: set[int] = set()

    def has_hole(record) -> bool:
        filled.update(record.appended_positions)
        return any(j not in filled for j in range(min(filled), max(filled)))

    k = _first_iteration("packed", "def fibonacci(n):\n", ANY_ORDER_MODEL, has_hole, block_size=8, max_new_tokens=24,
                         order="confidence")
    _step(page, k)
    text = page.locator("#token-text").inner_text()
    assert "<|mask|>" not in text
    assert page.locator("#token-text .tok.open-slot").count() >= 1
    assert page.locator(".legend .tok.open-slot").count() == 1
    _shot(page, "any-order-open")


def test_benchmark_tab_colours_are_distinct_and_its_table_fits(page):
    open_benchmark(page)
    colours = page.evaluate("""() => {
        const plots = [...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd.layout &&
            gd.layout.title && String(gd.layout.title.text).startsWith('Paired ratios'));
        return plots.length ? plots[0].data.map(t => t.marker && [t.marker.color, t.marker.symbol]) : null; }""")
    assert colours, "no ratio chart"
    # Colour: the numerator's, symbol: the denominator's (a schedule keeps its colour in every chart), so each
    # comparison has its own pair of the two.
    pairs = [tuple(c) for c in colours]
    assert len(set(pairs)) == len(pairs), f"repeated colour and symbol: {pairs}"
    # Each panel's legend is drawn in full, below its axis labels (not over them, not cut off).
    panels = page.evaluate("() => " + BENCH_CHARTS + """.map(gd => {
            const box = (sel) => [...gd.querySelectorAll(sel)].map(e => e.getBoundingClientRect())
                .filter(r => r.height > 0);
            const ticks = box('.xtick text'), items = box('.legend .traces'), frame = gd.getBoundingClientRect();
            return {title: String(gd.layout.title.text), traces: gd.data.length, items: items.length,
                    ticksBottom: Math.max(...ticks.map(r => r.bottom)), legendTop: Math.min(...items.map(r => r.top)),
                    legendBottom: Math.max(...items.map(r => r.bottom)), frameBottom: frame.bottom};
        })""")
    assert len(panels) == 3, panels
    for panel in panels:
        assert panel["items"] == panel["traces"], panel
        assert panel["legendTop"] >= panel["ticksBottom"] - 1 and panel["legendBottom"] <= panel["frameBottom"] + 1, panel
    _shot(page, "benchmark")
    fits = page.evaluate("""() => [...document.querySelectorAll('.bench-summary table')].map(
        t => [t.scrollWidth, t.clientWidth, t.getBoundingClientRect().right])""")
    for scroll, client, right in fits:
        assert scroll <= client + 1 and right <= 1400, (scroll, client, right)
    page.get_by_text("Run a small benchmark").click()
    model_choice = page.locator("input[aria-label='model']").first.input_value(timeout=60_000)
    assert not model_choice.startswith("/"), model_choice
    _shot(page, "benchmark")


def test_bold_text_is_one_family_with_the_regular_text(page):
    """Bold text mixed DejaVu Sans Bold with a few letters of Gradio's Source Sans Pro SemiBold (a 5 kB subset):
    every weight on the page now comes from one family, the regular and the bold faces Gradio ships whole."""
    page.wait_for_timeout(1000)  # the web fonts are in
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    families = {}
    for selector in ("button#step-btn", "h1", "strong", "p", "label span"):
        for node in cdp.send("DOM.querySelectorAll", {"nodeId": root, "selector": selector})["nodeIds"][:3]:
            for font in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]:
                families.setdefault(font["familyName"], set()).add(selector)
    assert len(families) == 1, families  # e.g. {"Source Sans 3": ...}; DejaVu Sans beside it before
