"""Inputs of one any-order call, built from named regions (paper Appendix D.2, Table 2's SetDLM columns).

The model predicts the token at the position of each mask (a same-position verifier). Each output
position of the active window may appear several times in one call, every copy with the position's own
id: in O by its draft token, in M by a verifier mask, in R by a drafter mask, in branch h by a mask.
Rows are ordered so that the rows the cache keeps come first: N, then O in verification order, so one
rollback that keeps N and the accepted O_1..O_h drops everything else.

Regions (rows of the call; every row also sees the whole KV cache: prompt and processed accepted tokens):

* N (``PENDING``): accepted tokens not yet processed as input (the last correction; after an end marker
  moved E, the accepted tokens whose cache entries were computed while seeing a dropped position).
  Row i sees N_1..N_i (acceptance order, as the cache).
* O (``TOKENS``): the draft token at rank r = 1..|O|, a mask where rank r has none (padding). Sees N,
  O_s for the earlier ranks s in K_r (those holding a draft token) and itself.
* M (``VERIFY``): the verifier mask at rank r. Sees N, O_s for s in K_r and itself (Equation 8).
* R (``DRAFT``): Packed-SS and Linear-SS drafting masks, one per unresolved position, in rank order.
  Sees N and itself: proposals from P_{t-1} alone (Algorithm 3 line 8).
* branch h (``BRANCH``): Quadratic-SS, h = 0..: a mask per unresolved position in rank order; sees N,
  O_1..O_h and itself (the draft after h accepted tokens).

Shape legend: u unresolved positions in the window, p = |N|, R rows of the call.
"""

from __future__ import annotations

import numpy as np
import torch

from packed_ss.layout import BRANCH, DRAFT, PREFILL, VERIFY, CallLayout

PENDING = "pending"  # N: accepted tokens entering the cache in this call
TOKENS = "draft tokens"  # O: draft tokens in token entries (the accepted ones enter the cache)


def order_layout(name: str, cached: int, pending: list[tuple[int, int]], order: tuple[int, ...],
                 draft: dict[int, int], mask_id: int, *, checked: int, verified: int, drafted: bool,
                 branches: int = 0, prompt: tuple[int, ...] | list[int] = ()) -> CallLayout:
    """One call over the window's unresolved positions ``order`` (pi_t: absolute positions, rank order).

    Args:
        name: the call's name (``"ao-packed"``, ...).
        cached: C, tokens in the KV cache before the call.
        pending: N as (position, token) pairs in acceptance order.
        order: pi_t, the u unresolved positions in verification order.
        draft: D_{t-1} as position -> token (positions outside ``order`` are ignored).
        mask_id: the mask token.
        checked: |O|, ranks 1..checked hold their draft token (or a mask when absent).
        verified: |M|, verifier masks for ranks 1..verified.
        drafted: whether R holds a drafter mask at every position of ``order``.
        branches: Quadratic-SS: branches h = 0..branches-1, u masks each.
        prompt: uncached prompt rows in front of everything (the first call: a causal prefill that the
            other rows see as they would see the cache).
    Returns: the layout; ``verify_rows`` are the M rows, ``draft_rows`` the R rows, ``branch_rows`` the
        branches, ``proposal_rows`` every mask row outside M.
    Raises: ValueError when ``checked`` or ``verified`` exceed u.
    """
    u = len(order)
    if not (0 <= checked <= u and 0 <= verified <= u):
        raise ValueError(f"{checked} checked and {verified} verified ranks for a window of {u} positions")
    n0 = len(prompt)
    p = len(pending)
    has = [order[r] in draft for r in range(checked)]  # which O rows hold a real draft token
    tokens = list(prompt) + [t for _, t in pending] + [draft.get(order[r], mask_id) for r in range(checked)]
    positions = list(range(cached, cached + n0)) + [j for j, _ in pending] + list(order[:checked])
    regions = [PREFILL] * n0 + [PENDING] * p + [TOKENS] * checked
    m_start = len(tokens)
    tokens += [mask_id] * verified
    positions += order[:verified]
    regions += [VERIFY] * verified
    r_start = len(tokens)
    width = u if drafted else 0
    tokens += [mask_id] * width
    positions += order[:width]
    regions += [DRAFT] * width
    b_start = len(tokens)
    tokens += [mask_id] * (branches * u)
    positions += list(order) * branches
    regions += [BRANCH] * (branches * u)
    rows = len(tokens)

    mask = np.zeros((rows, rows), dtype=bool)
    front = n0 + p  # prompt and N: every row sees them; they see each other causally
    mask[:, :front] = True
    mask[:front, :front] = np.tri(front, dtype=bool)
    o = front
    earlier = np.zeros(checked, dtype=bool)  # K_r as a boolean row over O: earlier ranks with a draft token
    for r in range(checked):
        mask[o + r, o: o + checked] = earlier
        mask[o + r, o + r] = True
        if r < verified:
            mask[m_start + r, o: o + checked] = earlier
        earlier = earlier.copy()
        earlier[r] = has[r]
    for r in range(checked, verified):  # verifier masks past |O| see every drafted O row
        mask[m_start + r, o: o + checked] = earlier
    for h in range(branches):  # branch h: O_1..O_h (accepted when it is selected)
        start = b_start + h * u
        mask[start: start + u, o: o + min(h, checked)] = True
    own = np.arange(m_start, rows)
    mask[own, own] = True
    return CallLayout(
        name=name,
        token_ids=tuple(tokens),
        position_ids=tuple(positions),
        regions=tuple(regions),
        mask=torch.from_numpy(mask),
        cached=cached,
        verify_rows=tuple(range(m_start, m_start + verified)),
        draft_rows=tuple(range(r_start, r_start + width)),
        branch_rows=tuple(tuple(range(b_start + h * u, b_start + (h + 1) * u)) for h in range(branches)),
        proposal_rows=tuple(range(r_start, rows)),
    )
