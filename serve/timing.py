"""Measured call and iteration times of this process (:class:`TimingLog`), for the Explain tab's cost fit."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from packed_ss.records import IterationRecord


# --- measurements -------------------------------------------------------------------------------------
class TimingLog:
    """Measured call and iteration times of this process (bounded), for the cost-model fit.

    ``calls`` holds ``(rows, model_ms)`` of every call; ``iterations`` holds ``(schedule, W, model_ms)`` of
    regular (non-prefill) iterations; ``runs`` the tokens and calls of each batch of records added, by
    schedule and W (prefill included, as tokens/NFE counts it).
    """

    def __init__(self, limit: int = 50_000):
        self._calls: deque[tuple[int, float]] = deque(maxlen=limit)
        self._iterations: deque[tuple[str, int, float]] = deque(maxlen=limit)
        self._runs: deque[tuple[str, int, int, int]] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, records: Sequence[IterationRecord], block_size: int) -> None:
        """Add the calls and iterations of some records (any schedule)."""
        with self._lock:
            for record in records:
                for call in record.calls:
                    self._calls.append((call.layout.rows, call.model_ms))
                prefill = any(call.layout.name.startswith("prefill") for call in record.calls)
                if record.calls and not prefill and record.schedule in ("ar", "linear", "quadratic", "packed"):
                    self._iterations.append((record.schedule, block_size - 1, record.model_ms))
            if records and records[0].schedule in ("ar", "linear", "quadratic", "packed"):
                self._runs.append((records[0].schedule, block_size - 1, sum(len(r.appended) for r in records),
                                   sum(len(r.calls) for r in records)))

    def tokens_per_nfe(self) -> list[tuple[str, int, float, int]]:
        """``(schedule, W, tokens/NFE, calls)`` per schedule and W over everything added (sums of tokens over
        sums of calls)."""
        with self._lock:
            runs = list(self._runs)
        totals: dict[tuple[str, int], list[int]] = {}
        for schedule, w, tokens, calls in runs:
            total = totals.setdefault((schedule, w), [0, 0])
            total[0] += tokens
            total[1] += calls
        return [(s, w, t / c, c) for (s, w), (t, c) in sorted(totals.items()) if c]

    def snapshot(self) -> tuple[list[tuple[int, float]], list[tuple[str, int, float]]]:
        """Copies of ``(calls, iterations)``."""
        with self._lock:
            return list(self._calls), list(self._iterations)
