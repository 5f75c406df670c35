"""A deadline for each request's header block: a client that opens connections and never finishes its headers.

uvicorn (which Gradio runs) has no header timeout: its keep-alive timer stops at the first byte that arrives, so a
connection holding half a header block stayed open as long as its client liked (200 held for 32 s, issue 54).
:class:`HeaderDeadline` is uvicorn's h11 protocol with a deadline: from the moment a connection opens, or a byte of
the next request arrives, its request line and headers must all be in within :data:`HEADERS_WITHIN_S` seconds,
else the connection is closed. A body is bounded apart (:data:`serve.uploads.UPLOAD_WITHIN_S`, the request gate's
size limits). :func:`install` makes it the protocol uvicorn picks by default (``http="auto"``, what Gradio asks for).
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADERS_WITHIN_S = 10.0  # seconds a request's line and headers may take to arrive


class HeaderDeadline(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose header block is not complete in time (module docstring)."""

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Arm the deadline while the next request's headers are awaited, disarm it once they are all in."""
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self._deadline is None:
                self._deadline = self.loop.call_later(HEADERS_WITHIN_S, self._too_slow)
        else:
            self._stop()

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE:  # still no complete request line and headers
            self.transport.close()


def install() -> None:
    """Make :class:`HeaderDeadline` the protocol of uvicorn's default ``http="auto"`` (every server this process
    starts afterwards)."""
    import uvicorn.config

    uvicorn.config.HTTP_PROTOCOLS["auto"] = f"{__name__}:{HeaderDeadline.__name__}"
