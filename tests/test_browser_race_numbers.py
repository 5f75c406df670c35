"""Every number of a race agrees with the others on the page (issue 53): each lane's card and its row in the race
table give the same tokens, wall time and tokens per second (tokens over wall time), the verdict's ranking gives
the table's speeds, and the status says how every lane stopped. Read from the page for a whole race and for one the
time limit stopped (every lane at the same token count), at desktop width and at 390 px, where the table is drawn
as cards without sideways scrolling.

Debian's chromium through Playwright (skipped without it, as test_browser.py).
"""

import re

import pytest

from test_browser import ARTIFACTS, CHROMIUM, open_app
from test_browser_teach import browser  # noqa: F401  (browser: the module's chromium fixture)

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed at /usr/bin/chromium "
                                                              "(apt-get install chromium)")

RACE_MS = 180_000
READ = """() => {
    const cards = {}, rows = {};
    for (const lane of document.querySelectorAll('#race-lanes .lane')) {
        const get = (k) => lane.querySelector(`[data-counter="${k}"]`).textContent.trim();
        cards[lane.querySelector('h4').childNodes[1].textContent.trim()] =
            {tokens: get('tokens'), wall_s: get('wall_s'), throughput: get('throughput'), done: lane.dataset.done};
    }
    for (const tr of [...document.querySelectorAll('#race-summary table.race-summary tr')].slice(1)) {
        const cell = (k) => tr.querySelector(`td[data-col="${k}"]`).textContent.trim();
        rows[cell('schedule')] = {tokens: cell('tokens'), wall_s: cell('wall-s'), throughput: cell('throughput')};
    }
    const projection = document.querySelector('#race-badge [data-badge="projection"]');
    return {cards, rows, verdict: document.querySelector('#race-badge [data-badge="verdict"]').innerText,
            projection: projection ? projection.innerText : "",
            status: document.querySelector('#race-status').innerText,
            scroll: document.documentElement.scrollWidth, width: window.innerWidth};
}"""


@pytest.fixture(scope="module")
def urls():
    """The app twice: the embedded model without a clock limit (races run whole), and a tiny model whose every call
    sleeps 50 ms with a 3 s limit (a race of 400 tokens stops early on any machine, however fast)."""
    import app
    from helpers import serve, tiny_llama
    from serve.models import DEFAULT_MODEL
    from test_time_limit import SleepyModel

    from packed_ss.cost import CallCost

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)  # a fit already made: none in the race's time
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    whole = serve(app.build_demo(DEFAULT_MODEL, max_seconds=None))
    limited = serve(app.build_demo("sleepy", preloaded={"sleepy": sleepy}, max_seconds=3.0))
    yield {"whole": next(whole), "limited": next(limited)}
    for server in (whole, limited):
        next(server, None)


def _race(page) -> dict:
    page.get_by_role("tab", name="Race").click()
    page.locator("#race-btn").click()
    page.wait_for_function("document.querySelector('#race-summary td') !== null", timeout=RACE_MS)
    return page.evaluate(READ)


def _agree(found: dict) -> None:
    cards, rows = found["cards"], found["rows"]
    assert cards and set(cards) == set(rows), (cards, rows)
    for title, card in cards.items():
        row = rows[title]
        assert card["done"] == "1", title
        assert (card["tokens"], card["wall_s"], card["throughput"]) == (row["tokens"], row["wall_s"],
                                                                        row["throughput"]), (title, card, row)
        tokens, wall, speed = int(row["tokens"]), float(row["wall_s"]), float(row["throughput"])
        assert speed == pytest.approx(tokens / wall, rel=0.01, abs=0.15), (title, row)  # 3-decimal wall time
        assert f"{title} {row['throughput']} tokens/s" in found["verdict"], (title, found["verdict"])


@pytest.mark.parametrize("server, width", [("whole", 1400), ("limited", 1400), ("whole", 390)])
def test_the_cards_the_table_and_the_verdict_give_the_same_numbers(browser, urls, server, width):  # noqa: F811
    if width < 600:  # a phone from the start (its settings sidebar starts closed): the default prompt and limit
        page = browser.new_page(viewport={"width": width, "height": 844})
        page.goto(urls[server], wait_until="domcontentloaded")
        page.locator("#step-btn").wait_for(timeout=60_000)
    else:
        page = open_app(browser, urls[server], "def fibonacci(n):\n", 48 if server == "whole" else 400)
    try:
        found = _race(page)
        _agree(found)
        # the GPU projection beside the verdict, labelled as one and naming where its call costs were measured
        assert found["projection"].startswith("Projection, not a measurement"), found["projection"]
        assert "NVIDIA H200 (2026-12-04" in found["projection"] and "Model time only" in found["projection"]
        tokens = {card["tokens"] for card in found["cards"].values()}
        assert len(tokens) == 1, found["cards"]  # greedy and lossless: every lane made the same tokens
        if server == "limited":  # the time limit stopped every lane at one count, and the status says which
            common = re.search(r"The time limit came at (\d+) of 400 tokens: every lane stopped there",
                               found["status"])
            assert common and tokens == {common.group(1)}, found["status"]
        if width < 600:
            assert found["scroll"] <= found["width"], found  # no sideways scrolling: the table is cards
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"race-numbers-{server}-{width}.png"), full_page=True)
    finally:
        page.context.close()
