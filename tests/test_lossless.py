"""Greedy speculative decoding returns exactly the AR tokens (paper Theorem 3.3 at T = 0)."""

import pytest
import torch
from helpers import ScriptedModel, tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.schedules import LOSSLESS, SPECULATIVE

BLOCKS = (2, 3, 5, 8, 16)


@pytest.mark.parametrize("seed,vocab,scale", [(0, 12, 3.0), (2, 8, 4.0), (3, 40, 2.0)])
def test_greedy_equals_ar(seed, vocab, scale):
    model = tiny_llama(vocab_size=vocab, seed=seed, logit_scale=scale)
    gen = torch.Generator().manual_seed(seed)
    for trial in range(2):
        prompt = torch.randint(2, vocab, (int(torch.randint(1, 9, (1,), generator=gen)),), generator=gen).tolist()
        for limit, blocks in ((30, BLOCKS), (6, (3, 8))):
            ref = generate(model, prompt, DecodeConfig(max_new_tokens=limit), "ar")
            assert ref.tokens <= limit
            for block in blocks:
                config = DecodeConfig(block_size=block, max_new_tokens=limit)
                for name in LOSSLESS:
                    run = generate(model, prompt, config, name)
                    assert run.token_ids == ref.token_ids, (name, block, limit, prompt)
                    assert run.stop_reason == ref.stop_reason


def test_eos_inside_an_accepted_draft_ends_the_output():
    """A perfect drafter proposes past EOS; nothing after the EOS may be committed."""
    eos = 0
    target = [5, 6, 7, eos, 8, 9, 10, 11, 12, 13]
    model = ScriptedModel([3, 4], target, thresholds=[0] * 20)
    model.eos_token_id = eos
    for name in ("ar",) + LOSSLESS:
        for block in (3, 5, 8):
            run = generate(model, [3, 4], DecodeConfig(block_size=block, max_new_tokens=20), name)
            assert run.token_ids == (5, 6, 7, eos), (name, block)
            assert run.stop_reason == "eos"
    # the EOS really was accepted from the middle of a draft (not produced as a correction)
    run = generate(model, [3, 4], DecodeConfig(block_size=8, max_new_tokens=20), "linear")
    assert run.sources[3] == "accepted draft"


@pytest.mark.parametrize("name", LOSSLESS)
def test_limit_never_exceeded_with_full_acceptance(name):
    """Whole draft + bonus accepted on every iteration; the limit still cuts exactly."""
    target = list(range(2, 14)) * 4
    # One model for every run, as a server keeps one: Partial-branch SS probes its call cost once, not 57 times
    # (each probe is thousands of scripted rows).
    model = ScriptedModel([3], target, thresholds=[0] * 60)
    for limit in range(1, 20):
        for block in (2, 4, 8):
            run = generate(model, [3], DecodeConfig(block_size=block, max_new_tokens=limit), name)
            assert run.token_ids == tuple(target[:limit])
            assert run.stop_reason == "limit"


@pytest.mark.parametrize("name", SPECULATIVE)
def test_oracle_drafter_is_always_fully_accepted(name):
    """A drafter that always proposes the verifier's continuation must never be rejected."""
    target = [(7 * i) % 13 + 2 for i in range(60)]
    model = ScriptedModel([2, 3, 4], target, thresholds=[0] * 80)
    run = generate(model, [2, 3, 4], DecodeConfig(block_size=5, max_new_tokens=50), name)
    assert run.token_ids == tuple(target[:50])
    for record in run.records:
        assert record.h == len(record.old_draft), (record.index, record.old_draft, record.verifier_tokens)
        assert "correction" not in record.appended_sources


def test_stop_string_spanning_tokens_is_recognised_only_when_accepted():
    model = tiny_llama(vocab_size=12, seed=1, logit_scale=3)
    prompt = [3, 4, 5]
    ref = generate(model, prompt, DecodeConfig(max_new_tokens=30), "ar")
    text = model.decode(list(ref.token_ids))
    words = text.split()
    assert len(words) >= 4
    stop = " ".join(words[2:4])  # spans two tokens
    first = text.find(stop)
    for name in ("ar",) + LOSSLESS:
        for block in (2, 4, 8):
            run = generate(model, prompt, DecodeConfig(block_size=block, max_new_tokens=30, stop_strings=(stop,)),
                           name)
            assert run.stop_reason == "stop string"
            assert run.text.endswith(stop) and run.text.find(stop) == first
            assert run.token_ids == ref.token_ids[: len(run.token_ids)]


@pytest.mark.parametrize("name", ["ar", "linear", "quadratic", "packed", "diffusion", "packed-mixed"])
def test_same_seed_same_run(name):
    model = tiny_llama(vocab_size=16, seed=5, logit_scale=1.0)
    config = DecodeConfig(block_size=4, temperature=1.0, max_new_tokens=25, seed=123)
    a = generate(model, [3, 4, 5], config, name)
    b = generate(model, [3, 4, 5], config, name)
    c = generate(model, [3, 4, 5], DecodeConfig(block_size=4, temperature=1.0, max_new_tokens=25, seed=9), name)
    assert a.token_ids == b.token_ids
    assert a.tokens <= 25
    assert a.token_ids != c.token_ids or name == "diffusion"


@pytest.mark.parametrize("temperature", [1e-9, 1e-4])
def test_tiny_temperature_behaves_like_greedy(temperature):
    model = tiny_llama(vocab_size=16, seed=6, logit_scale=3.0)
    ref = generate(model, [3, 4], DecodeConfig(max_new_tokens=20), "ar")
    for name in LOSSLESS:
        run = generate(model, [3, 4], DecodeConfig(block_size=4, temperature=temperature, max_new_tokens=20), name)
        assert run.token_ids == ref.token_ids


def test_shipped_model_is_lossless(embedded_model):
    prompts = ['def add(a, b):\n    """Return the sum."""\n', "import os\n\n\ndef main():\n"]
    for text in prompts:
        prompt = embedded_model.encode(text)
        ref = generate(embedded_model, prompt, DecodeConfig(max_new_tokens=40), "ar")
        for block in (4, 8):
            for name in LOSSLESS:
                run = generate(embedded_model, prompt, DecodeConfig(block_size=block, max_new_tokens=40), name)
                assert run.token_ids == ref.token_ids, (name, block, text)


@pytest.mark.parametrize("pad", [True, False])
def test_packed_equals_ar_with_and_without_padded_draft_slots(pad):
    """Packed-SS pads a short draft to W slots on a GPU and not on a CPU; both are lossless."""
    model = tiny_llama(vocab_size=12, seed=0, logit_scale=3.0)
    model.pads_drafts = pad
    for prompt in ([3, 4], [5, 6, 7, 8]):
        for block in (3, 5, 8):
            config = DecodeConfig(block_size=block, max_new_tokens=24)
            run = generate(model, prompt, config, "packed")
            assert run.token_ids == generate(model, prompt, config, "ar").token_ids
            later = [c.layout.rows for r in run.records[1:] for c in r.calls]
            assert all(rows == 2 * block for rows in later) if pad else all(rows <= 2 * block for rows in later)
