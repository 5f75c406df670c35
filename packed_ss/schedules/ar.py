"""Plain autoregressive decoding: the reference every speculative schedule must reproduce.

Iteration 1 prefills the prompt and takes the first token from its last row; every later iteration
is one causal call over the last prefix token (one row), the cache holding everything before it.
"""

from __future__ import annotations

from collections.abc import Iterator

from packed_ss.layout import prefill_layout, verify_layout
from packed_ss.records import SOURCE_AR, SOURCE_PREFILL, IterationRecord
from packed_ss.schedules.base import Session


class AR:
    name = "ar"
    title = "Autoregressive"
    summary = "One causal call per token; the reference output."

    @staticmethod
    def max_rows(prompt_len: int, config) -> int:
        """Most rows a run can evaluate: the prefill (n rows), then one row per further token."""
        return prompt_len + (config.max_new_tokens - 1)

    def iterate(self, session: Session) -> Iterator[IterationRecord]:
        source = SOURCE_PREFILL
        while not session.finished:
            session.begin()
            before = len(session.prefix)
            if before == session.prompt_len:
                layout = prefill_layout(session.prefix, 0, session.model.mask_token_id)
            else:
                layout = verify_layout([session.prefix[-1]], [], session.cached, name="ar")
            logits = session.call(layout, layout.verify_rows)
            verdict, v, v_probs = session.verify([], [], logits)  # empty draft: the token comes from p
            appended, sources = session.commit([verdict.token], [source])
            session.rollback(len(session.prefix) - 1)
            yield session.record(prefix_len_before=before, prefix_len_after=len(session.prefix),
                                 verifier_tokens=v, verifier_probs=v_probs,
                                 appended=tuple(appended), appended_sources=tuple(sources))
            source = SOURCE_AR
