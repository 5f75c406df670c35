"""Prompt lookup: drafts copied from the text so far (n-gram matching), no drafter; the peer to beat.

The draft for the next positions is what followed the earliest earlier occurrence of the last n tokens
of the prefix (n from :data:`MAX_NGRAM` down to 1), at most W tokens, as transformers' prompt-lookup
decoding does. One causal call ``[P^(n), d^(1..|D|)]`` verifies it (Algorithm 1/2 acceptance); without
a match the call is a single AR row. The draft is a deterministic function of the prefix, so at T > 0
its Q is a point mass on each drafted token: a draft token d is accepted with probability p(d) and a
rejection samples the residual p with d removed, which keeps the output distribution exactly AR's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from packed_ss.layout import prefill_layout, verify_layout
from packed_ss.records import SOURCE_PREFILL, IterationRecord
from packed_ss.sampling import SparseDist
from packed_ss.schedules.base import Session

MAX_NGRAM = 2  # longest suffix matched (transformers' max_matching_ngram_size default)


def ngram_draft(sequence: Sequence[int], width: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``width`` tokens that followed the earliest earlier match of the sequence's last n tokens,
    trying n = ``max_ngram`` .. 1; empty when nothing matches.

    Pure: ``sequence`` is the verified prefix (prompt included), token ids.
    """
    length = len(sequence)
    for n in range(min(max_ngram, length - 1), 0, -1):
        suffix = list(sequence[-n:])
        for start in range(length - n):  # earliest first; the suffix itself is never its own match
            if list(sequence[start:start + n]) == suffix:
                follow = list(sequence[start + n:start + n + width])
                if follow:
                    return follow
    return []


class PromptLookup:
    name = "lookup"
    title = "Prompt lookup"
    summary = "Drafts copied from the text so far (n-gram match), verified in one causal call; no drafter."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prefill, then at most L - 1 calls of up to B rows."""
        return prompt_len + (config.max_new_tokens - 1) * config.block_size

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        width = session.config.width
        # Iteration 1: prefill; the first token has no draft to verify.
        session.begin()
        layout = prefill_layout(session.prefix, 0, session.model.mask_token_id)
        verdict, v, v_probs = session.verify([], [], session.call(layout, layout.verify_rows))
        appended, sources = session.commit([verdict.token], [SOURCE_PREFILL])
        session.rollback(len(session.prefix) - 1)
        yield session.record(prefix_len_before=session.prompt_len, prefix_len_after=len(session.prefix),
                             verifier_tokens=v, verifier_probs=v_probs, advance=1,
                             appended=tuple(appended), appended_sources=tuple(sources))
        while not session.finished:
            session.begin()
            before, last = len(session.prefix), session.prefix[-1]
            draft = ngram_draft(session.prefix, width)
            stored_q = [] if session.config.greedy else [SparseDist.point(t) for t in draft]  # Q: point masses
            layout = verify_layout([last], draft, session.cached, name="lookup-verify")
            verdict, v, v_probs = session.verify(draft, stored_q, session.call(layout, layout.verify_rows))
            tokens, sources = session.verdict_tokens(draft, verdict)
            appended, sources = session.commit(tokens, sources)
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 old_draft=tuple(draft), verifier_tokens=v, verifier_probs=v_probs,
                                 accept_probs=verdict.accept_probs, h=verdict.h, advance=verdict.h + 1,
                                 appended=tuple(appended), appended_sources=tuple(sources))
