"""Per-user state keyed by Gradio's session hash (:class:`UserSession`, :class:`Sessions`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field


from serve.race import RaceResult
from serve.step import StepRun


@dataclass
class UserSession:
    """One browser tab's (or API client's) state: its step run, its last race and the plot it shows."""

    step: StepRun | None = None
    race: "RaceResult | None" = None
    plot_key: tuple | None = None
    playing: bool = False
    by_call: bool = False  # Step shows one call at a time (Linear-SS's drafting call, then its verification)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sessions:
    """Per-user state keyed by Gradio's session hash, least recently used dropped beyond ``capacity``."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._data: OrderedDict[str, UserSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> UserSession:
        """The session of ``key`` (created on first use)."""
        with self._lock:
            session = self._data.pop(key, None) or UserSession()
            self._data[key] = session
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)
            return session

    def drop(self, key: str) -> None:
        """Forget a session (its tab was closed)."""
        with self._lock:
            self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)
