"""Quadratic-SS: one call verifies the draft and drafts a continuation for every acceptance length.

The call holds B causal verify rows ``[P^(n), d^(1..W)]`` and, for each h = 0..W, a branch of B masks
at positions n+h..n+h+W that reads the verify rows up to d^(h) (its causal leader) and itself. After
verification accepts h tokens, branch h is selected: its first mask sits on the correction/bonus
position and is discarded, the other W proposals form the next draft, conditioned on every accepted
draft token (not on the correction). At T > 0 the draft is sampled from the selected branch (paper
Appendix E.4). Iteration 1 is the prefill + W + 1 masks call of Appendix E.2. B(B+1) rows per call.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.layout import prefill_layout, quadratic_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
from packed_ss.schedules.base import Session


class QuadraticSS:
    name = "quadratic"
    title = "Quadratic-SS"
    summary = "One call with a draft branch per acceptance length; B(B+1) rows per call."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: prefill + B masks, then at most L - 1 calls of B(B+1) rows."""
        b = config.block_size
        return prompt_len + b + (config.max_new_tokens - 1) * b * (b + 1)

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        mask_id, width = session.model.mask_token_id, session.config.width
        draft: list[int] = []
        stored_q = []
        first = True
        while not session.finished:
            session.begin()
            before, old_draft = len(session.prefix), tuple(draft)
            if first:
                layout = prefill_layout(session.prefix, width + 1, mask_id)
                branches = (layout.draft_rows,)
            else:
                layout = quadratic_layout(session.prefix[-1], draft, width, session.cached, mask_id)
                branches = layout.branch_rows
            branch_rows = tuple(r for branch in branches for r in branch)
            # One call; the LM head runs on the verify rows now and on the selected branch only below.
            logits = session.call(layout, layout.verify_rows, deferred=branch_rows)
            verdict, v, v_probs = session.verify(draft, stored_q, logits)
            tokens, sources = session.verdict_tokens(draft, verdict)
            if first:
                sources = [SOURCE_PREFILL]
            appended, sources = session.commit(tokens, sources)
            # Branch h_t: the one whose leader is the last accepted draft token.
            size = len(branches[0])
            q_logits = session.deferred_logits(verdict.h * size, (verdict.h + 1) * size)
            proposals = list(q_logits.top)
            kept: tuple[int, ...] = ()
            if not session.finished:  # the first mask of the branch is the correction/bonus slot
                draft, stored_q = session.propose(q_logits[1:])
                proposals[1:] = draft
                kept = tuple(range(1, len(proposals)))
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=old_draft, verifier_tokens=v, verifier_probs=v_probs,
                                 accept_probs=verdict.accept_probs, proposals=tuple(proposals),
                                 proposal_start=before + verdict.h, kept=kept, h=verdict.h,
                                 appended=tuple(appended),
                                 appended_sources=tuple(sources))
            first = False
