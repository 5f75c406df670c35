"""Packed-SS with two draft sources (drafter and n-gram): the per-position rule, the acceptance counts,
the rows of its calls, losslessness (greedy here; exact sampling in tests/test_sampling_exact.py), and the
transformers reference rows of the benchmark."""

import random

import pytest
import torch
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.bench.plan import BenchConfig, BenchError, Prompt
from packed_ss.bench.run import run_benchmark
from packed_ss.draft_sources import SOURCE_DRAFTER as D, SOURCE_NGRAM as G, NgramRates, mix_sources
from packed_ss.hf_reference import hf_generate
from packed_ss.schedules.lookup import ngram_match


def test_the_more_likely_source_wins_per_position():
    # the n-gram's rate 0.6 beats confidences below it, loses to those above; ties go to the n-gram
    assert mix_sources([1, 2, 3], [0.9, 0.5, 0.6], [1, 7, 8], 0.6) == [D, G, G]
    assert mix_sources([1, 2], [0.1, 0.1], [5, 6, 7, 8], 0.3) == [G, G, G, G]  # the match reaches past W - A
    assert mix_sources([1, 2], [0.9, 0.9], [], 0.0) == [D, D]  # no match
    assert mix_sources([], [], [4, 5], 0.2) == [G, G]  # no drafter rows (a call without its diffusion half)


def test_an_ngram_token_only_continues_its_own_text():
    # the drafter's 1 replaces the n-gram's 9 at position 0: the n-gram's later tokens no longer apply
    assert mix_sources([1, 2, 3], [0.9, 0.1, 0.1], [9, 5, 6, 7], 0.5) == [D, D, D]
    # ... unless the drafter's token equals the n-gram's own
    assert mix_sources([9, 2, 3], [0.9, 0.1, 0.1], [9, 5, 6, 7], 0.5) == [D, G, G, G]
    with pytest.raises(ValueError):
        mix_sources([1, 2], [0.5], [], 0.0)


def test_ngram_rates_count_only_the_tested_ngram_tokens():
    rates = NgramRates.empty(2)
    assert rates.rate(2) == 0.5  # prior
    after = rates.updated([G, G, D, G], n=2, h=1)  # token 0 accepted, token 1 rejected, 2-3 never tested
    assert (after.accepted[2], after.tested[2]) == (1, 2) and after.rate(2) == pytest.approx(2 / 4)
    full = after.updated([G, G], n=1, h=2)  # both accepted (the bonus follows)
    assert (full.accepted[1], full.tested[1]) == (2, 2) and full.tested[2] == 2
    assert rates.updated([D, D], n=2, h=0) is rates  # no n-gram token tested


def test_ngram_match_equals_a_plain_scan():
    def plain(sequence, width, longest):
        for n in range(min(longest, len(sequence) - 1), 0, -1):
            for start in range(len(sequence) - n):
                if sequence[start:start + n] == sequence[-n:] and sequence[start + n:start + n + width]:
                    return sequence[start + n:start + n + width], n
        return [], 0

    rng = random.Random(0)
    for _ in range(3000):
        sequence = [rng.randrange(4) for _ in range(rng.randint(1, 14))]
        width, longest = rng.randint(1, 6), rng.randint(1, 3)
        assert ngram_match(sequence, width, longest) == plain(sequence, width, longest), (sequence, width, longest)


@pytest.mark.parametrize("seed,vocab", [(0, 6), (2, 9), (3, 30)])
def test_greedy_two_source_drafts_equal_ar_and_use_both_sources(seed, vocab):
    model = tiny_llama(vocab_size=vocab, seed=seed, logit_scale=3.0)
    gen = torch.Generator().manual_seed(seed)
    seen = set()
    for _ in range(3):
        prompt = torch.randint(2, vocab, (int(torch.randint(2, 10, (1,), generator=gen)),), generator=gen).tolist()
        for block in (2, 4, 8):
            for width in (1, 3, 8):
                config = DecodeConfig(block_size=block, max_new_tokens=30, drafter_width=width)
                run = generate(model, prompt, config, "packed-mixed")
                assert run.token_ids == generate(model, prompt, config, "ar").token_ids, (prompt, block, width)
                for r in run.records:
                    assert len(r.next_draft) == len(r.next_draft_sources) <= config.width
                    seen.update(r.next_draft_sources)
    if vocab <= 9:  # a small vocabulary repeats itself: both sources get chosen
        assert seen == {D, G}


