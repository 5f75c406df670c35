"""Lanes measured in turns (packed_ss.turns) and the paired-slice statistics behind the race's verdict
(packed_ss.stats.paired_speed_ratio): the order of turns, the common stop, the slices, and intervals that recover a
known ratio and call a tie a tie."""

import itertools

import numpy as np
import pytest

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, generate
from packed_ss.stats import paired_speed_ratio
from packed_ss.turns import COMMON_STOP, MIN_SLICE_TOKENS, next_slice, slice_tokens, slices, stop_together, take_turns

from helpers import tiny_llama

PROMPT = [4, 5, 6]
SCHEDULES = ("ar", "linear", "quadratic", "packed")


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)


def logged(name, records, log):
    """``records`` with each iteration's lane name appended to ``log`` as it is computed."""
    for record in records:
        log.append(name)
        yield record


def stops_after(records, iterations: int, counter):
    """``records`` that stop without the run ending once ``counter`` (shared by every lane) reaches
    ``iterations``: a time limit from the clock, counted in iterations so that no test depends on speed."""
    for record in records:
        if next(counter) >= iterations:
            return
        yield record


def lanes_of(model, config, wrap=lambda name, records: records):
    return [(s, wrap(s, decode(model.share(), PROMPT, config, s))) for s in SCHEDULES]


def test_each_round_raises_a_common_target_and_rotates_the_order(model):
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    log = []
    turns = take_turns(lanes_of(model, config, lambda s, r: logged(s, r, log)), 4, config.max_new_tokens)
    assert turns.stopped_at is None and turns.targets == (4, 8, 12) and turns.slice_range == (4, 4)
    for run in turns.runs:  # every lane reached each round's target before the round ended
        made = list(itertools.accumulate(tokens for tokens, _ in slices(run)))
        assert len(made) == 3 and all(m >= t for m, t in zip(made, (4, 8, 12))), (run.name, made)
        assert run.ended and run.tokens == 12
    firsts = []  # the first lane to compute in each round
    seen = 0
    for run_ends in zip(*(run.round_ends for run in turns.runs)):
        firsts.append(log[seen])
        seen = sum(run_ends)
    assert firsts == ["ar", "linear", "quadratic"]  # rotated by one lane every round


def test_every_lane_stops_at_the_same_token_count_when_one_generator_runs_out(model):
    config = DecodeConfig(block_size=3, max_new_tokens=40)
    counter = itertools.count()
    raw = take_turns(lanes_of(model, config, lambda s, r: stops_after(r, 15, counter)), 4, config.max_new_tokens)
    turns = stop_together(raw)
    assert turns.stopped_at is not None and turns.stopped_at > 0
    assert turns.stopped_at == min(run.tokens for run in raw.runs if not run.ended)
    reference = generate(model, PROMPT, config, "ar").token_ids
    for run in turns.runs:
        tokens = [t for r in run.records for t in r.appended]
        assert len(tokens) == turns.stopped_at, run.name  # the same count for every lane
        assert tokens == list(reference[:turns.stopped_at]), run.name  # lossless: AR's tokens
        assert run.records[-1].stop_reason == COMMON_STOP and not run.ended
        assert sum(r.advance for r in run.records) == turns.stopped_at, run.name
        assert sum(t for t, _ in slices(run)) == turns.stopped_at  # the slices cover what is kept, no more


def test_a_lane_with_no_token_stops_every_lane_at_nothing(model):
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    counter = itertools.count()
    turns = stop_together(take_turns(lanes_of(model, config, lambda s, r: stops_after(r, 2, counter)), 4, 12))
    assert turns.stopped_at == 0 and all(run.records == () for run in turns.runs)


def test_a_lane_that_ended_before_the_common_count_keeps_its_whole_run(model):
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    short = DecodeConfig(block_size=3, max_new_tokens=3)
    counter = itertools.count()
    lanes = [("ar", decode(model.share(), PROMPT, short, "ar")),
             ("packed", stops_after(decode(model.share(), PROMPT, config, "packed"), 6, counter))]
    turns = stop_together(take_turns(lanes, 2, 12))
    ended, stopped = turns.runs
    assert ended.ended and ended.tokens == 3 and ended.records[-1].stop_reason == "limit"
    assert stopped.records[-1].stop_reason == COMMON_STOP and stopped.tokens == turns.stopped_at


def test_the_common_stop_cuts_an_iteration_as_the_stopping_rule_does():
    """A lane trimmed to the common count keeps A_t = the tokens it kept; the rest joins the record's cut."""
    from helpers import ScriptedModel

    from packed_ss.turns import cut_record

    prompt = [3, 4]
    model = ScriptedModel(prompt, list(range(5, 40)), thresholds=[0] * 40, vocab_size=64)  # every draft accepted
    record = list(decode(model, prompt, DecodeConfig(block_size=4, max_new_tokens=12), "packed"))[1]
    assert record.advance == record.h + 1 == 4 and record.cut == 0
    trimmed = cut_record(record, 1)
    assert trimmed.stop_reason == COMMON_STOP and trimmed.appended == record.appended[:1]
    assert (trimmed.advance, trimmed.cut, trimmed.h) == (1, 3, record.h)


