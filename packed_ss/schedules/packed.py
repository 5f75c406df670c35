"""Packed-SS: verify the old draft and draft the next one in the same call (paper Algorithms 1-2).

Call t reads P_{t-1} and D_{t-1}: its causal half ``[P^(n), D̄]`` gives the verifier distributions
p^(1..|D|+1), its diffusion half ``[P^(n), MASK x W]`` gives the proposals Z_t conditioned on P_{t-1}
alone (Equation 3). After A tokens are appended, the first A proposals are discarded and the rest form
D_t (Equation 4). Iteration 1 prefills the prompt and drafts W + 1 positions (Appendix E.2), so the
first regular call already has a full draft. One call and 2B rows per iteration.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.layout import packed_layout, prefill_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
from packed_ss.schedules.base import Session


class PackedSS:
    name = "packed"
    title = "Packed-SS"
    summary = "One call verifies the old draft and drafts from the old prefix; 2B rows per call."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: prefill + B masks, then at most L - 1 calls of 2B rows (Table 2)."""
        b = config.block_size
        return prompt_len + b + (config.max_new_tokens - 1) * 2 * b

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        mask_id, width = session.model.mask_token_id, session.config.width
        pad = getattr(session.model, "pads_drafts", True)  # D̄ padded to W slots (Appendix D.1) or as it is
        draft: list[int] = []  # D_0 = empty (Algorithm 1 line 1)
        stored_q = []  # Q_0 = empty (Algorithm 2 line 1)
        first = True
        while not session.finished:  # line 2
            session.begin()
            before, old_draft = len(session.prefix), tuple(draft)
            if first:  # Appendix E.2: prefill + W + 1 masks
                layout = prefill_layout(session.prefix, width + 1, mask_id)
            else:
                layout = packed_layout(session.prefix[-1], draft, width, session.cached, mask_id, pad=pad)
            logits = session.call(layout, layout.verify_rows + layout.draft_rows)  # lines 3-4, one call
            n_verify = len(layout.verify_rows)
            verdict, v, v_probs = session.verify(draft, stored_q, logits[:n_verify])  # lines 5-6
            tokens, sources = session.verdict_tokens(draft, verdict)  # line 6: C_t, A_t = h_t + 1
            if first:
                sources = [SOURCE_PREFILL]
            appended, sources = session.commit(tokens, sources)  # lines 7-9
            a = len(appended)
            q_logits = logits[n_verify:]
            proposals = list(q_logits.top)  # z_t (the drafter's argmax, shown for every slot)
            kept: tuple[int, ...] = ()
            if not session.finished:  # line 10: D_t = z_t^(a+1..W); Alg. 2 line 12 samples them now
                draft, stored_q = session.propose(q_logits[a:])
                proposals[a:] = draft
                kept = tuple(range(a, len(proposals)))
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=old_draft,
                                 verifier_tokens=v, verifier_probs=v_probs, accept_probs=verdict.accept_probs,
                                 proposals=tuple(proposals), proposal_start=before, kept=kept,
                                 h=verdict.h, advance=verdict.h + 1,
                                 appended=tuple(appended), appended_sources=tuple(sources))
            first = False
