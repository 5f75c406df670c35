"""Packed-SS: verify the old draft and draft the next one in the same call (paper Algorithms 1-2).

Call t reads P_{t-1} and D_{t-1}: its causal half ``[P^(n), D̄]`` gives the verifier distributions
p^(1..|D|+1), its diffusion half ``[P^(n), MASK x W]`` gives the proposals Z_t conditioned on P_{t-1}
alone (Equation 3). After A tokens are appended, the first A proposals are discarded and the rest form
D_t (Equation 4). Iteration 1 prefills the prompt and drafts W + 1 positions (Appendix E.2), so the
first regular call already has a full draft. One call and 2B rows per iteration.

How D_t is formed from the call's drafter rows is the one step a variant may change
(:meth:`PackedSS.drafting`, :class:`Drafting`); :mod:`packed_ss.schedules.packed_mixed` adds n-gram tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from packed_ss.iteration import CallLogits
from packed_ss.layout import packed_layout, prefill_layout, verify_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
from packed_ss.sampling import SparseDist
from packed_ss.schedules.base import Session


@dataclass(frozen=True)
class NextDraft:
    """D_t and what the iteration record shows about it.

    ``draft`` token ids from position |P_t| on; ``stored_q`` their Q (empty when greedy); ``kept`` indices
    into the call's proposals z_t that became draft tokens; ``shown`` the proposals to display (the drawn
    tokens at T > 0); ``sources`` one source name per draft token (empty: all from the drafter).
    """

    draft: list[int]
    stored_q: list[SparseDist]
    kept: tuple[int, ...]
    shown: tuple[int, ...]
    sources: tuple[str, ...] = ()


class Drafting:
    """Algorithm 1 line 10 / Algorithm 2 line 12: D_t = z_t^(A+1..W), drawn from q at T > 0."""

    def wants_proposals(self) -> bool:
        """Whether the next call needs its diffusion half (always, for Packed-SS)."""
        return True

    def next(self, session: Session, q_rows: CallLogits, a: int, h: int) -> NextDraft:
        """D_t from the drafter rows q_rows (W or W + 1 of them) after A = ``a`` tokens were appended and
        h = ``h`` draft tokens accepted."""
        draft, stored_q = session.propose(q_rows[a:])
        shown = q_rows.top[:a] + tuple(draft)
        return NextDraft(draft, stored_q, tuple(range(a, len(shown))), shown)


class PackedSS:
    name = "packed"
    title = "Packed-SS"
    summary = "One call verifies the old draft and drafts from the old prefix; 2B rows per call."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: prefill + B masks, then at most L - 1 calls of 2B rows (Table 2)."""
        b = config.block_size
        return prompt_len + b + (config.max_new_tokens - 1) * 2 * b

    @staticmethod
    def drafter_width(config) -> int:
        """Masks in each call's diffusion half: W (the variant with n-gram drafts may use fewer)."""
        return config.width

    def drafting(self, session: Session) -> Drafting:
        """The per-run rule that forms each next draft."""
        return Drafting()

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        mask_id, width = session.model.mask_token_id, session.config.width
        masks = self.drafter_width(session.config)
        pad = getattr(session.model, "pads_drafts", True)  # D̄ padded to W slots (Appendix D.1) or as it is
        rule = self.drafting(session)
        draft: list[int] = []  # D_0 = empty (Algorithm 1 line 1)
        stored_q = []  # Q_0 = empty (Algorithm 2 line 1)
        sources: tuple[str, ...] = ()
        first = True
        while not session.finished:  # line 2
            session.begin()
            before, old_draft, old_sources = len(session.prefix), tuple(draft), sources
            if first:  # Appendix E.2: prefill + W + 1 masks
                layout = prefill_layout(session.prefix, masks + 1, mask_id)
            elif not rule.wants_proposals():  # a variant may skip the diffusion half: a causal call alone
                layout = verify_layout([session.prefix[-1]], draft, session.cached, name="packed-verify")
            else:
                layout = packed_layout(session.prefix[-1], draft, width, session.cached, mask_id, pad=pad,
                                       drafter_width=masks)
            logits = session.call(layout, layout.verify_rows + layout.draft_rows)  # lines 3-4, one call
            n_verify = len(layout.verify_rows)
            verdict, v, v_probs = session.verify(draft, stored_q, logits[:n_verify])  # lines 5-6
            tokens, appended_sources = session.verdict_tokens(draft, verdict)  # line 6: C_t, A_t = h_t + 1
            if first:
                appended_sources = [SOURCE_PREFILL]
            appended, appended_sources = session.commit(tokens, appended_sources)  # lines 7-9
            q_rows = logits[n_verify:]
            nxt = NextDraft([], [], (), q_rows.top)  # z_t (the drafter's argmax, shown for every slot)
            if not session.finished:  # line 10
                nxt = rule.next(session, q_rows, len(appended), verdict.h)
            draft, stored_q, sources = nxt.draft, nxt.stored_q, nxt.sources
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=old_draft, old_draft_sources=old_sources,
                                 verifier_tokens=v, verifier_probs=v_probs, accept_probs=verdict.accept_probs,
                                 proposals=nxt.shown, proposal_start=before, kept=nxt.kept,
                                 h=verdict.h,
                                 appended=tuple(appended), appended_sources=tuple(appended_sources),
                                 next_draft=tuple(draft) if sources else (), next_draft_sources=sources)
            first = False
