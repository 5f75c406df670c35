"""The state every schedule shares: verified prefix, calls, stopping rule and cache rollback.

A schedule is a generator over a :class:`Session`: it builds each call's layout, reads the logits,
and hands the tokens it accepts to :meth:`Session.commit`, which applies the stopping rule of
Algorithm 1 lines 7-8 (EOS, new-token limit, stop strings). :meth:`Session.rollback` trims the cache
to the verified prefix minus its last token and checks that only verified causal rows stay in it.

Shape legend: V vocabulary, R rows, W speculative width.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

import numpy as np
import torch

from packed_ss.config import DecodeConfig
from packed_ss.layout import PREFILL, VERIFY, CallLayout, prefill_layout, verify_layout
from packed_ss.records import (SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, SOURCE_PREFILL, CallRecord,
                               IterationRecord)
from packed_ss.iteration import CallLogits, PromptError, close_iteration
from packed_ss.sampling import SparseDist, Verdict, sample_rows, verify_greedy, verify_sampled


class Session:
    """Mutable state of one run. Created per run; never shared between runs or users.

    Attributes:
        prefix: P, verified token ids (prompt included).
        prompt_len: |P_0| in tokens.
        generator: seeded CPU ``torch.Generator`` for every random draw of the run.
        stop_reason: ``None`` while running, else ``"eos"``, ``"limit"`` or ``"stop string"``.
    """

    def __init__(self, model, prompt_ids: list[int], config: DecodeConfig, schedule: str = ""):
        if not prompt_ids:
            raise PromptError("the prompt is empty (it has no tokens for this model)")
        needed = len(prompt_ids) + config.max_new_tokens + 2 * config.block_size
        if needed > model.max_length:
            raise PromptError(
                f"prompt of {len(prompt_ids)} token{'s' if len(prompt_ids) != 1 else ''} + "
                f"{config.max_new_tokens} new tokens + 2 blocks of "
                f"{config.block_size} exceeds the model's {model.max_length} positions")
        if config.drafter_lora and getattr(model, "drafter_lora", None) is None:
            why = getattr(model, "adapter_note", None)
            raise PromptError("the drafter LoRA is on but this model has no drafter adapter"
                              + (f" ({why})" if why else "") + ": turn the drafter LoRA off")
        self.model = model
        self.config = config
        self.schedule = schedule
        self.prefix = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.stop_reason: str | None = None
        self.iteration = 0
        self._calls: list[CallRecord] = []
        self._started = 0.0
        self._cut = 0  # tokens the stopping rule left out of this iteration's commit (IterationRecord.cut)
        self._last_layout: CallLayout | None = None
        self._deferred: torch.Tensor | None = None  # hidden states (or logits) of the last call's deferred rows
        self._deferred_rows: tuple[int, ...] = ()
        # Ids no distribution may give probability to (the mask token at least): their logits are set to
        # -inf as each call returns, so greedy picks, proposals, p, Q and residuals never contain them.
        never = getattr(model, "never_emit_ids", (model.mask_token_id,))
        self._never_emit = torch.tensor(sorted(set(never)), dtype=torch.long)
        model.reset(needed, config.block_size)  # a static cache is sized for the whole run

    # --- bookkeeping ------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    @property
    def generated(self) -> int:
        return len(self.prefix) - self.prompt_len

    @property
    def cached(self) -> int:
        return self.model.cache_length

    def begin(self) -> None:
        """Start timing an iteration."""
        self.iteration += 1
        self._calls = []
        self._cut = 0
        self._started = time.perf_counter()

    def call(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...] = ()) -> CallLogits:
        """Run one model call (one NFE); returns the logits (len(rows), V) of ``rows`` and their argmax.

        ``deferred`` rows are computed in the same call, but their logits are only produced by
        :meth:`deferred_logits` for the ones the schedule needs (the LM head time joins this call's).
        """
        self._deferred, self._deferred_rows = None, deferred
        # Appendix F.2: the drafter adapter updates proposal rows only; verifier rows stay the base model's.
        adapter = dict(adapter_rows=layout.proposal_rows) if self.config.drafter_lora else {}
        if deferred and getattr(self.model, "supports_deferred_rows", False):
            out = self.model.forward(layout, rows, deferred, **adapter)
            self._deferred = out.deferred
            logits = out.logits
        else:
            out = self.model.forward(layout, rows + deferred, **adapter)
            logits = out.logits[: len(rows)]
            if deferred:
                self._deferred = out.logits[len(rows):]
        selected = len(layout.proposal_rows) if adapter else 0
        self._calls.append(CallRecord(layout, out.model_ms, selected, layout.rows if selected else 0,
                                      getattr(out, "recorded_ms", 0.0)))
        self._last_layout = layout
        return CallLogits.of(logits, self._never_emit).warped(self.config)

    def deferred_logits(self, start: int, stop: int) -> CallLogits:
        """Logits (stop - start, V), argmax and (T > 0) warped distributions of deferred rows ``[start, stop)``
        of the last call (indices into its ``deferred`` tuple).
        Raises: ValueError when the last call deferred no such rows."""
        if self._deferred is None or not 0 <= start < stop <= len(self._deferred_rows):
            raise ValueError(f"the last call deferred {len(self._deferred_rows)} rows, asked for [{start}, {stop})")
        if not getattr(self.model, "supports_deferred_rows", False):
            return CallLogits.of(self._deferred[start:stop], self._never_emit).warped(self.config)  # already logits
        out = self.model.head(self._deferred[start:stop])
        last = self._calls[-1]
        self._calls[-1] = replace(last, model_ms=last.model_ms + out.model_ms)
        return CallLogits.of(out.logits, self._never_emit).warped(self.config)

    def record(self, **fields) -> IterationRecord:
        """Close the iteration: wall time since :meth:`begin`, split into model and non-model time, and the
        tokens :meth:`commit` cut (``IterationRecord.cut``)."""
        return close_iteration(self.iteration, self.schedule, self._calls, self._started, self.stop_reason,
                               cut=self._cut, **fields)

    # --- token selection ------------------------------------------------------------------------
    def verify(self, draft: list[int], stored_q: list[SparseDist], rows: CallLogits):
        """Verify ``draft`` against verifier rows (>= |D| + 1, aligned from the first draft slot).

        Returns: ``(verdict, v, v_probs)``: v is the argmax of every row (reached or not), v_probs the
        warped probability of each v at T > 0 (empty when greedy).
        """
        if self.config.greedy:  # Algorithm 1 lines 3, 5-6
            return verify_greedy(draft, rows.top), rows.top, ()
        p = rows.probs  # Algorithm 2 lines 3, 5-7 (warped once per call; its argmax is the logits' top)
        verdict = verify_sampled(draft, stored_q, p[: len(draft) + 1], self.generator)
        return verdict, rows.top, tuple(p[np.arange(len(p)), list(rows.top)].tolist())

    def propose(self, rows: CallLogits) -> tuple[list[int], list[SparseDist]]:
        """Draft tokens from drafter rows (R of them), with the distributions Q they were drawn from.

        Greedy: argmax tokens and no stored Q (a point mass is implied, Section 3.2). T > 0: one draw
        per row from the warped q (top-k/top-p applied), Q kept as its non-zero entries.
        """
        if self.config.greedy:
            return list(rows.top), []
        q = rows.probs  # warped once per call
        stored = [SparseDist.from_dense(row) for row in q]
        return sample_rows(q, self.generator), stored

    def confidence(self, rows: CallLogits) -> list[float]:
        """Drafter confidence of each row: max_x q(x), from the softmax of the logits when greedy, from the
        warped q the row's token is drawn from at T > 0 (never from the drawn token itself)."""
        if not len(rows):
            return []
        if self.config.greedy:
            return torch.softmax(rows.logits.double(), -1).amax(-1).tolist()
        return rows.probs.max(-1).tolist()

    @staticmethod
    def verdict_tokens(draft: list[int], verdict: Verdict) -> tuple[list[int], list[str]]:
        """C_t = (d^(1..h), correction or bonus) and the source of each (Algorithm 1 line 6)."""
        last = SOURCE_BONUS if verdict.is_bonus else SOURCE_CORRECTION
        return draft[: verdict.h] + [verdict.token], [SOURCE_DRAFT] * verdict.h + [last]

    def first_token(self) -> IterationRecord:
        """Iteration 1 of a schedule that drafts only after the prefill (Linear-SS, prompt lookup): prefill
        the prompt causally and take the first token from its last row (no draft to verify)."""
        self.begin()
        layout = prefill_layout(self.prefix, 0, self.model.mask_token_id)
        verdict, v, v_probs = self.verify([], [], self.call(layout, layout.verify_rows))
        appended, sources = self.commit([verdict.token], [SOURCE_PREFILL])
        self.rollback(len(self.prefix) - 1)
        return self.record(prefix_len_before=self.prompt_len, prefix_len_after=len(self.prefix),
                           verifier_tokens=v, verifier_probs=v_probs, appended=tuple(appended), appended_sources=tuple(sources))

    def verify_in_causal_call(self, draft: list[int], stored_q: list[SparseDist], before: int,
                              name: str) -> IterationRecord:
        """Check ``draft`` in one causal call ``[P^(n), d^(1..|D|)]`` (Algorithm 1/2 lines 3-9), commit,
        roll back and close the iteration (``before`` = |P_{t-1}|). Linear-SS's second call; prompt lookup's
        only one."""
        layout = verify_layout([self.prefix[-1]], draft, self.cached, name=name)
        verdict, v, v_probs = self.verify(draft, stored_q, self.call(layout, layout.verify_rows))
        tokens, sources = self.verdict_tokens(draft, verdict)
        appended, sources = self.commit(tokens, sources)
        self.rollback(len(self.prefix) - 1)
        return self.record(prefix_len_before=before, prefix_len_after=len(self.prefix), old_draft=tuple(draft),
                           verifier_tokens=v, verifier_probs=v_probs, accept_probs=verdict.accept_probs,
                           h=verdict.h, appended=tuple(appended),
                           appended_sources=tuple(sources))

    # --- stopping and the cache -----------------------------------------------------------------
    def commit(self, tokens: list[int], sources: list[str]) -> tuple[list[int], list[str]]:
        """Append accepted tokens, pruned by the stopping index (Algorithm 1 lines 7-9).

        a = min(A, L - generated, first EOS, end of the first completed stop string); the A - a tokens left
        out are the iteration's ``cut``.
        Returns: the tokens actually appended and their sources.
        """
        a = min(len(tokens), self.config.max_new_tokens - self.generated)
        reason = "limit" if a == self.config.max_new_tokens - self.generated else None
        eos = self.model.eos_token_id
        if eos is not None and eos in tokens[:a]:
            a, reason = tokens.index(eos) + 1, "eos"
        if self.config.stop_strings:
            a, reason = self._stop_string_cut(tokens, a, reason)
        self.prefix.extend(tokens[:a])
        self.stop_reason = reason
        self._cut = len(tokens) - a
        return tokens[:a], sources[:a]

    def _stop_string_cut(self, tokens: list[int], a: int, reason: str | None) -> tuple[int, str | None]:
        """Shorten ``a`` to the token that completes a stop string (Appendix E.2: whole string accepted)."""
        generated = self.prefix[self.prompt_len:]
        for k in range(1, a + 1):
            text = self.model.decode(generated + tokens[:k])
            if any(s in text for s in self.config.stop_strings):
                return k, "stop string"
        return a, reason

    def rollback(self, keep: int) -> None:
        """Trim the cache to its first ``keep`` tokens after the iteration's last call.

        Checks that every kept row of the last call is a causal row holding a verified token at its
        own position, so rejected drafts and drafter rows can never stay in the cache.
        Raises: AssertionError on a misaligned rollback (an engine bug, not a user error).
        """
        layout = self._last_layout
        new = keep - layout.cached
        assert keep <= len(self.prefix) - 1, "the cache must not hold the last prefix token"
        assert 0 <= new <= layout.rows, f"keep {keep} outside the last call ({layout.cached}+{layout.rows})"
        assert list(layout.token_ids[:new]) == self.prefix[layout.cached:keep], "cache rows are not the prefix"
        assert all(r in (PREFILL, VERIFY) for r in layout.regions[:new]), "non-causal rows would be cached"
        self.model.rollback(keep)


class Schedule(Protocol):
    """One decoding schedule: a generator yielding one :class:`IterationRecord` per iteration."""

    name: str
    title: str
    summary: str

    def iterate(self, session: Session) -> Iterator[IterationRecord]: ...

    def max_rows(self, prompt_len: int, config: DecodeConfig) -> int:
        """Upper bound on the rows (tokens evaluated by the model, Table 2) of one whole run: the work
        bound a server checks before it accepts a request."""
        ...
