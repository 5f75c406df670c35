"""Per-user state keyed by Gradio's session hash (:class:`UserSession`, :class:`Sessions`), bounded in memory.

A step-through run holds its records and its own KV cache (about 20 MB for a 1,500-token prompt on the
embedded model), so the number of sessions alone does not bound memory: at most ``max_runs`` sessions
keep a run, at most ``runs_per_client`` of one client address (its own least recently used run is dropped
first, and its owner is told on the next Step),
and sessions idle for ``idle_s`` seconds are forgotten. Freed memory is handed back to the system.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from serve.limits import release_memory
from serve.race import RaceResult
from serve.step import StepRun

MAX_SESSIONS = 64  # sessions that hold nothing remembered at once (least recently used forgotten)
MAX_HELD = 256  # sessions remembered at once, those holding files or results included
MAX_HELD_PER_CLIENT = 16  # sessions holding something that one client address keeps at once
MAX_RUNS = 16  # sessions that keep a step-through run at once
MAX_RUNS_PER_CLIENT = 4  # of those, sessions of one client address
IDLE_S = 900.0  # seconds after which an unused session is forgotten


@dataclass
class UserSession:
    """One browser tab's (or API client's) state: its step run, its last race and the plot it shows.

    ``run_dropped``: its run was dropped to bound memory (the next Step starts a new one and says so)."""

    step: StepRun | None = None
    race: "RaceResult | None" = None
    plot_key: tuple | None = None
    playing: bool = False
    by_call: bool = False  # Step shows one call at a time (Linear-SS's drafting call, then its verification)
    run_dropped: bool = False
    client: str = ""  # the client address it was last used from
    used: float = field(default_factory=time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sessions:
    """Per-user state keyed by Gradio's session hash, none idle over ``idle_s`` seconds, at most ``max_runs`` of
    them holding a step-through run.

    Beyond ``capacity`` sessions, the least recently used sessions that hold nothing (no run, race, or file:
    ``holds(key)``) are forgotten first, so a client opening session after session (each a fresh hash costs
    nothing) pushes out only sessions like its own, never a visitor's upload, download or result; a session
    holding something goes when it is idle, when its tab closes, or beyond ``held`` sessions in all (the least
    recently used first). One client address keeps at most ``per_client`` sessions that hold something: beyond that
    its own least recently used one goes, so that sessions opened from one address (each holding a shown report)
    never push out another address's visitors. ``on_forget(key)`` runs for every session forgotten: its files go
    with it."""

    def __init__(self, capacity: int = MAX_SESSIONS, max_runs: int = MAX_RUNS, idle_s: float = IDLE_S,
                 on_forget: Callable[[str], None] | None = None, holds: Callable[[str], bool] | None = None,
                 held: int = MAX_HELD, per_client: int = MAX_HELD_PER_CLIENT,
                 runs_per_client: int = MAX_RUNS_PER_CLIENT):
        self.capacity = capacity
        self.runs_per_client = runs_per_client
        self.per_client = per_client
        self.max_runs = max_runs
        self.idle_s = idle_s
        self.on_forget = on_forget
        self.holds = holds
        self.held = max(held, capacity)
        self._data: OrderedDict[str, UserSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, client: str = "") -> UserSession:
        """The session of ``key`` (created on first use), used now from the address ``client``; forgets idle and
        surplus sessions."""
        now = time.monotonic()
        with self._lock:
            session = self._data.pop(key, None) or UserSession()
            session.used, session.client = now, client
            self._data[key] = session
            idle = [k for k, s in self._data.items() if now - s.used > self.idle_s]
            for k in idle:
                del self._data[k]
            surplus = self._surplus(key)
        self._forgotten(idle + surplus)
        if idle or surplus:
            release_memory()
        return session

    def _surplus(self, current: str) -> list[str]:
        """Forget sessions beyond the bounds (inside the lock), never ``current``: empty ones beyond ``capacity``,
        then the current client's own holding ones beyond ``per_client``, then any beyond ``held`` (least recently
        used first). Returns their keys."""
        over = len(self._data) - self.capacity
        empty = [k for k, s in self._data.items() if k != current and not self._holding(k, s)][:max(0, over)]
        for k in empty:
            del self._data[k]
        client = self._data[current].client
        own = [k for k, s in self._data.items() if s.client == client and self._holding(k, s)]
        own = [k for k in own if k != current][:max(0, len(own) - self.per_client)]
        for k in own:
            del self._data[k]
        full = [k for k in self._data if k != current][:max(0, len(self._data) - self.held)]
        for k in full:
            del self._data[k]
        return empty + own + full

    def _holding(self, key: str, session: UserSession) -> bool:
        return (session.step is not None or session.race is not None
                or (self.holds is not None and self.holds(key)))

    def _forgotten(self, keys: list[str]) -> None:
        if self.on_forget is not None:
            for key in keys:
                self.on_forget(key)

    def hold_run(self, session: UserSession, run: StepRun) -> None:
        """Give ``session`` its new step-through run. Beyond ``runs_per_client`` runs from its address, that
        address's least recently used other runs are dropped; beyond ``max_runs`` in all, the least recently used
        run of the address holding the most (so one address opening session after session drops its own runs, not
        another visitor's). Their sessions are told on their next Step."""
        session.step, session.run_dropped = run, False
        with self._lock:
            holders = [s for s in self._data.values() if s.step is not None and s is not session]  # oldest first
            own = [s for s in holders if s.client == session.client]
            surplus = own[:max(0, len(own) + 1 - self.runs_per_client)]
            holders = [s for s in holders if s not in surplus]
            while len(holders) + 1 > self.max_runs:
                counts = Counter(s.client for s in holders)
                counts[session.client] += 1
                most = max(counts.values())
                victim = next(s for s in holders if counts[s.client] == most)
                holders.remove(victim)
                surplus.append(victim)
            for other in surplus:
                other.step, other.plot_key, other.playing, other.run_dropped = None, None, False, True
        if surplus:
            release_memory()

    def runs_held(self) -> int:
        """Sessions holding a step-through run now."""
        with self._lock:
            return sum(1 for s in self._data.values() if s.step is not None)

    def drop(self, key: str) -> None:
        """Forget a session (its tab was closed) and hand its memory back."""
        with self._lock:
            dropped = self._data.pop(key, None)
        self._forgotten([key])  # even a session that never stepped may hold files
        if dropped is not None and dropped.step is not None:
            release_memory()

    def __len__(self) -> int:
        return len(self._data)
