"""Run metrics say what their labels say, and each iteration record says what it committed."""

import functools

import pytest
from helpers import tiny_any_order, tiny_llama
from hypothesis import given, settings
from hypothesis import strategies as st

from packed_ss import DecodeConfig, generate
from packed_ss.engine import scripted_drafter
from packed_ss.records import SOURCE_DRAFT
from packed_ss.schedules import REGISTRY


def test_mean_advance_excludes_the_prefill_and_is_one_for_ar():
    model = tiny_llama(vocab_size=16, seed=1, logit_scale=3.0, eos=False)
    ar = generate(model, [3, 4], DecodeConfig(max_new_tokens=6), "ar")
    assert ar.mean_acceptance_length == 1.0
    packed = generate(model, [3, 4], DecodeConfig(block_size=4, max_new_tokens=12), "packed")
    later = [r for r in packed.records[1:]]
    assert packed.mean_acceptance_length == sum(len(r.appended) for r in later) / len(later)


# --- A record says what was committed: A_t = the tokens appended, the rest named as the cut ------------------------
SCRIPTED_QUALITIES = (None, 0.6, 0.95, 1.0)  # None: the model's own drafter; else a scripted drafter's q


@functools.lru_cache(maxsize=None)
def _base(seed: int):
    return tiny_llama(vocab_size=8, seed=seed, logit_scale=3.0, eos=True)


def _model(seed: int, eos: int | None, quality: float | None, prompt: list[int], config: DecodeConfig):
    """A fresh adapter of a tiny Llama whose EOS is ``eos``; with ``quality``, behind a scripted drafter (a drafter
    that is right often, so that the stopping rule cuts accepted draft tokens as well as corrections)."""
    model = _base(seed).share()
    model.eos_token_id = eos
    return model if quality is None else scripted_drafter(model, prompt, config, quality, seed=seed)


def _ltr_case(data):
    """Schedule, prompt, config, model: every left-to-right schedule, B, limits, greedy and T > 0, stop strings
    and EOS."""
    schedule = data.draw(st.sampled_from(sorted(REGISTRY)), label="schedule")
    prompt = data.draw(st.lists(st.integers(2, 7), min_size=1, max_size=4), label="prompt")
    config = DecodeConfig(block_size=data.draw(st.integers(2, 6), label="B"),
                          max_new_tokens=data.draw(st.integers(1, 24), label="L"),
                          temperature=data.draw(st.sampled_from([0.0, 1.0]), label="T"),
                          stop_strings=tuple(data.draw(st.lists(st.sampled_from(["w1", "w3", "w2 w2", "w4 w5"]),
                                                                max_size=2), label="stop strings")),
                          seed=data.draw(st.integers(0, 3), label="seed"), branches=data.draw(st.integers(0, 2)))
    eos = data.draw(st.sampled_from([None, 0, 3, 5]), label="EOS id")
    quality = data.draw(st.sampled_from(SCRIPTED_QUALITIES), label="scripted q")
    return schedule, prompt, config, _model(data.draw(st.integers(0, 2), label="model seed"), eos, quality, prompt,
                                            config)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_advances_of_a_run_sum_to_its_tokens_and_a_cut_is_named(data):
    """sum(A_t) = tokens for every left-to-right schedule; A_t + cut = h + 1 (block diffusion: the block), a cut only
    in the last iteration and only where EOS, a stop string or the limit ended the run."""
    schedule, prompt, config, model = _ltr_case(data)
    run = generate(model, prompt, config, schedule)
    records = run.records
    assert sum(r.advance for r in records) == run.tokens == len(run.token_ids)
    assert all(r.advance == len(r.appended) for r in records)
    assert all(r.cut == 0 for r in records[:-1])
    last = records[-1]
    if last.cut:
        assert last.stop_reason in ("eos", "stop string", "limit"), last
    if run.stop_reason == "limit":
        assert run.tokens == config.max_new_tokens
    if run.stop_reason == "eos":
        assert run.token_ids[-1] == model.eos_token_id
    for r in records:
        if schedule == "diffusion":
            assert r.advance + r.cut in (0, len(r.old_draft)), r  # a block is committed whole, or cut
        else:
            assert r.advance + r.cut == r.h + 1, r  # C_t = h accepted draft tokens + the correction or bonus
            assert r.appended_sources.count(SOURCE_DRAFT) == min(r.h, r.advance)  # the cut takes the end of C_t
    verifying = [r for r in records if r.verifies]
    if verifying:
        assert run.mean_acceptance_length == pytest.approx(sum(r.advance for r in verifying) / len(verifying))


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_any_order_advances_less_the_dropped_positions_sum_to_the_tokens(data):
    """Any order (Appendix C): an iteration's A_t counts the positions it filled that its own end marker kept; an end
    marker may later drop earlier positions (``dropped_positions``), so the output holds sum(A_t) - sum(dropped).
    A_t + cut = min(h + 1, u) for a verifying schedule, one token for AR, the chosen slots for native diffusion."""
    from packed_ss.any_order import ORDER_REGISTRY

    schedule = data.draw(st.sampled_from(sorted(ORDER_REGISTRY)), label="schedule")
    prompt = data.draw(st.lists(st.integers(2, 7), min_size=1, max_size=4), label="prompt")
    config = DecodeConfig(block_size=data.draw(st.integers(2, 6), label="B"),
                          max_new_tokens=data.draw(st.integers(1, 24), label="L"),
                          order=data.draw(st.sampled_from(["ltr", "confidence"]), label="order"),
                          stop_strings=tuple(data.draw(st.lists(st.sampled_from(["w1", "w3", "w2 w2"]), max_size=2),
                                                       label="stop strings")))
    model = tiny_any_order(vocab_size=8, seed=data.draw(st.integers(0, 2), label="model seed"))
    model.eos_token_id = data.draw(st.sampled_from([None, 0, 3, 5]), label="EOS id")
    run = generate(model, prompt, config, schedule)
    assert sum(r.advance for r in run.records) - sum(len(r.dropped_positions) for r in run.records) == run.tokens
    filled: set[int] = set()
    for r in run.records:
        assert r.advance == len(r.appended) == len(r.appended_positions)
        assert set(r.dropped_positions) <= filled and not set(r.dropped_positions) & set(r.appended_positions)
        filled = (filled - set(r.dropped_positions)) | set(r.appended_positions)
        if schedule == "ar":
            assert r.advance + r.cut == 1
        elif schedule == "diffusion":
            assert r.advance + r.cut == len(r.kept)
        else:
            assert r.advance + r.cut == min(r.h + 1, len(r.order)), r
    assert len(filled) == run.tokens
