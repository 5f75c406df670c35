"""Any-order verification (paper Appendix C, D.2, E.2, E.6): ltr equals the model's own left-to-right
decoding, confidence order equals Proposition C.1's serial reference, Table 2's SetDLM row counts, a
u = 3 mask by hand, and multi-token end markers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import tiny_any_order

from packed_ss import DecodeConfig, decode, generate
from packed_ss.any_order.layout import PENDING, TOKENS, order_layout
from packed_ss.any_order.session import OrderSession, confidence_order, verify_in_order
from packed_ss.layout import BRANCH, DRAFT, VERIFY
from packed_ss.iteration import PromptError

SPECULATIVE = ("linear", "quadratic", "packed")
PROMPT = [5, 6, 7, 8]


def serial_reference(model, prompt: list[int], records, max_new_tokens: int) -> tuple[int, ...]:
    """Proposition C.1's serial reference, uncached: in iteration t it generates the A_t + cut tokens of C_t greedily
    at pi_t(1..A_t + cut), each from one fresh forward over [prompt | P_{t-1}'s accepted tokens in acceptance
    order | the group's earlier tokens | a mask at the position], token rows attending causally in that
    order and the mask to all of them. EOS moves E to its position and drops pairs past it."""
    n = len(prompt)
    end = n + max_new_tokens - 1
    context: list[tuple[int, int]] = []  # (position, token) in acceptance order
    never = list(getattr(model, "never_emit_ids", (model.mask_token_id,)))
    for record in records:
        group = []
        for position in record.order[: record.advance + record.cut]:
            pairs = context + group
            ids = prompt + [t for _, t in pairs] + [model.mask_token_id]
            pos = list(range(n)) + [j for j, _ in pairs] + [position]
            rows = len(ids)
            mask = torch.ones(rows, rows, dtype=torch.bool).tril()
            with torch.no_grad():
                logits = model.model(input_ids=torch.tensor([ids]), position_ids=torch.tensor([pos]),
                                     attention_mask=mask[None, None]).logits[0, -1].clone()
            logits[never] = -math.inf
            group.append((position, int(logits.argmax())))
        eos = [j for j, t in group if t == model.eos_token_id and j <= end]
        if eos:
            end = min(eos)
        context = [(j, t) for j, t in context + group if j <= end]
    filled = dict(context)
    assert sorted(filled) == list(range(n, end + 1)), "the serial reference left a hole"
    return tuple(filled[j] for j in range(n, end + 1))


def run(model, schedule, order="ltr", block=5, new=24, pad=True, **config):
    model.pads_drafts = pad
    return generate(model, PROMPT, DecodeConfig(block_size=block, max_new_tokens=new, order=order, **config), schedule)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("pad", [True, False])
def test_ltr_equals_the_models_own_left_to_right_decoding(seed, pad):
    model = tiny_any_order(seed=seed)
    reference = run(model, "ar")
    assert len(reference.token_ids) == 24 or reference.stop_reason == "eos"
    for name in SPECULATIVE:
        got = run(model, name, pad=pad)
        assert got.token_ids == reference.token_ids, name
        assert got.nfe < reference.nfe or name == "linear", name


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("name", SPECULATIVE)
def test_confidence_order_equals_the_serial_reference(seed, name):
    model = tiny_any_order(seed=seed)
    got = run(model, name, order="confidence", pad=seed % 2 == 0)
    assert got.token_ids == serial_reference(model, PROMPT, got.records, 24)


def test_confidence_order_really_reorders_and_changes_some_outputs():
    """The policy is not ltr in disguise: some calls check a later position first, and on these tiny
    models some outputs differ from left-to-right decoding (the paper's speed-accuracy trade-off)."""
    reordered, differing = 0, 0
    for seed in range(5):
        model = tiny_any_order(seed=seed)
        got = run(model, "packed", order="confidence")
        reordered += sum(r.order != tuple(sorted(r.order)) for r in got.records)
        differing += got.token_ids != run(model, "ar").token_ids
    assert reordered > 0 and differing > 0


def test_accepted_out_of_textual_order_positions_are_recorded():
    model = tiny_any_order(seed=1)
    got = run(model, "packed", order="confidence")
    jumps = [r for r in got.records if list(r.appended_positions) != sorted(r.appended_positions)
             or (r.appended_positions and r.appended_positions[0] != min(r.order))]
    assert jumps, "no iteration accepted a later position before an earlier one"
    for r in got.records:
        assert set(r.appended_positions) <= set(r.order)
        assert r.advance + r.cut == min(r.h + 1, len(r.order))  # C_t: min(h_t + 1, u_t) pairs, A_t of them kept


def _rows_by_region(layout):
    return {name: layout.regions.count(name) for name in (PENDING, TOKENS, VERIFY, DRAFT, BRANCH)}


@pytest.mark.parametrize("name", SPECULATIVE)
def test_rows_per_iteration_follow_table_2(name):
    """Padded calls: Linear-SS p + 3u (p + u drafting, 2u verifying), Quadratic-SS p + 2u + u^2,
    Packed-SS p + 3u, with u unresolved positions and p the pending correction (Table 2, SetDLM)."""
    model = tiny_any_order(seed=2)
    got = run(model, name, order="confidence", block=6)
    for record in got.records[1:]:  # the first call also prefills the prompt
        u = len(record.order)
        p = sum(c.layout.regions.count(PENDING) for c in record.calls)
        assert p in (0, 1)
        rows = sum(c.layout.rows for c in record.calls)
        expected = {"linear": p + 3 * u, "quadratic": p + 2 * u + u * u, "packed": p + 3 * u}[name]
        assert rows == expected, (record.index, u, p)
    assert any(len(r.order) == 5 for r in got.records)


def test_unpadded_calls_hold_only_the_rows_that_can_matter():
    model = tiny_any_order(seed=2)
    got = run(model, "packed", order="confidence", block=6, pad=False)
    for record in got.records[1:]:
        counts = _rows_by_region(record.calls[0].layout)
        kappa = len(record.old_draft)
        assert counts[TOKENS] == kappa and counts[VERIFY] == min(kappa + 1, len(record.order))
        assert counts[DRAFT] == len(record.order)


def test_u3_masks_by_hand():
    """One pending correction, order (12, 10, 11) with drafts at 12 and 10 (rank 3 has none), padded:
    rows N | O1 O2 O3 | M1 M2 M3 | R1 R2 R3. K_1 = {}, K_2 = {1}, K_3 = {1, 2}; O3 is a mask (padding)."""
    layout = order_layout("ao-packed", 9, [(9, 40)], (12, 10, 11), {12: 50, 10: 51}, 99,
                          checked=3, verified=3, drafted=True)
    #         N  O1 O2 O3 M1 M2 M3 R1 R2 R3
    expected = [
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # N
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # O1 (pos 12)
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],  # O2 (pos 10) sees O1
        [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],  # O3 (pos 11, padding mask) sees O1, O2
        [1, 0, 0, 0, 1, 0, 0, 0, 0, 0],  # M1 sees N only
        [1, 1, 0, 0, 0, 1, 0, 0, 0, 0],  # M2 sees O1
        [1, 1, 1, 0, 0, 0, 1, 0, 0, 0],  # M3 sees O1, O2
        [1, 0, 0, 0, 0, 0, 0, 1, 0, 0],  # R1 sees N and itself
        [1, 0, 0, 0, 0, 0, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    ]
    assert layout.mask.int().tolist() == expected
    assert layout.token_ids == (40, 50, 51, 99, 99, 99, 99, 99, 99, 99)
    assert layout.position_ids == (9, 12, 10, 11, 12, 10, 11, 12, 10, 11)
    assert layout.regions == (PENDING,) + (TOKENS,) * 3 + (VERIFY,) * 3 + (DRAFT,) * 3
    assert layout.verify_rows == (4, 5, 6) and layout.draft_rows == (7, 8, 9)
    assert layout.full_mask()[:, :9].all()  # every row sees the cache


def test_u3_quadratic_branches_by_hand():
    layout = order_layout("ao-quadratic", 4, [], (6, 4, 5), {6: 30, 4: 31, 5: 32}, 99,
                          checked=3, verified=3, drafted=False, branches=3)
    mask = layout.mask.int()
    assert layout.rows == 2 * 3 + 9
    for h, rows in enumerate(layout.branch_rows):
        for i, r in enumerate(rows):
            expected = [0] * layout.rows
            for s in range(h):  # O_1..O_h
                expected[s] = 1
            expected[r] = 1
            assert mask[r].tolist() == expected, (h, i)
        assert [layout.position_ids[r] for r in rows] == [6, 4, 5]


def test_confidence_order_ties_and_missing_scores():
    scores = {10: 0.5, 11: 0.9, 12: 0.5, 14: math.nan}
    assert confidence_order([10, 11, 12, 13, 14], scores) == (11, 10, 12, 13, 14)
    assert confidence_order([3, 4], {}) == (3, 4)  # the first iteration: ltr


def test_verify_in_order_counts_h_and_stops_at_the_first_missing_draft():
    order = (7, 5, 6)
    assert verify_in_order(order, {7: 1, 5: 2, 6: 3}, (1, 2, 3))[:2] == (3, [(7, 1), (5, 2), (6, 3)])
    assert verify_in_order(order, {7: 1, 5: 2, 6: 3}, (1, 9, 3))[:2] == (1, [(7, 1), (5, 9)])
    h, pairs, sources = verify_in_order(order, {7: 1}, (1, 4, 0))
    assert (h, pairs, sources) == (1, [(7, 1), (5, 4)], ["accepted draft", "bonus"])


class _Scripted:
    """Just enough of a model for OrderSession's acceptance rules."""

    mask_token_id, eos_token_id, max_length, any_order, cache_length = 1, 0, 1000, True, 0

    def reset(self, tokens=0, block_size=None):
        pass

    def rollback(self, keep):
        self.cache_length = keep

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def test_multi_token_stop_marker_is_recognised_only_once_all_its_tokens_are_accepted():
    """E.2: a marker of two tokens completed out of textual order; E moves to its last position only when
    both are accepted, later positions are dropped, earlier unresolved ones are still filled."""
    session = OrderSession(_Scripted(), [2, 3], DecodeConfig(max_new_tokens=10, stop_strings=("w7 w8",)), "packed")
    session.accept([(2, 4), (6, 8), (8, 9)], ["bonus"] * 3)  # w8 at 6 alone: no marker yet
    assert session.end == 11 and session.stop_reason is None
    appended, dropped = session.accept([(5, 7)], ["bonus"])  # w7 at 5 completes "w7 w8" ending at 6
    assert session.end == 6 and session.stop_reason == "stop string"
    assert dropped == [8] and appended == [5] and 8 not in session.filled
    assert not session.finished and session.window() == [3, 4]  # earlier holes are filled before returning
    session.accept([(3, 5), (4, 6)], ["bonus"] * 2)
    assert session.finished and session.text_order() == (4, 5, 6, 7, 8)


def test_the_earliest_ending_marker_or_eos_wins():
    session = OrderSession(_Scripted(), [2], DecodeConfig(max_new_tokens=10, stop_strings=("w5 w6", "w9")), "packed")
    session.accept([(1, 5), (2, 6), (4, 9), (3, 0)], ["bonus"] * 4)  # "w5 w6" ends at 2, "w9" at 4, EOS at 3
    assert session.end == 2 and session.stop_reason == "stop string" and session.finished


def test_eos_accepted_after_a_later_position_drops_it_and_matches_the_reference():
    """An EOS accepted at an earlier position than tokens already accepted (and cached) cuts them (line 12);
    the cache is rebuilt without them, and the output equals the serial reference."""
    found = 0
    for seed in range(40):
        model = tiny_any_order(seed=seed, vocab_size=12)
        got = run(model, "packed", order="confidence", new=30)
        if any(r.dropped_positions for r in got.records) or any(
                r.cut for r in got.records):
            found += 1
            assert got.token_ids == serial_reference(model, PROMPT, got.records, 30), seed
            assert got.token_ids[-1] == model.eos_token_id
        if found >= 2:
            break
    assert found, "no seed produced an EOS that cut accepted positions"


def test_stop_string_run_equals_ar_cut_at_the_marker():
    model = tiny_any_order(seed=1)
    reference = run(model, "ar")
    words = model.decode(list(reference.token_ids)).split()
    marker = " ".join(words[6:8])
    for name in ("ar",) + SPECULATIVE:
        got = run(model, name, order="ltr", stop_strings=(marker,))
        assert got.stop_reason == "stop string"
        assert got.text.endswith(marker) and marker not in got.text[:-1]
        assert got.token_ids == reference.token_ids[: len(got.token_ids)]


def test_refusals_are_one_line_errors():
    model = tiny_any_order(seed=0)
    with pytest.raises(ValueError, match="does not run on an any-order model"):
        list(decode(model, PROMPT, DecodeConfig(), "lookup"))
    with pytest.raises(PromptError, match="greedy"):
        list(decode(model, PROMPT, DecodeConfig(temperature=1.0), "packed"))
    with pytest.raises(ValueError, match="order must be one of"):
        DecodeConfig(order="random")


def test_steps_show_positions_and_work_per_step():
    model = tiny_any_order(seed=3)
    records = list(decode(model, PROMPT, DecodeConfig(block_size=4, max_new_tokens=12, order="confidence"), "packed"))
    filled = set()
    for r in records:
        assert len(r.appended) == len(r.appended_positions)
        assert not filled & set(r.appended_positions)
        filled |= set(r.appended_positions)
        assert r.prefix_len_after == len(PROMPT) + len(filled)
    assert filled == set(range(4, 16))
    assert np.all(np.diff([r.prefix_len_after for r in records]) > 0)


def test_native_any_order_decoding_commits_confident_positions_in_any_order():
    model = tiny_any_order(seed=1)
    everything = run(model, "diffusion", confidence_threshold=1e-9)  # every prediction committed at once
    assert everything.tokens == 24 and everything.nfe == 6  # 24 positions, windows of W = 4
    one = run(model, "diffusion", confidence_threshold=1.0)  # only the most confident position per call
    assert one.tokens == 24 and one.nfe == 24
    assert any(r.appended_positions[0] != min(r.order) for r in one.records)  # not always the leftmost
    assert all(len(r.appended) == 1 and r.appended_sources == ("diffusion",) for r in one.records)
