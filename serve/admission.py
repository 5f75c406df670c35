"""Admission of heavy requests: light ones are always let in, heavy ones are bounded.

A request is heavy when its predicted worst case (:func:`serve.limits.worst_case_seconds`) exceeds
``light_s``. At most ``heavy_limit`` heavy requests compute at once and each visitor (a client address,
:meth:`serve.server.Server.admit`) has at most one;
beyond that a heavy request is refused at once with a message (never queued behind the others), so a
short request is answered within seconds whatever else runs: it waits only for a free queue slot and, at
the compute gate, for the iteration in progress (the least work goes first).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from serve.errors import UserError

LIGHT_S = 2.0  # predicted seconds up to which a request is light (a Step, a short generate)
HEAVY_AT_ONCE = 2  # heavy requests computing at once in the process


class Admission:
    """Who may start a heavy request now (see the module docstring)."""

    def __init__(self, heavy_limit: int = HEAVY_AT_ONCE, light_s: float = LIGHT_S):
        self.heavy_limit = heavy_limit
        self.light_s = light_s
        self._running: dict[object, float] = {}  # ticket -> predicted seconds
        self._visitors: set[str] = set()
        self._lock = threading.Lock()

    @contextmanager
    def admit(self, visitor: str | None, predicted_s: float,
              lower: str | None = "the new-token limit or the prompt length") -> Iterator[None]:
        """Hold a heavy slot for the body of the ``with`` block (a light request holds none).

        ``lower``: the settings of the asking tab or endpoint that make a request lighter (named in the refusal;
        None: no setting does).
        Raises: UserError when ``visitor`` already runs a heavy request, or every heavy slot is taken.
        """
        if predicted_s <= self.light_s:
            yield
            return
        ticket = object()
        with self._lock:
            if visitor is not None and visitor in self._visitors:
                raise UserError("you already have a heavy request running (a race or a long run, from this tab or "
                                "another at your address): wait for it to finish, or make this one lighter")
            if len(self._running) >= self.heavy_limit:
                lighter = (f", or lower {lower} (a request predicted under {self.light_s:g} s is served at once)"
                           if lower else "")
                raise UserError(f"the server is busy with {len(self._running)} heavy requests (up to "
                                f"{sum(self._running.values()):.0f} s of predicted work): try again in a minute"
                                f"{lighter}")
            self._running[ticket] = predicted_s
            if visitor is not None:
                self._visitors.add(visitor)
        try:
            yield
        finally:
            with self._lock:
                self._running.pop(ticket, None)
                self._visitors.discard(visitor)

    @property
    def heavy_running(self) -> int:
        """Heavy requests computing now."""
        with self._lock:
            return len(self._running)
