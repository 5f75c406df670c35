"""The KV cache after every iteration equals a no-cache forward over the verified prefix minus its last
token; the causal half of a packed call equals a causal forward, its diffusion half a standalone
drafting call (paper Appendix D.1)."""

import pytest
import torch
from helpers import tiny_llama

from packed_ss import DecodeConfig, decode
from packed_ss.layout import draft_layout, packed_layout, verify_layout


def reference_cache(model, ids):
    """Keys and values of a fresh causal forward over ``ids`` (no cache reuse)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.model.config)
    with torch.no_grad():
        model.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return cache


def _run_and_check(name, cache="static"):
    model = tiny_llama(vocab_size=10, seed=3, logit_scale=3.0, eos=False, cache=cache)
    prompt = [4, 5, 6]
    generated: list[int] = []
    iterations = 0
    for record in decode(model, prompt, DecodeConfig(block_size=4, max_new_tokens=25), name):
        generated += record.appended
        cached = model.cache_length
        iterations += 1
        if name == "diffusion":  # a completed block enters the cache through the next call
            assert cached <= record.prefix_len_after - 1
        else:
            assert cached == record.prefix_len_after - 1 == len(prompt + generated) - 1
        ref = reference_cache(model, (prompt + generated)[:cached])
        for (keys, values), ref_layer in zip(model.cached_kv(), ref.layers, strict=True):
            assert torch.allclose(keys, ref_layer.keys, atol=1e-10)
            assert torch.allclose(values, ref_layer.values, atol=1e-10)
    assert iterations > 3


@pytest.mark.parametrize("cache", ["static", "dynamic"])
@pytest.mark.parametrize("name", ["ar", "linear", "quadratic", "packed", "diffusion"])
def test_cached_keys_and_values_equal_a_fresh_forward(name, cache):
    _run_and_check(name, cache)


def test_packed_halves_equal_separate_calls():
    model = tiny_llama(vocab_size=16, seed=4, logit_scale=2.0)
    prefix, draft, width, mask = [3, 4, 5, 6, 7], [8, 9], 3, model.mask_token_id
    cached = len(prefix) - 1

    def fresh_call(layout, rows):
        model.reset()
        model.forward(verify_layout(prefix[:-1], [], 0), ())  # cache the prefix minus its last token
        model.rollback(cached)
        return model.forward(layout, rows).logits

    packed = packed_layout(prefix[-1], draft, width, cached, mask)
    both = fresh_call(packed, packed.verify_rows + packed.draft_rows)
    causal = verify_layout([prefix[-1]], draft + [mask], cached)
    drafting = draft_layout(prefix[-1], width, cached, mask)
    assert torch.allclose(both[:4], fresh_call(causal, causal.verify_rows), atol=1e-10)
    assert torch.allclose(both[4:], fresh_call(drafting, drafting.draft_rows), atol=1e-10)
    # and the causal half equals a plain no-cache causal forward over the whole sequence
    with torch.no_grad():
        plain = model.model(input_ids=torch.tensor([prefix + draft + [mask]])).logits[0, cached:]
    assert torch.allclose(both[:4], plain, atol=1e-10)


def test_deferred_rows_give_the_same_logits_and_count_their_head_time():
    """Quadratic-SS defers its branch rows: their logits, produced later by the LM head, equal the
    logits of the same call computed at once, and the head time joins the call's model time."""
    from packed_ss.layout import quadratic_layout, verify_layout
    from packed_ss.schedules.base import Session

    model = tiny_llama(vocab_size=12, seed=5, logit_scale=3.0, eos=False)
    assert model.supports_deferred_rows
    prompt, draft, width = [3, 4, 5, 6], [7, 8, 2], 3

    def prefilled():
        session = Session(model, prompt, DecodeConfig(block_size=4, max_new_tokens=8), "quadratic")
        session.call(verify_layout(prompt, [], 0, name="prefill"), (len(prompt) - 1,))
        session.rollback(len(prompt) - 1)
        return session

    session = prefilled()
    layout = quadratic_layout(prompt[-1], draft, width, session.cached, mask_id=1)
    branch_rows = tuple(r for branch in layout.branch_rows for r in branch)
    at_once = session.call(layout, layout.verify_rows + branch_rows)

    session = prefilled()
    verify = session.call(layout, layout.verify_rows, deferred=branch_rows)
    before, calls = session._calls[-1].model_ms, len(session._calls)
    branch2 = session.deferred_logits(8, 12)
    assert torch.allclose(verify.logits, at_once.logits[:4], atol=1e-10)
    assert torch.allclose(branch2.logits, at_once.logits[4 + 8: 4 + 12], atol=1e-10)
    assert verify.top == at_once.top[:4] and branch2.top == at_once.top[4 + 8: 4 + 12]
    assert session._calls[-1].model_ms > before
    assert len(session._calls) == calls  # the head adds no NFE
    with pytest.raises(ValueError):
        session.deferred_logits(12, 20)
