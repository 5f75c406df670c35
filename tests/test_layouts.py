"""Call layouts: rows per call (paper Table 2) and B = 4 masks written out by hand (Appendix D.1)."""

import pytest
import torch

from packed_ss.layout import (BRANCH, DRAFT, VERIFY, draft_layout, packed_layout, prefill_layout,
                              quadratic_layout, verify_layout)

MASK = 1


def bools(rows):
    return torch.tensor(rows, dtype=torch.bool)


@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_rows_per_iteration_match_table_2(block):
    w = block - 1
    draft = list(range(10, 10 + w))
    linear = draft_layout(5, w, 20, MASK).rows + verify_layout([5], draft, 20).rows
    assert linear == 2 * block
    assert quadratic_layout(5, draft, w, 20, MASK).rows == block * (block + 1)
    assert packed_layout(5, draft, w, 20, MASK).rows == 2 * block


def test_packed_mask_b4_by_hand():
    layout = packed_layout(last=7, draft=[8, 9], width=3, cached=10, mask_id=MASK)
    expected = bools([
        # verify half: T_4        draft half: 0
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        # draft half: 0            J_4
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ])
    assert torch.equal(layout.mask, expected)
    assert layout.token_ids == (7, 8, 9, MASK, 7, MASK, MASK, MASK)  # draft padded to W slots
    assert layout.position_ids == (10, 11, 12, 13, 10, 11, 12, 13)  # both halves share positions
    assert layout.regions == (VERIFY,) * 4 + (DRAFT,) * 4
    full = layout.full_mask()
    assert full.shape == (8, 18) and full[:, :10].all()  # every row sees the cache


def test_quadratic_mask_b4_by_hand():
    layout = quadratic_layout(last=7, draft=[8, 9, 10], width=3, cached=10, mask_id=MASK)
    v = [1, 0, 0, 0]
    rows = [
        [1, 0, 0, 0] + [0] * 16,
        [1, 1, 0, 0] + [0] * 16,
        [1, 1, 1, 0] + [0] * 16,
        [1, 1, 1, 1] + [0] * 16,
    ]
    for h in range(4):  # branch h reads verify rows 0..h and its own block of 4
        leader = [1] * (h + 1) + [0] * (3 - h)
        block = [0] * (4 * h) + [1] * 4 + [0] * (12 - 4 * h)
        rows += [leader + block] * 4
    assert v == rows[0][:4]
    assert torch.equal(layout.mask, bools(rows))
    assert layout.rows == 20
    assert layout.position_ids[:4] == (10, 11, 12, 13)
    assert [layout.position_ids[4 + 4 * h] for h in range(4)] == [11, 12, 13, 14]
    assert layout.regions[4:] == (BRANCH,) * 16


def test_linear_and_prefill_masks_b4_by_hand():
    assert torch.equal(draft_layout(7, 3, 10, MASK).mask, torch.ones(4, 4, dtype=torch.bool))
    assert torch.equal(verify_layout([7], [8, 9, 10], 10).mask, torch.ones(4, 4, dtype=torch.bool).tril())
    pre = prefill_layout([3, 4], num_masks=4, mask_id=MASK)
    assert torch.equal(pre.mask, bools([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
    ]))
    assert pre.position_ids == (0, 1, 2, 3, 4, 5)


def test_unpadded_packed_call_holds_only_the_drafts_own_rows():
    """pad=False (the CPU choice): v = 1 + |D| causal verify rows, then the full drafter block, B = 4."""
    layout = packed_layout(last=7, draft=[8, 9], width=3, cached=10, mask_id=MASK, pad=False)
    assert layout.rows == 3 + 4 and layout.token_ids == (7, 8, 9, 7, MASK, MASK, MASK)
    assert layout.position_ids == (10, 11, 12, 10, 11, 12, 13)
    assert layout.verify_rows == (0, 1, 2) and layout.draft_rows == (4, 5, 6) and layout.proposal_rows == (3, 4, 5, 6)
    assert torch.equal(layout.mask, bools([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 1]]))
    assert packed_layout(7, [], 3, 10, MASK, pad=False).rows == 1 + 4
    assert packed_layout(7, [8, 9, 10], 3, 10, MASK, pad=False).rows == packed_layout(7, [8, 9, 10], 3, 10, MASK).rows
