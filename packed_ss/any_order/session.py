"""State of an any-order run: accepted tokens by output position, the end position E, the cache, stopping.

Paper Appendix C (Algorithm 3) and E.2. Output positions are absolute (the first generated token sits at
the prompt length n); a run fills positions n..E, where E starts at n + L - 1 and moves to the position
of an accepted EOS or of the last token of a completed stop string, whichever ends earliest. Tokens are
accepted in any order; the KV cache holds the prompt and processed accepted tokens in acceptance order
(each computed seeing the tokens accepted before it), which is exactly the context Equation 8 conditions on.

Context crop (SetDLM checkpoints, ``model.context_length``): a call that would make the cache and its rows
exceed SetDLM's context first drops the oldest cached tokens, as SetDLM's decoder does
(``src/denoiser/setdlm.py`` ``_prepare_inputs_inference``, "crop KV cache if we would exceed model
context"); the iteration record's ``cropped`` counts them. A first call whose prompt alone leaves no room is
refused (SetDLM prefills the prompt in a call of its own and would crop the prompt's first tokens).

Shape legend: u unresolved positions in the window, W speculative width.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import torch

from packed_ss.config import DecodeConfig
from packed_ss.layout import PREFILL, CallLayout
from packed_ss.records import (SOURCE_BONUS, SOURCE_CORRECTION, SOURCE_DRAFT, SOURCE_PREFILL, CallRecord,
                               IterationRecord)
from packed_ss.iteration import CallLogits, PromptError, close_iteration

LTR, CONFIDENCE = "ltr", "confidence"  # order policies (DecodeConfig.order)


def confidence_order(positions: list[int], scores: dict[int, float]) -> tuple[int, ...]:
    """pi_t by confidence (paper E.6): decreasing score, ties by position; positions without a finite
    score last, in textual order. ``positions`` are the window's unresolved positions."""
    scored = sorted((p for p in positions if math.isfinite(scores.get(p, math.nan))), key=lambda p: (-scores[p], p))
    rest = sorted(p for p in positions if not math.isfinite(scores.get(p, math.nan)))
    return tuple(scored + rest)


