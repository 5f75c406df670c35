"""Inputs of one model call, built from named regions (paper Appendix D.1, Table 2).

Every call sees the whole KV cache (the verified prefix minus its last token, Appendix D.1), so a
layout stores only the attention among its own rows; ``full_mask`` prepends the all-True cache band.
Rows are ordered so that the rows worth caching always come first: after verification one rollback
that keeps a prefix of the new rows drops everything else (drafter rows, rejected verifier rows).

Component masks: ``T(n)`` lower-triangular with diagonal (causal mode), ``J(n)`` all ones
(bidirectional diffusion mode), ``O(r, c)`` all zeros.

Masks that depend only on the block size are built once and shared (read-only) between calls, which
keeps them off the decoder's non-model time.

Shape legend: B block size, W = B - 1 speculative width, R rows of the call, C cached tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

# Region names (one per row); the UI draws them as labelled bands.
PREFILL = "prefill"  # prompt / uncached prefix rows in causal mode
VERIFY = "verify"  # last prefix token and draft slots in causal mode (verifier)
DRAFT = "draft"  # diffusion-mode rows: last prefix token copy and masks (drafter)
BRANCH = "branch"  # Quadratic-SS: one mask block per acceptance length


@lru_cache(maxsize=64)
def T(n: int) -> torch.Tensor:
    """(n, n) causal block: row i sees rows 0..i."""
    return torch.ones(n, n, dtype=torch.bool).tril()


@lru_cache(maxsize=64)
def J(n: int) -> torch.Tensor:
    """(n, n) bidirectional block: every row sees every row."""
    return torch.ones(n, n, dtype=torch.bool)


def O(rows: int, cols: int) -> torch.Tensor:  # noqa: E743 - the paper's zero block
    """(rows, cols) block of no attention."""
    return torch.zeros(rows, cols, dtype=torch.bool)


@dataclass(frozen=True)
class CallLayout:
    """One model call: its rows, their position ids and region names, and the attention among them.

    Attributes:
        name: which call this is (``"packed"``, ``"linear-draft"``, ...).
        token_ids: (R,) input token ids (mask token in empty slots).
        position_ids: (R,) absolute positions; the two halves of a packed call share positions.
        regions: (R,) region name of each row (PREFILL, VERIFY, DRAFT, BRANCH).
        mask: (R, R) bool, True = may attend; rows also see all C cached keys.
        cached: C, cache length the call starts from.
        verify_rows: rows whose logits give the verifier distributions p^(1), p^(2), ...
        draft_rows: rows whose logits give the drafter distributions q^(1), q^(2), ...
        branch_rows: Quadratic-SS only: the draft rows of the branch for each acceptance length h.
        proposal_rows: the diffusion-mode rows of a speculative call (drafter half, branches, masks):
            the only rows a drafter adapter updates (Appendix F.2; Table 5 "selected" rows).
        branch_lengths: the acceptance length h each of ``branch_rows`` serves; empty means 0, 1, 2, ...
            (Quadratic-SS's branch for every h).
    """

    name: str
    token_ids: tuple[int, ...]
    position_ids: tuple[int, ...]
    regions: tuple[str, ...]
    mask: torch.Tensor
    cached: int
    verify_rows: tuple[int, ...] = ()
    draft_rows: tuple[int, ...] = ()
    branch_rows: tuple[tuple[int, ...], ...] = ()
    proposal_rows: tuple[int, ...] = ()
    branch_lengths: tuple[int, ...] = ()

    def __post_init__(self):
        rows = len(self.token_ids)
        if not (len(self.position_ids) == len(self.regions) == rows and tuple(self.mask.shape) == (rows, rows)):
            raise ValueError(f"layout {self.name}: inconsistent row counts")

    @property
    def branch_h(self) -> dict[int, int]:
        """Row index -> the acceptance length h of the branch holding it (branch rows only)."""
        lengths = self.branch_lengths or tuple(range(len(self.branch_rows)))
        return {r: h for h, rows in zip(lengths, self.branch_rows) for r in rows}

    @property
    def rows(self) -> int:
        """R, rows evaluated by the call (Table 2 counts these)."""
        return len(self.token_ids)

    def full_mask(self) -> torch.Tensor:
        """(R, C + R) bool mask over cached keys then the call's own keys."""
        full = np.ones((self.rows, self.cached + self.rows), dtype=bool)  # NumPy: no per-op dispatch cost
        full[:, self.cached:] = self.mask.numpy()
        return torch.from_numpy(full)


def _blocks(rows: list[list[torch.Tensor]]) -> torch.Tensor:
    return torch.cat([torch.cat(row, dim=1) for row in rows], dim=0)


def prefill_layout(prompt: list[int], num_masks: int, mask_id: int) -> CallLayout:
    """First call (Appendix E.2): the prompt in causal mode, then ``num_masks`` diffusion masks.

    Mask: ``[[T(n), O], [J(m, n), J(m)]]``: the masks read the whole prompt and each other.
    With ``num_masks = 0`` this is a plain prefill (AR, Linear-SS).
    Positions: prompt 0..n-1, masks n..n+m-1. verify_rows = (n-1,), draft_rows = the masks.
    """
    n, m = len(prompt), num_masks
    mask = _blocks([[T(n), O(n, m)],
                    [torch.ones(m, n, dtype=torch.bool), J(m)]])
    return CallLayout(
        name="prefill" if m == 0 else "prefill+draft",
        token_ids=tuple(prompt) + (mask_id,) * m,
        position_ids=tuple(range(n + m)),
        regions=(PREFILL,) * n + (DRAFT,) * m,
        mask=mask,
        cached=0,
        verify_rows=(n - 1,),
        draft_rows=tuple(range(n, n + m)),
        proposal_rows=tuple(range(n, n + m)),
    )


def verify_layout(tail: list[int], slots: list[int], cached: int, name: str = "verify") -> CallLayout:
    """Causal call over the uncached prefix tail and the draft slots: mask ``T(R)``.

    Linear-SS's verification call (``[P^(n), d^(1..W)]``) and AR's one-row call. The verifier rows are
    the last tail token and every slot: row i predicts the token after it (p^(1), p^(2), ...).
    """
    rows = len(tail) + len(slots)
    return CallLayout(
        name=name,
        token_ids=tuple(tail) + tuple(slots),
        position_ids=tuple(range(cached, cached + rows)),
        regions=(PREFILL,) * (len(tail) - 1) + (VERIFY,) * (1 + len(slots)),
        mask=T(rows),
        cached=cached,
        verify_rows=tuple(range(len(tail) - 1, rows)),
    )


def draft_layout(last: int, width: int, cached: int, mask_id: int) -> CallLayout:
    """Linear-SS drafting call ``[P^(n), MASK x W]`` with mask ``J(B)`` (Appendix D.1, diffusion half).

    The masks at positions n..n+W-1 give q^(1..W); the copy of the last prefix token gives nothing.
    """
    block = 1 + width
    return CallLayout(
        name="linear-draft",
        token_ids=(last,) + (mask_id,) * width,
        position_ids=tuple(range(cached, cached + block)),
        regions=(DRAFT,) * block,
        mask=J(block),
        cached=cached,
        draft_rows=tuple(range(1, block)),
        proposal_rows=tuple(range(block)),
    )


def packed_layout(last: int, draft: list[int], width: int, cached: int, mask_id: int,
                  pad: bool = True, drafter_width: int | None = None) -> CallLayout:
    """Packed-SS call ``[P^(n), D̄ | P^(n), MASK x W]`` with mask ``[[T(v), O], [O, J(B)]]`` (Appendix D.1).

    D̄ is the old draft padded with masks to W slots (``pad``, the paper's fixed 2B-row shape, good for
    batching on a GPU), or the draft as it is (``pad=False``: v = 1 + |D| verify rows, no row computed
    for an empty slot; cheaper on a CPU). The verify half uses positions n-1..n-1+|D̄|, the draft half
    n-1..n+W-1 (0-based, the last prefix token at n-1); shared positions. Verify rows give p^(1..|D̄|+1),
    draft rows 1..W give q^(1..W) conditioned on the OLD prefix P_{t-1} only (Equation 3).
    ``drafter_width``: masks in the draft half when it differs from the draft's W (a variant whose drafts
    also come from n-gram matches reaches further than its drafter); default W.
    Raises: ValueError for a draft longer than ``width``.
    """
    if len(draft) > width:
        raise ValueError(f"draft of {len(draft)} tokens exceeds width {width}")
    masks = width if drafter_width is None else drafter_width
    block = 1 + masks
    slots = list(draft) + [mask_id] * (width - len(draft)) if pad else list(draft)
    verify = 1 + len(slots)
    positions = tuple(range(cached, cached + max(block, verify)))
    return CallLayout(
        name="packed",
        token_ids=(last, *slots, last) + (mask_id,) * masks,
        position_ids=positions[:verify] + positions[:block],
        regions=(VERIFY,) * verify + (DRAFT,) * block,
        mask=_packed_mask(verify, block),
        cached=cached,
        verify_rows=tuple(range(verify)),
        draft_rows=tuple(range(verify + 1, verify + block)),
        proposal_rows=tuple(range(verify, verify + block)),
    )


@lru_cache(maxsize=256)
def _packed_mask(verify: int, block: int) -> torch.Tensor:
    return _blocks([[T(verify), O(verify, block)],   # verifier: causal over prefix + draft
                    [O(block, verify), J(block)]])  # drafter: bidirectional, blind to the draft


@lru_cache(maxsize=64)
def _quadratic_mask(block: int) -> torch.Tensor:
    rows = block * (block + 1)
    mask = O(rows, rows)
    mask[:block, :block] = T(block)  # verifier rows
    for h in range(block):
        start = block * (h + 1)
        mask[start:start + block, : h + 1] = True  # leader: verify rows 0..h
        mask[start:start + block, start:start + block] = J(block)  # own bidirectional block
    return mask


def quadratic_layout(last: int, draft: list[int], width: int, cached: int, mask_id: int) -> CallLayout:
    """Quadratic-SS call: B causal verify rows, then one block of B masks per acceptance length h.

    Branch h (0..W) sits at positions n+h..n+h+W (0-based n = cached + 1); it reads the verify rows
    0..h (its causal leader: the last prefix token and d^(1..h)) and itself bidirectionally. Its first
    mask falls on the correction/bonus position and is discarded; the other W form the next draft.
    Rows: B + B*B = B(B+1) (Table 2).
    """
    if len(draft) > width:
        raise ValueError(f"draft of {len(draft)} tokens exceeds width {width}")
    block = 1 + width
    padded = list(draft) + [mask_id] * (width - len(draft))
    offsets, branch_rows = _quadratic_structure(block)
    return CallLayout(
        name="quadratic",
        token_ids=(last, *padded) + (mask_id,) * (block * block),
        position_ids=tuple(map(cached.__add__, offsets)),
        regions=(VERIFY,) * block + (BRANCH,) * (block * block),
        mask=_quadratic_mask(block),
        cached=cached,
        verify_rows=tuple(range(block)),
        branch_rows=branch_rows,
        proposal_rows=tuple(range(block, block * (block + 1))),
    )


@lru_cache(maxsize=64)
def _quadratic_structure(block: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """Position offsets from the cache length (verify rows 0..W, branch h at 1+h..1+h+W) and the rows of
    each branch; built once per block size, so a call adds only the cache length."""
    offsets = list(range(block))
    branch_rows = []
    for h in range(block):
        start = block * (h + 1)
        offsets += range(1 + h, 1 + h + block)
        branch_rows.append(tuple(range(start, start + block)))
    return tuple(offsets), tuple(branch_rows)


def diffusion_layout(tail: list[int], slots: list[int], cached: int) -> CallLayout:
    """Native block-diffusion call: uncached prefix rows (causal), then the block ``[P^(n), slots]``.

    Mask ``[[T(k), O], [J(b, k), J(b)]]`` with k = len(tail) - 1 and b = 1 + len(slots): the block reads
    the whole prefix and itself bidirectionally; slot rows give q for their own positions.
    """
    k, b = len(tail) - 1, 1 + len(slots)
    mask = _blocks([[T(k), O(k, b)],
                    [torch.ones(b, k, dtype=torch.bool), J(b)]])
    return CallLayout(
        name="diffusion",
        token_ids=tuple(tail) + tuple(slots),
        position_ids=tuple(range(cached, cached + k + b)),
        regions=(PREFILL,) * k + (DRAFT,) * b,
        mask=mask,
        cached=cached,
        draft_rows=tuple(range(k + 1, k + b)),
    )


def partial_layout(last: int, draft: list[int], width: int, cached: int, mask_id: int,
                   branches: tuple[int, ...], pad: bool = True) -> CallLayout:
    """Partial-branch call: Packed-SS's two halves plus Quadratic-SS's branches for some acceptance lengths.

    Rows: ``[P^(n), D̄]`` causal verify rows (v = W + 1 padded, 1 + |D| without ``pad``), then the drafter
    half ``[P^(n), MASK x W]`` (B rows, blind to the draft: it reads the cache and itself, as in
    :func:`packed_layout`), then for each h in ``branches`` (ascending, each <= |D|) a block of B masks at
    positions n+h..n+h+W that reads verify rows 0..h and itself (as in :func:`quadratic_layout`).
    Rows: v + B + k B, k = len(branches); B(k + 2) when padded.
    Raises: ValueError for a draft longer than W, or a branch outside 0..|D|, repeated or unsorted.
    """
    if len(draft) > width:
        raise ValueError(f"draft of {len(draft)} tokens exceeds width {width}")
    if list(branches) != sorted(set(branches)) or any(not 0 <= h <= len(draft) for h in branches):
        raise ValueError(f"branches must be distinct acceptance lengths in 0..{len(draft)}, ascending; got {branches}")
    block = 1 + width
    slots = list(draft) + [mask_id] * (width - len(draft)) if pad else list(draft)
    verify = 1 + len(slots)
    branches = tuple(branches)
    offsets, branch_rows = _partial_structure(verify, block, branches)
    rows = len(offsets)
    return CallLayout(
        name="partial",
        token_ids=(last, *slots, last) + (mask_id,) * (width + len(branches) * block),
        position_ids=tuple(map(cached.__add__, offsets)),
        regions=(VERIFY,) * verify + (DRAFT,) * block + (BRANCH,) * (len(branches) * block),
        mask=_partial_mask(verify, block, branches),
        cached=cached,
        verify_rows=tuple(range(verify)),
        draft_rows=tuple(range(verify + 1, verify + block)),
        branch_rows=branch_rows,
        proposal_rows=tuple(range(verify, rows)),
        branch_lengths=branches,
    )


@lru_cache(maxsize=512)
def _partial_structure(verify: int, block: int, branches: tuple[int, ...]):
    """Position offsets from the cache length and each branch's rows, built once per shape."""
    start = verify + block  # first branch row
    offsets = list(range(verify)) + list(range(block))
    branch_rows = []
    for j, h in enumerate(branches):
        offsets += range(1 + h, 1 + h + block)
        branch_rows.append(tuple(range(start + j * block, start + (j + 1) * block)))
    return tuple(offsets), tuple(branch_rows)


@lru_cache(maxsize=512)
def _partial_mask(verify: int, block: int, branches: tuple[int, ...]) -> torch.Tensor:
    rows = verify + block * (1 + len(branches))
    mask = O(rows, rows)
    mask[:verify, :verify] = T(verify)  # verifier rows: causal over cache + draft
    mask[verify:verify + block, verify:verify + block] = J(block)  # drafter half: itself only
    for j, h in enumerate(branches):
        start = verify + block * (1 + j)
        mask[start:start + block, : h + 1] = True  # leader: verify rows 0..h
        mask[start:start + block, start:start + block] = J(block)
    return mask
