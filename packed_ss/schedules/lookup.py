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

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from packed_ss.records import IterationRecord
from packed_ss.sampling import SparseDist
from packed_ss.schedules.base import Session

MAX_NGRAM = 2  # longest suffix matched (transformers' max_matching_ngram_size default)


def ngram_match(sequence: Sequence[int], width: int, max_ngram: int = MAX_NGRAM) -> tuple[list[int], int]:
    """Up to ``width`` tokens that followed the earliest earlier match of the sequence's last n tokens,
    trying n = ``max_ngram`` .. 1, and that n (the match length); ``([], 0)`` when nothing matches.

    Pure: ``sequence`` is the verified prefix (prompt included), token ids.
    """
    tokens = np.asarray(sequence, dtype=np.int64)
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), 0, -1):
        # Windows starting at 0..length-n-1 (the suffix itself is never its own match); a match at the
        # last of them is followed by nothing but the suffix's tail, so it still yields tokens.
        windows = sliding_window_view(tokens[:-1], n)  # (length - n, n)
        hits = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if len(hits):
            start = int(hits[0])  # earliest first
            return tokens[start + n:start + n + width].tolist(), n
    return [], 0


def ngram_draft(sequence: Sequence[int], width: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """The tokens of :func:`ngram_match` (the prompt-lookup draft)."""
    return ngram_match(sequence, width, max_ngram)[0]


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
        yield session.first_token()  # iteration 1: prefill; the first token has no draft to verify
        while not session.finished:
            session.begin()
            before = len(session.prefix)
            draft = ngram_draft(session.prefix, width)
            stored_q = [] if session.config.greedy else [SparseDist.point(t) for t in draft]  # Q: point masses
            yield session.verify_in_causal_call(draft, stored_q, before, "lookup-verify")
