"""Theorem 3.2: under a monotone drafter (Assumption 3.1), NFE_packed(L) <= NFE_linear(L) for every L."""

from helpers import ScriptedModel
from hypothesis import given, settings
from hypothesis import strategies as st

from packed_ss import DecodeConfig, decode


def nfe_to_reach(model, prompt, block, limit, name) -> list[int]:
    """NFE after which the output first holds at least L tokens, for L = 1..limit."""
    reach, nfe, done = [], 0, 0
    for record in decode(model, prompt, DecodeConfig(block_size=block, max_new_tokens=limit), name):
        nfe += len(record.calls)
        done += len(record.appended)
        while len(reach) < done:
            reach.append(nfe)
    return reach


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_packed_never_needs_more_forwards_than_linear(data):
    length = data.draw(st.integers(1, 30), label="L")
    block = data.draw(st.integers(2, 9), label="B")
    # Assumption 3.1: position k is drafted correctly once at least c*_k <= k output tokens are known.
    thresholds = [data.draw(st.integers(0, k + 1), label=f"c*_{k}") for k in range(length + 2 * block)]
    target = [2 + (5 * k) % 11 for k in range(length + 2 * block)]
    prompt = [3, 4]
    packed = nfe_to_reach(ScriptedModel(prompt, target, thresholds), prompt, block, length, "packed")
    linear = nfe_to_reach(ScriptedModel(prompt, target, thresholds), prompt, block, length, "linear")
    assert len(packed) == len(linear) == length
    assert all(p <= q for p, q in zip(packed, linear)), (packed, linear)


def test_the_bound_is_not_vacuous():
    """With a drafter that is right only with full context, Packed-SS strictly saves forwards."""
    length, block = 20, 4
    target = [2 + (5 * k) % 11 for k in range(40)]
    thresholds = list(range(40))  # position k needs all k earlier outputs: Linear drafts it, Packed not
    packed = nfe_to_reach(ScriptedModel([3], target, thresholds), [3], block, length, "packed")
    linear = nfe_to_reach(ScriptedModel([3], target, thresholds), [3], block, length, "linear")
    assert packed[-1] < linear[-1]
