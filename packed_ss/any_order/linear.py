"""Linear-SS with any-order verification: a drafting call, then a verification call (paper Appendix C).

The order pi_t is fixed before the drafting call from the verifier's confidence at each position in the
previous iteration (E.6). Call 1 holds N (cached between the calls) and a drafter mask per unresolved
position (p + u rows); call 2 holds the fresh draft as token entries (O) and a verifier mask per rank (M),
2u rows. p + 3u rows per iteration (Table 2).
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession, order_for, verify_in_order
from packed_ss.records import IterationRecord


class OrderLinearSS:
    name = "linear"
    title = "Linear-SS (any order)"
    summary = "Draft every unresolved position, then verify in the chosen order; two calls, p + 3u rows."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prompt, then at most L iterations of p + 3W rows (Table 2)."""
        return prompt_len + config.max_new_tokens * (1 + 3 * config.width)

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        mask_id = session.model.mask_token_id
        scores: dict[int, float] = {}
        first = True
        while not session.finished:
            session.begin()
            before = session.prompt_len + len(session.filled)
            window = session.window()
            order = order_for(session.config, window, scores)  # fixed before the drafting call (E.6)
            u = len(order)
            layout = order_layout("ao-linear-draft", session.model.cache_length, session.pending, order, {},
                                  mask_id, checked=0, verified=0, drafted=True,
                                  prompt=session.prompt if first else ())
            z = session.call(layout, layout.draft_rows).top
            session.settle([])  # N enters the cache; the drafter masks leave it
            draft = dict(zip(order, z))
            layout = order_layout("ao-linear-verify", session.model.cache_length, [], order, draft, mask_id,
                                  checked=u, verified=u, drafted=False)
            rows = session.call(layout, layout.verify_rows)
            v = rows.top
            h, pairs, sources = verify_in_order(order, draft, v)
            appended, dropped = session.conclude(pairs, sources, h)
            scores = session.order_scores(rows, {j: r for r, j in enumerate(order) if j not in session.filled})
            yield session.record(appended, dropped, prefix_len_before=before, old_draft=tuple(z),
                                 draft_positions=order, verifier_tokens=v, h=h, order=order,
                                 proposals=tuple(z), proposal_positions=order, proposal_start=order[0],
                                 kept=tuple(range(u)))
            first = False
