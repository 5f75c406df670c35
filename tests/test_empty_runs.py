"""An empty or cut-off race is never shown as a success (issue 39, item 2): agreement only over the tokens both lanes
made, a lane that made nothing is not compared, a race whose every lane was cut off says nothing could be measured,
and cut-off lanes look different from finished ones."""

from __future__ import annotations

import itertools

from helpers import tiny_llama

from components.race_panel import badge_html, lanes_html, summary_html
from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, finish_run, generate
from serve.lanes import lane_from_run
from serve.limits import cut_off
from serve.race import RaceResult
from serve.settings import RequestValues
from tabs.race import race_note

PROMPT = [4, 5, 6]
STRINGS = lambda ids: [str(i) for i in ids]  # noqa: E731


def _model():
    return tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)


def _cut(model, config, schedule, iterations):
    """A run of ``schedule`` cut off at the time limit after ``iterations`` iterations (0: nothing made)."""
    records = list(itertools.islice(decode(model, PROMPT, config, schedule), iterations))
    return cut_off(finish_run(model, records, config, schedule, len(PROMPT)))


def _result(lanes, config):
    settings = RequestValues("", "x", "packed", config.block_size, 0.0, 0, 1.0, 0, config.max_new_tokens,
                             False, "", "model", 0.8, "ltr", False).settings()
    return RaceResult(settings=settings, lanes=tuple(lanes), greedy=True, compute_s=0.11, prompt_tokens=len(PROMPT))


def test_a_race_where_every_lane_made_nothing_claims_nothing():
    model, config = _model(), DecodeConfig(block_size=3, max_new_tokens=12)
    ar = _cut(model, config, "ar", 0)
    lanes = [lane_from_run(ar, "AR", None)] + [lane_from_run(_cut(model, config, s, 0), s.title(), ar.token_ids,
                                                             partial_reference=True)
                                              for s in ("linear", "quadratic", "packed")]
    assert all(lane.compared is None and not lane.identical for lane in lanes[1:])
    badge = badge_html(lanes, True)
    assert "✓" not in badge and "identical" not in badge and "agree" not in badge
    assert "Not compared with AR" in badge and "made no tokens before the time limit" in badge
    cards = lanes_html(lanes, float("inf"), STRINGS, True)
    assert "= AR output" not in cards and cards.count("lane-cut") == 4 and ">finished<" not in cards
    table = summary_html(lanes)
    assert "<td>yes" not in table and table.count("not compared") == 3
    note = race_note(_result(lanes, config), 20.0)
    assert note.startswith("Nothing could be measured: every lane was cut off at this server's 20 s time limit")
    assert "Measured" not in note and "made no token at all" in note
    json = _result(lanes, config).to_json()
    assert json["measured"] is False and json["lossless_identical_to_ar"] is None
    assert all(json["lanes"][s]["identical_to_ar"] is None for s in ("linear", "quadratic", "packed"))


def test_a_race_cut_everywhere_after_some_tokens_says_what_would_fit():
    model, config = _model(), DecodeConfig(block_size=3, max_new_tokens=12)
    ar = _cut(model, config, "ar", 3)
    lanes = [lane_from_run(ar, "AR", None)] + [lane_from_run(_cut(model, config, s, 2), s, ar.token_ids, True)
                                              for s in ("linear", "packed")]
    note = race_note(_result(lanes, config), 20.0)
    assert note.startswith("Nothing could be measured") and "new tokens would fit: lower the new-token limit to" in note


def test_agreement_with_a_cut_off_ar_is_claimed_over_its_tokens_only():
    """AR cut at a few tokens: Linear-SS and Quadratic-SS, whole runs that may differ from each other later, showed
    "= AR" as if their outputs were AR's."""
    model, config = _model(), DecodeConfig(block_size=3, max_new_tokens=12)
    ar = _cut(model, config, "ar", 4)
    assert len(ar.token_ids) == 4
    lanes = [lane_from_run(ar, "AR", None)] + [
        lane_from_run(generate(model, PROMPT, config, s), s, ar.token_ids, partial_reference=True)
        for s in ("linear", "quadratic")]
    for lane in lanes[1:]:
        assert lane.identical and lane.partial and lane.compared == 4
        assert lane.agreement() == "= AR over the first 4 tokens (a run was cut off)"
        assert not any(lane.differs)  # nothing beyond AR's tokens is marked as a difference
    cards = lanes_html(lanes, float("inf"), STRINGS, True)
    assert "= AR output" not in cards and cards.count("= AR over the first 4 tokens") == 2
    assert "agree with AR's over the tokens both made" in badge_html(lanes, True)
    assert summary_html(lanes).count("yes, over the first 4 tokens (AR cut off)") == 2
    assert 'class="badge ok"' not in cards + badge_html(lanes, True)  # no green over a cut-off run's tokens


def test_a_finished_race_still_claims_identity_over_every_token():
    model, config = _model(), DecodeConfig(block_size=3, max_new_tokens=12)
    ar = generate(model, PROMPT, config, "ar")
    lanes = [lane_from_run(ar, "AR", None), lane_from_run(generate(model, PROMPT, config, "packed"), "Packed-SS",
                                                          ar.token_ids)]
    assert lanes[1].agreement() == "= AR output" and lanes[1].compared == 12 and not lanes[1].partial
    assert "are identical to AR's (12 tokens)" in badge_html(lanes, True)
    assert race_note(_result(lanes, config), 20.0).startswith("Measured 2 lanes side by side")
    assert "lane-cut" not in lanes_html(lanes, float("inf"), STRINGS, True)


def test_any_order_badges_give_a_reason_only_for_a_difference():
    model, config = _model(), DecodeConfig(block_size=3, max_new_tokens=12)
    ar = generate(model, PROMPT, config, "ar")
    same = lane_from_run(generate(model, PROMPT, config, "packed"), "Packed-SS", ar.token_ids)
    empty = lane_from_run(_cut(model, config, "linear", 0), "Linear-SS", ar.token_ids)
    badge = badge_html([lane_from_run(ar, "AR", None), same, empty], True, order="confidence")
    assert "Packed-SS matches the left-to-right output over 12 tokens</span>" in badge
    assert "expected" not in badge and "Linear-SS made no tokens" in badge


def test_a_refused_race_marks_what_stays_on_screen_as_the_earlier_race():
    """A row-budget refusal left the previous race's cards, charts and table on screen as if they were this
    request's (issue 39, item 5)."""
    from types import SimpleNamespace

    from serve.server import Server
    from tabs.race import RaceHandlers

    model = _model()
    server = Server("tiny", device="cpu", preloaded={"tiny": model}, max_seconds=None)
    handlers, request = RaceHandlers(server), SimpleNamespace(session_hash="visitor")
    values = lambda tokens: RequestValues("tiny", "ab", "packed", 3, 0.0, 0, 1.0, 0, tokens, False, "",  # noqa: E731
                                          "model", 0.8, "ltr", False)
    first = handlers.on_race(values(8), [], "same", request)
    assert 'data-badge="earlier"' not in first[1] and server.session(request).race is not None
    server.max_rows = 10  # the next race's worst case is over the budget
    status, badge, lanes = handlers.on_race(values(8), [], "same", request)
    assert 'data-error="1"' in status and "model rows" in status
    assert 'data-badge="earlier"' in badge and "not this one" in badge and "B = 3, 8 new tokens" in badge
    assert server.session(request).race is None  # nothing of it is replayed or offered as this request's files
    fresh = SimpleNamespace(session_hash="first-visit")
    assert handlers.on_race(values(8), [], "same", fresh)[1] == ""  # no earlier race: nothing to mark