class OrderSession:
    """Mutable state of one any-order run (one per run, never shared).

    Attributes:
        prompt: prompt token ids; prompt_len n.
        filled: accepted tokens, output position -> token id.
        accepted: accepted positions in acceptance order (P_t's order).
        end: E, the last output position to fill (absolute).
        pending: N, accepted (position, token) pairs not yet processed as inputs.
        stop_reason: None while running, else ``"eos"``, ``"stop string"`` or ``"limit"``.
    """

    def __init__(self, model, prompt_ids: list[int], config: DecodeConfig, schedule: str = ""):
        if not prompt_ids:
            raise PromptError("the prompt is empty (it has no tokens for this model)")
        if not getattr(model, "any_order", False):
            raise PromptError(f"{schedule or 'this schedule'} needs an any-order model (config any_order: true), "
                              f"e.g. assets/model-anyorder")
        if not config.greedy:
            raise PromptError("any-order verification is greedy (Algorithm 3): set the temperature to 0")
        needed = len(prompt_ids) + config.max_new_tokens
        if needed > model.max_length:
            raise PromptError(f"prompt of {len(prompt_ids)} tokens + {config.max_new_tokens} new tokens exceeds "
                              f"the model's {model.max_length} positions")
        self.model = model
        self.config = config
        self.schedule = schedule
        self.prompt = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.filled: dict[int, int] = {}
        self.sources: dict[int, str] = {}
        self.accepted: list[int] = []
        self.end = self.prompt_len + config.max_new_tokens - 1
        self.left = self.prompt_len  # the leftmost unresolved position (l of Algorithm 3 line 3)
        self.pending: list[tuple[int, int]] = []
        self.in_cache: list[int] = []  # output positions whose tokens the cache holds, in cache order
        self.stop_reason: str | None = None
        self.halted = False  # a schedule ended the run before E (SetDLM's stop rule, or its step budget)
        self.context = getattr(model, "context_length", None)  # SetDLM's context: the cache is cropped to fit it
        self.cropped = 0  # oldest cache entries dropped so far (the cache is (prompt + in_cache)[cropped:])
        self._cropped_now = 0
        self.iteration = 0
        self._calls: list[CallRecord] = []
        self._started = 0.0
        self._new: list[int] = []  # positions this iteration filled (before any cut)
        self._last: CallLayout | None = None
        never = getattr(model, "never_emit_ids", (model.mask_token_id,))
        self._never_emit = torch.tensor(sorted(set(never)), dtype=torch.long)
        model.reset(needed + 2 * config.block_size, config.block_size)  # a static cache is sized for the run

    # --- the window ---------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        """Every position up to E is filled (Algorithm 3 line 2), or a schedule halted the run."""
        return self.halted or self.left > self.end

    def window(self) -> list[int]:
        """U_t: unresolved positions of {l, ..., min(E, l + W - 1)}, l the leftmost unresolved (lines 3-4)."""
        last = min(self.end, self.left + self.config.width - 1)
        return [j for j in range(self.left, last + 1) if j not in self.filled]

    def text_order(self) -> tuple[int, ...]:
        """The filled output, positions n..E in textual order (Algorithm 3 line 18)."""
        return tuple(self.filled[j] for j in sorted(self.filled))

    # --- calls --------------------------------------------------------------------------------
    def begin(self) -> None:
        self.iteration += 1
        self._calls = []
        self._new = []
        self._cropped_now = 0
        self._started = time.perf_counter()

    def call(self, layout: CallLayout, rows: tuple[int, ...]) -> CallLogits:
        """One model call (one NFE): logits (len(rows), V) of ``rows`` with their argmax. The cache is cropped
        first when the call would exceed the model's context (module docstring)."""
        layout = self._fit(layout)
        out = self.model.forward(layout, rows)
        self._calls.append(CallRecord(layout, out.model_ms, recorded_ms=getattr(out, "recorded_ms", 0.0)))
        self._last = layout
        return CallLogits.of(out.logits, self._never_emit)

    def _fit(self, layout: CallLayout) -> CallLayout:
        """``layout`` after dropping the oldest cached tokens so that cache + rows fit ``self.context``.

        Raises: PromptError when the prompt's own call does not fit, or the rows alone leave no cache.
        """
        overflow = layout.cached + layout.rows - (self.context or math.inf)
        if overflow <= 0:
            return layout
        if PREFILL in layout.regions or overflow >= layout.cached:
            raise PromptError(f"a call of {layout.rows} rows after {layout.cached} cached tokens exceeds the "
                              f"model's context of {self.context} tokens (SetDLM's config length); shorten the "
                              f"prompt or the window")
        self.model.crop_left(overflow)
        self.cropped += overflow
        self._cropped_now += overflow
        return replace(layout, cached=layout.cached - overflow)

    def settle(self, cached_new: list[tuple[int, int]]) -> None:
        """Cache update after a call (Appendix D.2): keep the rows of N and of ``cached_new`` (the accepted
        O rows, which directly follow N), drop the rest (masks, rejected and unchecked draft tokens)."""
        layout = self._last
        n0 = layout.regions.count(PREFILL)
        fresh = [j for j, _ in self.pending] + [j for j, _ in cached_new]
        keep = layout.cached + n0 + len(fresh)
        assert list(layout.position_ids[n0: n0 + len(fresh)]) == fresh, "kept rows are not N and accepted O"
        self.model.rollback(keep)
        self.in_cache += fresh
        self.pending = []

    # --- acceptance and stopping (Algorithm 3 lines 10-13, E.2) ------------------------------------
    def accept(self, pairs: list[tuple[int, int]], sources: list[str]) -> tuple[list[int], list[int]]:
        """Add C_t (position, token) pairs in rank order; move E on EOS or a completed stop string (the
        earliest ending one) and drop pairs past E (lines 11-12).

        Returns: ``(appended, dropped)``: positions added (rank order, after the cut) and previously
        accepted positions removed because E moved before them.
        """
        self.commit(pairs, sources)
        new = [j for j, _ in pairs]
        end, reason = self.stop_point(pairs)
        dropped = self.cut(end, reason) if end < self.end else []
        appended = [j for j in new if j <= self.end]
        return appended, [j for j in dropped if j not in new]

    def commit(self, pairs: list[tuple[int, int]], sources: list[str]) -> None:
        """Fill the (position, token) ``pairs`` and move l past filled positions; no end marker is looked for."""
        for (j, t), s in zip(pairs, sources):
            self._new.append(j)
            self.filled[j] = t
            self.sources[j] = s
            self.accepted.append(j)
        while self.left in self.filled:  # E only moves to a filled position, so l stays the leftmost open one
            self.left += 1

    def stop_point(self, pairs: list[tuple[int, int]]) -> tuple[int, str | None]:
        """(E, reason) after the filled ``pairs``: the earliest EOS among them or last position of a stop string
        they complete (E.2), else the current E and None."""
        end, reason = self.end, None
        eos = self.model.eos_token_id
        hits = [j for j, t in pairs if eos is not None and t == eos and j <= end]
        if hits:
            end, reason = min(hits), "eos"
        marker = self._stop_string_end([j for j, _ in pairs])
        if marker is not None and marker < end:
            end, reason = marker, "stop string"
        return end, reason

    def cut(self, end: int, reason: str | None) -> list[int]:
        """Move E to ``end`` (at most the current E), dropping accepted positions past it and, while the run goes
        on, their cache entries; returns the dropped positions (acceptance order)."""
        self.end = min(self.end, end)
        self.stop_reason = reason or self.stop_reason
        dropped = [j for j in self.accepted if j > self.end]
        for j in dropped:
            del self.filled[j]
            del self.sources[j]
        self.accepted = [j for j in self.accepted if j <= self.end]
        if dropped and not self.finished and any(j in self.in_cache for j in dropped):
            self._forget(set(dropped))  # a finished run makes no further call: its cache needs no repair
        return dropped

    def halt(self, reason: str) -> None:
        """End the run now, open positions before E left unfilled (SetDLM returns its committed tokens
        without the masks still open)."""
        self.halted = True
        self.stop_reason = self.stop_reason or reason

    def _forget(self, dropped: set[int]) -> None:
        """Remove dropped positions from the cache: crop it before the first one and queue the surviving
        later tokens again as N, so every cached token was computed seeing only tokens of P_t."""
        first = next(i for i, j in enumerate(self.in_cache) if j in dropped)
        survivors = [j for j in self.in_cache[first:] if j not in dropped]
        if self.prompt_len + first < self.cropped:
            raise PromptError("an end marker dropped a token whose cache entry was already cropped to fit the "
                              "model's context")
        self.model.rollback(self.prompt_len + first - self.cropped)
        self.in_cache = self.in_cache[:first]
        self.pending = [(j, self.filled[j]) for j in survivors] + [p for p in self.pending if p[0] in self.filled]

    def _stop_string_end(self, new: list[int]) -> int | None:
        """Earliest last position of a stop string completed by the new positions, all of its tokens
        accepted (E.2): searched in each run of consecutive filled positions that holds a new one."""
        if not self.config.stop_strings or not new:
            return None
        best = None
        for j in sorted(set(new)):
            start = j
            while start - 1 >= self.prompt_len and start - 1 in self.filled:
                start -= 1
            stop = j
            while stop + 1 in self.filled:
                stop += 1
            for k in range(j, stop + 1):
                text = self.model.decode([self.filled[i] for i in range(start, k + 1)])
                if any(s in text for s in self.config.stop_strings):
                    best = k if best is None else min(best, k)
                    break
        return best

    def record(self, appended: list[int] = (), dropped: list[int] = (), **fields) -> IterationRecord:
        """Close the iteration (times as :meth:`packed_ss.schedules.base.Session.record`); ``appended`` and
        ``dropped`` are the positions :meth:`conclude` returned (or the positions an end marker removed). The
        record's ``cut`` counts the positions this iteration filled that the end marker removed again; its
        ``dropped_positions`` only earlier iterations' positions, so that the output holds the sum of the
        records' A_t less the sum of their dropped positions."""
        stop = (self.stop_reason or "limit") if self.finished else None
        mine = set(self._new)
        return close_iteration(self.iteration, self.schedule, self._calls, self._started, stop,
                               prefix_len_after=self.prompt_len + len(self.filled),
                               appended=tuple(self.filled[j] for j in appended),
                               appended_sources=tuple(self.sources[j] for j in appended),
                               appended_positions=tuple(appended),
                               dropped_positions=tuple(j for j in dropped if j not in mine),
                               cut=len(self._new) - len(appended), cropped=self._cropped_now, **fields)

    def conclude(self, pairs: list[tuple[int, int]], sources: list[str], h: int) -> tuple[list[int], list[int]]:
        """After a verifying call: cache N and the h accepted draft tokens, accept C_t = ``pairs`` (lines
        10-13) and queue the correction, if any, as the next call's N. Returns :meth:`accept`'s
        ``(appended, dropped)``."""
        self.settle(pairs[:h])
        appended, dropped = self.accept(pairs, sources)
        if h < len(pairs) and pairs[h][0] in self.filled:
            self.pending.append(pairs[h])  # the correction enters the cache in the next call
        return appended, dropped

    def order_scores(self, rows: CallLogits | None, positions: dict[int, int]) -> dict[int, float]:
        """E.6 scores for the next order: position -> max_x softmax of its row (``positions`` maps each
        position to its row index in ``rows``). Empty under the ltr policy, which never reads them (no
        softmax on the decoding path then)."""
        if self.config.order != CONFIDENCE or rows is None or not positions:
            return {}
        probs = self.top_probs(rows)
        return {j: probs[r] for j, r in positions.items()}

    @staticmethod
    def top_probs(rows: CallLogits) -> list[float]:
        """max_x softmax of each row: the confidence of its argmax (E.6 scores)."""
        if not len(rows):
            return []
        return torch.softmax(rows.logits.double(), -1).amax(-1).tolist()


