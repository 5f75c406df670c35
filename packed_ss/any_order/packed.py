"""Packed-SS with any-order verification (paper Algorithm 3, Appendix D.2).

Each call holds, for the window's unresolved positions U_t in verification order pi_t: the old draft as
token entries (O), a verifier mask per rank that sees the earlier ranks' draft tokens (M, Equation 8),
and a drafter mask per position that sees only P_{t-1} (R). After the greedy check, R's predictions at
positions still unresolved become D_t; their probabilities are the confidence scores of the next order
(E.6). The first call also prefills the prompt (Appendix E.2 spends a separate call on it; one call
serves both here, with the same outputs). p + 3u rows per call when padded (Table 2), p + |D| +
min(|D| + 1, u) + u when not (CPU).
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession, order_for, verify_in_order
from packed_ss.records import IterationRecord


class OrderPackedSS:
    name = "packed"
    title = "Packed-SS (any order)"
    summary = "One call verifies the draft in the chosen order and drafts every unresolved position; p + 3u rows."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prompt, then at most L calls of p + 3W rows (Table 2)."""
        return prompt_len + config.max_new_tokens * (1 + 3 * config.width)

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        mask_id = session.model.mask_token_id
        pad = getattr(session.model, "pads_drafts", True)
        draft: dict[int, int] = {}  # D_0 = empty (line 1)
        scores: dict[int, float] = {}
        first = True
        while not session.finished:  # line 2
            session.begin()
            before = session.prompt_len + len(session.filled)
            window = session.window()  # lines 3-4
            order = order_for(session.config, window, scores)  # line 5
            kappa = next((r for r, j in enumerate(order) if j not in draft), len(order))  # line 6
            u = len(order)
            layout = order_layout("ao-packed", session.model.cache_length, session.pending, order, draft, mask_id,
                                  checked=u if pad else kappa, verified=u if pad else min(kappa + 1, u),
                                  drafted=True, prompt=session.prompt if first else ())
            logits = session.call(layout, layout.verify_rows + layout.draft_rows)  # lines 6-8, one call
            v = logits.top[: len(layout.verify_rows)]
            z_rows = logits[len(layout.verify_rows):]
            h, pairs, sources = verify_in_order(order, draft, v, first)  # lines 9-10
            old = tuple(draft[j] for j in order[:kappa])
            appended, dropped = session.conclude(pairs, sources, h)  # lines 11-13
            z = z_rows.top
            kept = tuple(r for r, j in enumerate(order) if j not in session.filled and j <= session.end)  # line 14
            draft = {order[r]: z[r] for r in kept}  # line 15
            scores = session.order_scores(z_rows, {order[r]: r for r in kept})
            yield session.record(appended, dropped, prefix_len_before=before, old_draft=old,
                                 draft_positions=order[:kappa], verifier_tokens=v, h=h,
                                 order=order, proposals=z, proposal_positions=order, proposal_start=order[0],
                                 kept=kept)
            first = False
