"""Linear-SS: a drafting call then a verification call per iteration (paper Section 2.3, Table 2).

Iteration 1 prefills the prompt and takes the first token (no draft yet). Each later iteration:
1. drafting call ``[P^(n), MASK x W]`` in diffusion mode gives D = z^(1..W) conditioned on the NEWEST
   prefix; its rows are dropped from the cache right away;
2. verification call ``[P^(n), d^(1..W)]`` in causal mode gives p^(1..W+1); acceptance as in
   Algorithm 1/2 appends A = h + 1 tokens.
Two calls and 2B rows per iteration.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.layout import draft_layout
from packed_ss.records import IterationRecord
from packed_ss.schedules.base import Session


class LinearSS:
    name = "linear"
    title = "Linear-SS"
    summary = "Draft, then verify: two calls per iteration, the draft reads the newest prefix."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prefill, then at most L - 1 iterations of 2B rows (Table 2)."""
        return prompt_len + (config.max_new_tokens - 1) * 2 * config.block_size

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        mask_id, width = session.model.mask_token_id, session.config.width
        yield session.first_token()  # iteration 1: prefill; the first token has no draft to verify
        while not session.finished:
            session.begin()
            before, last = len(session.prefix), session.prefix[-1]
            # 1. Draft W tokens from P_{t-1}; drafter rows never stay in the cache.
            layout = draft_layout(last, width, session.cached, mask_id)
            draft, stored_q = session.propose(session.call(layout, layout.draft_rows))
            session.rollback(before - 1)
            # 2. Verify them in causal mode.
            yield session.verify_in_causal_call(draft, stored_q, before, "linear-verify")
