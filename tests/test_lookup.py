"""Prompt lookup, the peer without a drafter: n-gram drafts from the text so far, lossless (greedy equal to
AR and to transformers' own prompt-lookup decoding; exact at T > 0 in tests/test_sampling_exact.py)."""

import pytest
import torch
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.schedules.lookup import ngram_draft


def test_ngram_draft_takes_the_earliest_match_of_the_longest_suffix():
    assert ngram_draft([1, 2, 3, 4, 1, 2], width=3) == [3, 4, 1]  # "1 2" matched at 0
    assert ngram_draft([5, 2, 7, 9, 2, 7, 8, 2, 7], width=2) == [9, 2]  # earliest of two matches
    assert ngram_draft([1, 2, 3, 9, 3], width=4) == [9, 3]  # no 2-gram "9 3" before: the 1-gram "3"
    assert ngram_draft([1, 2, 3], width=4) == []  # nothing repeats
    assert ngram_draft([4], width=4) == []
    assert ngram_draft([7, 7, 7, 7], width=2) == [7, 7]


@pytest.mark.parametrize("seed,vocab", [(0, 6), (3, 12)])
def test_greedy_lookup_equals_ar(seed, vocab):
    model = tiny_llama(vocab_size=vocab, seed=seed, logit_scale=3.0)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(3):
        prompt = torch.randint(2, vocab, (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist()
        for block in (2, 4, 8):
            config = DecodeConfig(block_size=block, max_new_tokens=30)
            ar, run = generate(model, prompt, config, "ar"), generate(model, prompt, config, "lookup")
            assert run.token_ids == ar.token_ids and run.stop_reason == ar.stop_reason
            assert all(len(c.layout.token_ids) <= block for r in run.records[1:] for c in r.calls)


def test_lookup_saves_calls_when_the_text_repeats():
    model = tiny_llama(vocab_size=6, seed=0, logit_scale=3.0, eos=False)  # a tiny vocabulary repeats itself
    config = DecodeConfig(block_size=6, max_new_tokens=40)
    run = generate(model, [2, 3, 4, 2, 3, 4], config, "lookup")
    assert run.nfe < run.tokens and run.mean_acceptance_length > 1


def test_lookup_equals_transformers_prompt_lookup_on_the_shipped_model(embedded_model):
    model = embedded_model
    for text in ("def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n", "for i in range(10):\n    print(i)\n"):
        ids = model.encode(text)
        config = DecodeConfig(block_size=8, max_new_tokens=40)
        ours = generate(model, ids, config, "lookup")
        with torch.no_grad():
            theirs = model.model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=40,
                                          prompt_lookup_num_tokens=7, max_matching_ngram_size=2,
                                          eos_token_id=model.eos_token_id, pad_token_id=model.eos_token_id)
        expected = theirs[0, len(ids):].tolist()
        assert list(ours.token_ids) == expected[: len(ours.token_ids)] and len(expected) == ours.tokens
