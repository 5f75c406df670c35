"""Partial-branch SS (Packed-SS's call plus k of Quadratic-SS's branches): the layout by hand, rows per call
against the formula, the branch choice, and losslessness (greedy here and in tests/test_lossless.py; exact
sampling in tests/test_sampling_exact.py)."""

import pytest
import torch
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.cost import CallCost, call_cost
from packed_ss.layout import partial_layout
from packed_ss.schedules.partial import choose_k, length_probabilities, likely_lengths

MASK = 1


def test_partial_mask_b3_by_hand():
    """B = 3, draft [8, 9], branches h = 0 and h = 2: 3 verify + 3 drafter + 2 x 3 branch rows."""
    layout = partial_layout(last=7, draft=[8, 9], width=2, cached=10, mask_id=MASK, branches=(0, 2))
    assert layout.token_ids == (7, 8, 9, 7, MASK, MASK) + (MASK,) * 6
    assert layout.position_ids == (10, 11, 12, 10, 11, 12, 11, 12, 13, 13, 14, 15)
    rows = [  # keys:  v0 v1 v2 | d0 d1 d2 | b0 b0 b0 | b2 b2 b2
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # drafter half: itself only (blind to the draft)
        [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],  # branch h = 0: leader = the last prefix token
        [1, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],  # branch h = 2: reads d(1), d(2)
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1],
    ]
    assert torch.equal(layout.mask, torch.tensor(rows, dtype=torch.bool))
    assert layout.verify_rows == (0, 1, 2) and layout.draft_rows == (4, 5)
    assert layout.branch_rows == ((6, 7, 8), (9, 10, 11)) and layout.proposal_rows == tuple(range(3, 12))
    with pytest.raises(ValueError):
        partial_layout(7, [8], 2, 10, MASK, branches=(2,))  # h = 2 needs a draft of 2 tokens


def test_length_probabilities_and_choice():
    probs = length_probabilities([0.9, 0.5])
    assert probs == pytest.approx([0.1, 0.45, 0.45]) and sum(probs) == pytest.approx(1)
    assert likely_lengths([0.9, 0.5], 1) == (1,)  # ties go to the shorter h
    assert likely_lengths([0.9, 0.5], 2) == (1, 2)
    free = CallCost(tau_ms=1.0, delta_ms=0.0)
    assert choose_k([0.9, 0.5], 3, 3, free, mean_a=1.0, gain=1.0) == 3  # rows cost nothing: every branch
    dear = CallCost(tau_ms=1.0, delta_ms=10.0)
    assert choose_k([0.9, 0.5], 3, 3, dear, mean_a=1.0, gain=1.0) == 0  # rows dominate: no branch
    assert choose_k([0.9, 0.5], 3, 3, free, mean_a=1.0, gain=0.0) == 0  # no gain: no branch


@pytest.mark.parametrize("pad", [True, False])
def test_rows_per_call_follow_the_formula(pad):
    model = tiny_llama(vocab_size=10, seed=1, logit_scale=3.0)
    model.pads_drafts = pad
    for block in (2, 4, 6):
        for k in (0, 1, 2, block):
            config = DecodeConfig(block_size=block, max_new_tokens=24, branches=k)
            run = generate(model, [3, 4, 5], config, "partial")
            assert run.token_ids == generate(model, [3, 4, 5], config, "ar").token_ids
            assert run.records[0].calls[0].layout.rows == 3 + block  # prefill + W + 1 masks
            for record in run.records[1:]:
                (call,) = record.calls
                d = len(record.old_draft)
                assert len(record.branches) == min(k, d + 1)
                assert call.layout.rows == (block if pad else 1 + d) + block + block * len(record.branches)


@pytest.mark.parametrize("seed,vocab", [(0, 12), (3, 40)])
def test_auto_k_is_lossless_and_uses_the_measured_cost(seed, vocab):
    model = tiny_llama(vocab_size=vocab, seed=seed, logit_scale=3.0)
    fit = call_cost(model)
    assert fit.tau_ms > 0 and fit.delta_ms >= 0 and call_cost(model.share()) is fit  # measured once per network
    for prompt in ([3, 4], [5, 6, 7, 8, 9]):
        for block in (3, 5, 8):
            config = DecodeConfig(block_size=block, max_new_tokens=30)
            run = generate(model, prompt, config, "partial")
            assert run.token_ids == generate(model, prompt, config, "ar").token_ids


@pytest.mark.parametrize("schedule", ["quadratic", "packed", "partial", "packed-mixed", "linear", "lookup"])
def test_grid_draws_every_padded_slot_a_call_holds(schedule):
    """The Step grid's old-draft row shows MASK chips exactly where a call's verify rows hold padded slots,
    whatever the schedule (Quadratic-SS and Partial-branch SS pad as Packed-SS does on a GPU)."""
    from components.token_grid import grid_html
    from packed_ss import decode

    model = tiny_llama(vocab_size=10, seed=1, logit_scale=3.0)
    model.pads_drafts = True
    records = list(decode(model, [3, 4, 5], DecodeConfig(block_size=5, max_new_tokens=24), schedule))
    sequence = [3, 4, 5] + [t for r in records for t in r.appended]
    for record in records[1:]:
        html = grid_html(record, sequence, model.token_strings, MASK)
        held = max(0, len(record.calls[0].layout.verify_rows) - 1)
        assert html.count("mask slot") == max(0, held - len(record.old_draft)), (schedule, record.index)