def test_lanes_must_be_given_and_named_apart(model):
    config = DecodeConfig(block_size=3, max_new_tokens=4)
    with pytest.raises(ValueError, match="distinct names"):
        take_turns([], 2, 4)
    twice = [("ar", decode(model.share(), PROMPT, config, "ar")) for _ in range(2)]
    with pytest.raises(ValueError, match="distinct names"):
        take_turns(twice, 2, 4)


def test_without_a_limit_a_slice_is_a_sixteenth_of_the_tokens():
    assert slice_tokens(128) == 8
    assert slice_tokens(24) == 2  # never below two tokens
    with pytest.raises(ValueError, match="at least 1"):
        slice_tokens(0)


def test_with_a_limit_each_round_is_planned_from_the_speed_so_far():
    assert next_slice(reached=10, spent_s=1.0, left_s=10.0, max_new_tokens=1000, rounds_left=10) == 8  # 80 / 10
    assert next_slice(reached=10, spent_s=1.0, left_s=10.0, max_new_tokens=50, rounds_left=10) == 4  # 40 to make
    assert next_slice(reached=10, spent_s=5.0, left_s=0.5, max_new_tokens=50, rounds_left=10) == MIN_SLICE_TOKENS
    assert next_slice(reached=40, spent_s=1.0, left_s=10.0, max_new_tokens=50, rounds_left=0) == 10  # past the aim


def test_a_machine_slower_than_predicted_still_gives_many_rounds(model):
    """A clock that advances 1 s per iteration and a 60 s limit: the first round is the smallest slice, the
    later ones shrink or grow with the time left, and the lanes stop together well after a few rounds."""
    config = DecodeConfig(block_size=3, max_new_tokens=200)
    now = [0.0]

    def ticking(records):
        for record in records:
            now[0] += 1.0
            yield record

    def limited(records):
        for record in ticking(records):
            if now[0] > 60:
                return
            yield record

    lanes = [(s, limited(decode(model.share(), PROMPT, config, s))) for s in ("ar", "packed")]
    turns = stop_together(take_turns(lanes, 50, 200, time_left=lambda: 60 - now[0], clock=lambda: now[0]))
    assert turns.targets[0] == MIN_SLICE_TOKENS  # not the 50 a wrong prediction would have asked for
    assert turns.rounds >= 8 and turns.stopped_at is not None and turns.stopped_at > 0


def scripted(ms_per_token: float, rounds: int, jitter: float, seed: int, tokens: int = 8):
    """Per-round (tokens, ms) of a lane at ``ms_per_token`` whose rounds scatter by ``jitter`` (relative) and share
    the machine's drift with the other lanes (a slow round is slow for everyone: the reason lanes take turns)."""
    rng = np.random.default_rng(seed)
    drift = 1 + 0.5 * np.sin(np.arange(rounds))  # the machine's load, the same for every lane in a round
    noise = 1 + jitter * rng.standard_normal(rounds)
    return [(tokens, float(tokens * ms_per_token * d * n)) for d, n in zip(drift, noise)]


def test_a_known_ratio_is_recovered_inside_its_interval():
    fast, slow = scripted(2.0, 14, 0.05, seed=1), scripted(4.0, 14, 0.05, seed=2)
    ratio = paired_speed_ratio(fast, slow)
    assert ratio.n == 14 and ratio.low <= 2.0 <= ratio.high and ratio.low > 1
    assert ratio.estimate == pytest.approx(2.0, rel=0.05)
    inverse = paired_speed_ratio(slow, fast)
    assert inverse.high < 1 and inverse.estimate == pytest.approx(1 / ratio.estimate)


def test_a_tie_is_called_a_tie():
    a, b = scripted(3.0, 14, 0.08, seed=3), scripted(3.0, 14, 0.08, seed=4)
    ratio = paired_speed_ratio(a, b)
    assert ratio.low < 1 < ratio.high


def test_pairing_removes_the_machines_drift_that_unpaired_timing_would_keep():
    """The drift between rounds is large (0.5x to 1.5x) but shared: the paired interval stays narrow."""
    fast, slow = scripted(2.0, 14, 0.02, seed=5), scripted(2.2, 14, 0.02, seed=6)
    ratio = paired_speed_ratio(fast, slow)
    assert ratio.low > 1.0 and ratio.high - ratio.low < 0.1


def test_a_round_a_lane_sat_out_is_joined_to_the_next_so_every_rounds_work_counts():
    """A page showed "16 rounds" beside "15 paired slices" and a ratio unlike the lanes' tokens per second: the
    round one lane sat out was dropped with the other lane's work in it (issue 53)."""
    a = [(4, 10.0), (0, 0.0), (4, 10.0)]
    b = [(4, 20.0), (4, 20.0), (0, 0.0)]
    ratio = paired_speed_ratio(a, b)
    assert ratio.n == 2 and ratio.estimate == pytest.approx((8 / 20) / (8 / 40))  # the lanes' whole speeds
    assert paired_speed_ratio([(0, 0.0)], [(4, 1.0)]) is None
    ended = paired_speed_ratio([(4, 10.0), (4, 10.0), (0, 0.0)], [(4, 10.0), (4, 10.0), (4, 10.0)])
    assert ended.n == 2 and ended.estimate == pytest.approx((8 / 20) / (12 / 30))  # the tail joins the last block
