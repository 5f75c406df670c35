"""Per-address places in the queue, and who reads which results (:class:`CallListeners`).

One client address may have :data:`PER_CLIENT_EVENTS` events waiting or running, and of a queue group that
computes only :func:`address_share` of its places, so that it cannot take every place the server runs at once.
An event whose result nobody opened within :data:`UNREAD_S` seconds is stopped (a client that posted and left).
"""

from __future__ import annotations

import threading
import time


UNREAD_S = 5.0  # seconds a raw call or queue join may run before somebody opens its result stream; later it is stopped
# unqueued events post to run/predict with an fn_index; the queued events refuse them (the queue's api_open is off)
PER_CLIENT_EVENTS = 8  # events one client address may have waiting or running in the queue at once
QUEUED_S = 900.0  # an event counted that long at most (should Gradio's queue fail to let a finished one go)
SETTLE_S = 1.0  # seconds a request over its address's limit waits for a finished event to leave the queue


def address_share(concurrency_limit: int) -> int:
    """The places of a queue group running ``concurrency_limit`` events at once that one client address may hold
    (waiting or running): half of them, at least 1. One address's 8 model requests took all 8 of the compute
    group's places, and another visitor's four-token request waited 9 s (issue 35)."""
    return max(1, int(concurrency_limit) // 2)


class CallListeners:
    """Which events somebody reads: the middleware notes each raw ``/gradio_api/call`` POST's event id and each GET
    of its result stream, and each queue join's event id and session with each GET of that session's
    ``/gradio_api/queue/data`` stream; :meth:`unread` says an event has gone ``unread_s`` seconds unread (a client
    that posted and left, or whose join timed out before it listened)."""

    def __init__(self, unread_s: float = UNREAD_S, keep: int = 10_000):
        self.unread_s = unread_s
        self.keep = keep
        self._posted: dict[str, tuple[float, str | None]] = {}  # event id -> (POST time, monotonic s; its session)
        self._read: set[str] = set()
        self._reading: dict[str, None] = {}  # sessions that opened their queue/data stream (oldest first)
        self._clients: dict[str, str] = {}  # event id -> the address it was sent from
        self._sending: dict[tuple, int] = {}  # (address, kind or None) -> its requests checked, not yet answered
        self._kinds: dict[str, str] = {}  # event id -> its kind, for the events an address may have one of
        self._lock = threading.Lock()

    def posted(self, event_id: str, session: str | None = None, client: str = "", kind: str | None = None) -> None:
        """Note a raw call's event (``session`` None) or a queue join's event of ``session``, sent from the address
        ``client``; ``kind``: the event's queue group where an address may hold only some of its places
        (:meth:`hold`)."""
        with self._lock:
            self._posted[event_id] = (time.monotonic(), session)
            self._clients[event_id] = client
            if kind is not None:
                self._kinds[event_id] = kind
            while len(self._posted) > self.keep:  # bounded: the oldest ids are forgotten
                old = next(iter(self._posted))
                del self._posted[old]
                self._read.discard(old)
                self._clients.pop(old, None)
                self._kinds.pop(old, None)

    def queued(self, client: str, events) -> int:
        """Events sent from the address ``client`` that Gradio's queue still holds (``events``: its event ids, waiting
        or running), and requests of ``client`` being sent (:meth:`hold`)."""
        with self._lock:
            return self._queued(client, events)

    def hold(self, client: str, events, limit: int, kind: str | None = None, share: int = 1) -> int | None:
        """Hold a place for one more request of ``client`` when it has fewer than ``limit`` (:meth:`queued`) and,
        for an event of the queue group ``kind``, fewer than ``share`` of that group: None, and :meth:`arrived`
        gives the place back once the request is answered; else its count (0: it has ``share`` of the group)."""
        with self._lock:
            mine = self._queued(client, events)
            if mine >= limit:
                return mine
            if kind is not None and self._queued(client, events, kind) >= share:
                return 0
            for key in {(client, None), (client, kind)}:
                self._sending[key] = self._sending.get(key, 0) + 1
            return None

    def arrived(self, client: str, kind: str | None = None) -> None:
        """A request :meth:`hold` held a place for is answered: its event (if any) now counts as queued."""
        with self._lock:
            for key in {(client, None), (client, kind)}:
                left = self._sending.get(key, 0) - 1
                if left > 0:
                    self._sending[key] = left
                else:
                    self._sending.pop(key, None)

    def _queued(self, client: str, events, kind: str | None = None) -> int:
        now = time.monotonic()
        return self._sending.get((client, kind), 0) + sum(
            1 for event, who in self._clients.items() if who == client and event in events
            and (kind is None or self._kinds.get(event) == kind)
            and now - self._posted.get(event, (now, None))[0] < QUEUED_S)

    def read(self, event_id: str) -> None:
        """Somebody opened the result stream of the raw call ``event_id``."""
        with self._lock:
            self._read.add(event_id)

    def read_session(self, session: str) -> None:
        """Somebody opened ``session``'s queue/data stream: its events are read (the page's stream may open before
        or after a join)."""
        with self._lock:
            self._reading.pop(session, None)
            self._reading[session] = None
            while len(self._reading) > self.keep:
                del self._reading[next(iter(self._reading))]

    def unread(self, event_id: str) -> bool:
        """Whether ``event_id`` was posted (or joined) and nobody has opened its result stream for ``unread_s``
        seconds."""
        with self._lock:
            found = self._posted.get(event_id)
            if found is None or event_id in self._read or (found[1] is not None and found[1] in self._reading):
                return False
            return time.monotonic() - found[0] > self.unread_s
