"""The call-cost fit behind the server's time estimates: the latest one per model, followed when it drifts.

A fit measured once at start-up goes stale: on a machine whose cores another job takes, calls run several
times slower (or faster, once the other job ends). :class:`CostBook` keeps the newest fit of each model (a fresh
probe, e.g. Explain's "Measure"), and compares every finished request's measured model time with what the fit
predicts for the same calls: a request that ran more than :data:`DRIFT` times slower or faster rescales the fit to
what was measured. Only the model's own time counts (:attr:`packed_ss.records.CallRecord.model_ms`), never the
time a request waited for the compute gate or the queue.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packed_ss.cost import CallCost
from packed_ss.records import IterationRecord

DRIFT = 1.5  # measured / predicted model time beyond which (or below 1 / DRIFT) the fit follows the measurement
MIN_CALLS = 8  # calls a request must have made for its timing to move the fit (fewer: too noisy)


@dataclass(frozen=True)
class CostEntry:
    """A model's fit and where it came from.

    Attributes:
        fit: the per-call cost (milliseconds). source: how it was obtained, in words ("measured at first use",
        "re-measured on request", "rescaled 3.1x: a request's calls ran slower than this fit said").
        at: when (``time.time()`` seconds).
    """

    fit: CallCost
    source: str
    at: float


def scaled(fit: CallCost, factor: float) -> CallCost:
    """``fit`` with every term multiplied by ``factor`` (the same shape of cost, at another speed)."""
    return CallCost(fit.tau_ms * factor, fit.delta_ms * factor, fit.kappa_ms * factor, fit.mu_ms * factor)


def predicted_ms(fit: CallCost, records: Iterable[IterationRecord]) -> tuple[float, float, int]:
    """(measured model ms, the fit's model ms, calls) over the calls of ``records``; each call's keys are its
    cached keys plus its rows (a static cache attends over more, which the fit's probes include)."""
    measured = predicted = 0.0
    calls = 0
    for record in records:
        for call in record.calls:
            rows = call.layout.rows
            measured += call.model_ms
            predicted += fit.ms(rows, call.layout.cached + rows)
            calls += 1
    return measured, predicted, calls


class CostBook:
    """The latest call-cost fit of each model this server runs (thread-safe).

    ``probe(model_ref, fresh, alive)`` measures a fit (:func:`packed_ss.cost.call_cost`; ``alive``: the asking
    request's check, None: not checked); it is called on first use and by :meth:`remeasure`. Keys are ``model_ref[:2]`` (name, precision): a scripted drafter runs the same network.
    """

    def __init__(self, probe: Callable[..., CallCost], drift: float = DRIFT, min_calls: int = MIN_CALLS):
        self._probe = probe
        self.drift = drift
        self.min_calls = min_calls
        self._entries: dict[tuple, CostEntry] = {}
        self._lock = threading.Lock()

    def fit(self, model_ref: tuple, alive: Callable[[], bool] | None = None) -> CallCost:
        """The model's latest fit (measured now when it has none; the measurement stops, raising ClientGone, once
        ``alive()`` turns False)."""
        entry = self.entry(model_ref)
        if entry is None:
            entry = self._set(model_ref, self._probe(model_ref, False, alive), "measured at first use")
        return entry.fit

    def entry(self, model_ref: tuple) -> CostEntry | None:
        """The model's latest fit with its source, or None before the first measurement."""
        with self._lock:
            return self._entries.get(tuple(model_ref[:2]))

    def remeasure(self, model_ref: tuple, source: str = "re-measured on request") -> CostEntry:
        """Probe the model again (not the cached fit) and make that its latest fit."""
        return self._set(model_ref, self._probe(model_ref, True, None), source)

    def observe(self, model_ref: tuple, records: Iterable[IterationRecord]) -> float | None:
        """Compare a finished request's model time with the fit's prediction for the same calls.

        Returns: measured / predicted (None for fewer than ``min_calls`` calls, or before any fit). When it is
        beyond ``drift`` either way, the fit is rescaled by it and becomes the latest."""
        entry = self.entry(model_ref)
        if entry is None:
            return None
        measured, predicted, calls = predicted_ms(entry.fit, records)
        if calls < self.min_calls or predicted <= 0 or measured <= 0:
            return None
        ratio = measured / predicted
        if ratio > self.drift or ratio < 1 / self.drift:
            way = "slower" if ratio > 1 else "faster"
            self._set(model_ref, scaled(entry.fit, ratio),
                      f"rescaled {ratio:.2g}x: a request's {calls} calls ran {way} than the previous fit said")
        return ratio

    def _set(self, model_ref: tuple, fit: CallCost, source: str) -> CostEntry:
        entry = CostEntry(fit, source, time.time())
        with self._lock:
            self._entries[tuple(model_ref[:2])] = entry
        return entry
