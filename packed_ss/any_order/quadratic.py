"""Quadratic-SS with any-order verification (paper Appendix C): one call, a draft branch per acceptance length.

The call holds N, the old draft as token entries (O) and verifier masks (M) in verification order, and
for each h a branch of masks at every unresolved position that sees the first h draft tokens of the
order (the accepted ones if h is the outcome). After the check, branch h_t supplies the next draft at the
positions still unresolved, and its probabilities are the next order's confidence scores (E.6).
p + 2u + u^2 rows per call when padded (Table 2); with min(|D| + 1, u) verifier masks and branches when not.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession, order_for, verify_in_order
from packed_ss.records import IterationRecord


class OrderQuadraticSS:
    name = "quadratic"
    title = "Quadratic-SS (any order)"
    summary = "One call with a draft branch per acceptance length, in the chosen order; p + 2u + u^2 rows."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prompt, then at most L calls of p + 2W + W^2 rows (Table 2)."""
        w = config.width
        return prompt_len + config.max_new_tokens * (1 + 2 * w + w * w)

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        mask_id = session.model.mask_token_id
        pad = getattr(session.model, "pads_drafts", True)
        draft: dict[int, int] = {}
        scores: dict[int, float] = {}
        first = True
        while not session.finished:
            session.begin()
            before = session.prompt_len + len(session.filled)
            order = order_for(session.config, session.window(), scores)
            kappa = next((r for r, j in enumerate(order) if j not in draft), len(order))
            u = len(order)
            reach = u if pad else min(kappa + 1, u)
            layout = order_layout("ao-quadratic", session.model.cache_length, session.pending, order, draft,
                                  mask_id, checked=u if pad else kappa, verified=reach, drafted=False,
                                  branches=reach, prompt=session.prompt if first else ())
            branch_rows = tuple(r for b in layout.branch_rows for r in b)
            logits = session.call(layout, layout.verify_rows + branch_rows)
            v = logits.top[: len(layout.verify_rows)]
            h, pairs, sources = verify_in_order(order, draft, v, first)
            old = tuple(draft[j] for j in order[:kappa])
            appended, dropped = session.conclude(pairs, sources, h)
            z_rows, z, kept = None, (), ()
            if h < u:  # branch h_t (none needed when every position was accepted)
                start = len(layout.verify_rows) + h * u
                z_rows = logits[start: start + u]
                z = z_rows.top
                kept = tuple(r for r, j in enumerate(order) if j not in session.filled and j <= session.end)
            draft = {order[r]: z[r] for r in kept}
            scores = session.order_scores(z_rows, {order[r]: r for r in kept})
            yield session.record(appended, dropped, prefix_len_before=before, old_draft=old,
                                 draft_positions=order[:kappa], verifier_tokens=v, h=h,
                                 order=order, proposals=z, proposal_positions=order if z else (),
                                 proposal_start=order[0], kept=kept)
            first = False