def test_rows_of_each_call():
    """Regular call: 1 + |D| verify rows (no padding on a CPU; W slots when padded) + 1 + min(w, W) drafter
    rows; a call after an all-n-gram draft with a good record leaves the drafter rows out (1 + |D|)."""
    model = tiny_llama(vocab_size=6, seed=0, logit_scale=3.0, eos=False)
    for pad in (False, True):
        model.pads_drafts = pad
        for block, width in ((6, 3), (4, 8)):
            config = DecodeConfig(block_size=block, max_new_tokens=40, drafter_width=width)
            run = generate(model, [2, 3, 4, 2, 3, 4], config, "packed-mixed")
            masks = min(width, block - 1)
            assert run.records[0].calls[0].layout.rows == 6 + masks + 1  # prompt + W + 1 masks
            lean = 0
            for before, record in zip(run.records, run.records[1:]):
                (call,) = record.calls
                d = len(record.old_draft)
                if call.layout.name == "packed-verify":
                    lean += 1
                    assert call.layout.rows == 1 + d and set(before.next_draft_sources) == {G}
                else:
                    assert call.layout.rows == (block if pad else 1 + d) + 1 + masks
            assert lean > 0  # the repeating text gives all-n-gram drafts that keep being accepted


def test_sampled_runs_draw_from_both_sources():
    model = tiny_llama(vocab_size=5, seed=11, logit_scale=2.0, eos=False)  # the exact-sampling test's model
    sources = set()
    for seed in range(20):
        run = generate(model, [2, 3], DecodeConfig(block_size=3, temperature=1.0, max_new_tokens=12, seed=seed),
                       "packed-mixed")
        sources.update(s for r in run.records for s in r.next_draft_sources)
    assert sources == {D, G}


def test_transformers_references_equal_ar_on_the_shipped_model(embedded_model):
    ids = embedded_model.encode("def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n")
    ar = generate(embedded_model, ids, DecodeConfig(max_new_tokens=32), "ar")
    for kind in ("hf-greedy", "hf-lookup"):
        run = hf_generate(embedded_model, ids, 32, kind, block_size=8)
        assert run.token_ids == ar.token_ids and run.wall_s > 0
        assert run.nfe == 32 if kind == "hf-greedy" else 1 <= run.nfe < 32


def test_references_are_refused_where_they_cannot_run(embedded_model):
    with pytest.raises(BenchError, match="greedy only"):
        BenchConfig(schedules=("ar", "hf-lookup"), temperature=1.0)
    scripted = tiny_llama(vocab_size=8, seed=0)
    scripted.model = None  # not a transformers network
    with pytest.raises(BenchError, match="transformers model"):
        run_benchmark(scripted, [Prompt("a", "w1 w2")], BenchConfig(schedules=("ar", "hf-greedy"), warmup=False))


def test_benchmark_flags_reach_the_runs():
    from packed_ss.bench.cli import _parser
    from packed_ss.bench.plan import config_from_args

    config = config_from_args(_parser().parse_args(["--schedules", "packed-mixed,partial,hf-lookup",
                                                    "--drafter-width", "2", "--branches", "1"]))
    run = config.decode_config("partial", 6, 0)
    assert (run.drafter_width, run.branches) == (2, 1)
    with pytest.raises(BenchError, match="drafter width"):
        config_from_args(_parser().parse_args(["--drafter-width", "0"]))
    with pytest.raises(BenchError, match="unknown schedule"):
        config_from_args(_parser().parse_args(["--schedules", "hf-nothing"]))


def test_the_benchmark_and_the_harness_take_the_diffusion_lanes_confidence_threshold():
    """SetDLM's own default threshold, 1.0, is reachable from the benchmark's command line (issue 36, item 5)."""
    from packed_ss.bench.cli import _parser
    from packed_ss.bench.plan import BenchError, config_from_args

    config = config_from_args(_parser().parse_args(["--schedules", "ar,diffusion", "--confidence-threshold", "1.0"]))
    assert config.decode_config("diffusion", 8, 0).confidence_threshold == 1.0
    assert config_from_args(_parser().parse_args([])).confidence_threshold == 0.9
    for bad in ("0", "1.5", "nan"):
        with pytest.raises(BenchError, match="confidence threshold must be in"):
            config_from_args(_parser().parse_args(["--confidence-threshold", bad]))
