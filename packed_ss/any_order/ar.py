"""The any-order model's own left-to-right decoding: one verifier mask per call (the reference output).

Each call holds N (the token accepted last, entering the cache) and one mask at the leftmost unresolved
position that sees the prompt and every accepted token (Equation 8 with pi = textual order, u = 1). The
first call prefills the prompt in the same call. 2 rows per call after the first.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession
from packed_ss.records import SOURCE_AR, SOURCE_PREFILL, IterationRecord


class OrderAR:
    name = "ar"
    title = "Autoregressive (any-order model, left to right)"
    summary = "One mask per call at the next position; the reference output."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prompt and one mask, then 2 rows per further token."""
        return prompt_len + 1 + 2 * (config.max_new_tokens - 1)

    def iterate(self, session: OrderSession) -> Iterator[IterationRecord]:
        mask_id = session.model.mask_token_id
        first = True
        while not session.finished:
            session.begin()
            before = session.prompt_len + len(session.filled)
            order = (session.left,)  # the leftmost open position
            layout = order_layout("ao-ar", session.model.cache_length, session.pending, order, {}, mask_id,
                                  checked=0, verified=1, drafted=False, prompt=session.prompt if first else ())
            v = session.call(layout, layout.verify_rows).top
            # no draft (h = 0): the verifier's token is accepted and enters the cache next call as N
            appended, dropped = session.conclude([(order[0], v[0])], [SOURCE_PREFILL if first else SOURCE_AR], 0)
            yield session.record(appended, dropped, prefix_len_before=before, verifier_tokens=v,
                                 order=order)
            first = False