def order_for(config: DecodeConfig, positions: list[int], scores: dict[int, float]) -> tuple[int, ...]:
    """pi_t under the run's order policy (Algorithm 3 line 5): textual, or by confidence."""
    if config.order == CONFIDENCE:
        return confidence_order(positions, scores)
    return tuple(positions)




def verify_in_order(order: tuple[int, ...], draft: dict[int, int], v: tuple[int, ...],
                    first: bool = False) -> tuple[int, list[tuple[int, int]], list[str]]:
    """Greedy any-order verification (Algorithm 3 lines 6, 9-10): h matches in rank order, then A = min(h + 1, u).

    Args: order pi_t (u positions); draft D_{t-1} (position -> token); v the verifier's argmax at ranks
        1..len(v) (at least min(kappa + 1, u) of them); first: the run's first call (no draft yet).
    Returns: ``(h, C_t, sources)``: C_t as (position, token) pairs in rank order; sources name each
        (accepted draft, then the correction where a draft token was rejected, the bonus where the
        drafts ran out, or the prefill token of the first call).
    """
    kappa = 0
    while kappa < len(order) and order[kappa] in draft:
        kappa += 1
    h = 0
    while h < kappa and draft[order[h]] == v[h]:
        h += 1
    pairs = [(order[r], v[r]) for r in range(min(h + 1, len(order)))]
    last = SOURCE_PREFILL if first else SOURCE_CORRECTION if h < kappa else SOURCE_BONUS
    sources = [SOURCE_DRAFT] * h + ([last] if h < len(order) else [])
    return h, pairs, sources
