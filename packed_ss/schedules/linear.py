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

from packed_ss.layout import draft_layout, prefill_layout, verify_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
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
        # Iteration 1: prefill; the first token has no draft to verify.
        session.begin()
        layout = prefill_layout(session.prefix, 0, mask_id)
        verdict, v, v_probs = session.verify([], [], session.call(layout, layout.verify_rows))
        appended, sources = session.commit([verdict.token], [SOURCE_PREFILL])
        session.rollback(len(session.prefix) - 1)
        yield session.record(prefix_len_before=session.prompt_len, prefix_len_after=len(session.prefix),
                             verifier_tokens=v, verifier_probs=v_probs, advance=1,
                             appended=tuple(appended), appended_sources=tuple(sources))
        while not session.finished:
            session.begin()
            before, last = len(session.prefix), session.prefix[-1]
            # 1. Draft W tokens from P_{t-1}; drafter rows never stay in the cache.
            layout = draft_layout(last, width, session.cached, mask_id)
            draft, stored_q = session.propose(session.call(layout, layout.draft_rows))
            session.rollback(before - 1)
            # 2. Verify them in causal mode.
            layout = verify_layout([last], draft, session.cached, name="linear-verify")
            verdict, v, v_probs = session.verify(draft, stored_q, session.call(layout, layout.verify_rows))
            tokens, sources = session.verdict_tokens(draft, verdict)
            appended, sources = session.commit(tokens, sources)
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=tuple(draft), verifier_tokens=v, verifier_probs=v_probs,
                                 accept_probs=verdict.accept_probs, h=verdict.h, advance=verdict.h + 1,
                                 appended=tuple(appended), appended_sources=tuple(sources))
