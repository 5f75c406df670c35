"""ASGI plumbing of the request gate: reading a body within limits, handing a request on, answering in one line.

Gradio and FastAPI answer some refusals field by field (a 422 listing each field) or as a server error (500); the
page and the CLI show one line. :func:`answers_with` rewrites an answer of one status on its way out.

A request body costs the server only what :class:`ArrivingBodies` allows while it arrives (:func:`receive_body`):
its bytes are counted against its address's share and everyone's, it must be whole :data:`BODY_WITHIN_S` seconds
after its headers, and a body refused on its way is answered with the connection closed, so that a client sending
on holds nothing (uvicorn kept reading such a body, and its keep-alive timer restarted at every byte).
"""

from __future__ import annotations

import asyncio
import json
import sys

from packed_ss.inputs import shown

from serve.request_checks import client_of

BODY_WITHIN_S = 30.0  # seconds a request's whole body may take to arrive after its headers
BODIES_PER_CLIENT = 8  # request bodies one client address may have arriving at once (its places in the queue)
CLIENT_BODY_BYTES = 16 * 2**20  # bytes of bodies one address may have arriving at once (two of the largest uploads)
BODY_BYTES = 256 * 2**20  # bytes of bodies all addresses may have arriving at once


class ArrivingBodies:
    """The request bodies arriving now (read in part, not yet whole): at most ``per_client`` of them and
    ``client_bytes`` of their bytes from one client address, ``total_bytes`` from all, each for ``within_s``
    seconds after its headers. 64 upload bodies from one address, each sent but for its last bytes, held 780 MB for
    30 s before (each as much as it had sent), and a request body other than an upload had no time bound.

    The server's one event loop is the only caller (no lock)."""

    def __init__(self, per_client: int = BODIES_PER_CLIENT, client_bytes: int = CLIENT_BODY_BYTES,
                 total_bytes: int = BODY_BYTES, within_s: float = BODY_WITHIN_S):
        self.per_client, self.client_bytes, self.total_bytes = per_client, client_bytes, total_bytes
        self.within_s = within_s
        self._bodies: dict[str, int] = {}  # address -> its bodies arriving
        self._bytes: dict[str, int] = {}  # address -> their bytes read so far
        self._total = 0

    def start(self, client: str) -> str | None:
        """Count one more body of ``client``; why not (one line, nothing counted) when it has ``per_client``."""
        if self._bodies.get(client, 0) >= self.per_client:
            return (f"{self.per_client} request bodies from your address are arriving at once: let them arrive "
                    f"before sending more")
        self._bodies[client] = self._bodies.get(client, 0) + 1
        return None

    def add(self, client: str, size: int) -> str | None:
        """Count ``size`` more bytes of a body of ``client``'s; why not (one line, nothing counted) when they pass
        its address's share or everyone's."""
        if self._bytes.get(client, 0) + size > self.client_bytes:
            return (f"your address is sending {self.client_bytes // 2**20} MB of request bodies at once: let them "
                    f"arrive before sending more")
        if self._total + size > self.total_bytes:
            return (f"the server is receiving {self.total_bytes // 2**20} MB of request bodies at once: try again "
                    f"in a few seconds")
        self._bytes[client] = self._bytes.get(client, 0) + size
        self._total += size
        return None

    def end(self, client: str, size: int) -> None:
        """A body of ``client``'s counted with ``size`` bytes is whole, or refused: it is counted no more."""
        for counts, amount in ((self._bodies, 1), (self._bytes, size)):
            left = counts.get(client, 0) - amount
            if left > 0:
                counts[client] = left
            else:
                counts.pop(client, None)
        self._total -= size

    def arriving(self, client: str) -> tuple[int, int]:
        """(bodies, bytes) of ``client`` arriving now."""
        return self._bodies.get(client, 0), self._bytes.get(client, 0)


class OverBudget(Exception):
    """A body's bytes would pass what :class:`ArrivingBodies` allows (the message: the one line to answer)."""


def answers_with(status: int, send, rewrite):
    """``send`` where an answer of HTTP ``status`` is held until its (whole) body comes, and then sent as
    ``rewrite(start, body)`` gives it: ``(start, body)`` again, or changed (a status, a body); other answers pass
    unchanged. A body sent in several parts is passed as it comes."""
    held = []

    async def sending(message):
        if message.get("type") == "http.response.start" and message.get("status") == status:
            held.append(message)
            return
        if held and message.get("type") == "http.response.body":
            start = held.pop()
            if not message.get("more_body"):
                start, body = rewrite(start, message.get("body") or b"")
                message = dict(message, body=body)
            await send(start)
        await send(message)

    return sending


def refusals_as_422(send):
    """``send`` for Gradio's direct route, whose answer to any error a handler raises is HTTP 500: a one-line refusal
    (``{"error": "<text>"}``, the handlers' UserError) goes out as 422; a 500 without a message stays 500."""
    def rewrite(start, body):
        try:
            error = json.loads(body or b"{}").get("error")
        except (ValueError, AttributeError, RecursionError):
            error = None
        return (dict(start, status=422) if isinstance(error, str) and error else start), body

    return answers_with(500, send, rewrite)


def validation_in_one_line(send):
    """``send`` with FastAPI's request-validation answers (422, ``{"detail": [{"loc": [...], "msg": ...}, ...]}``:
    a JSON body sent as text/plain, a ``fn_index`` that is no number) rewritten as this server's one line,
    ``{"error": "<field>: <what is wrong> (got <value>)"}``; every other answer passes unchanged."""
    def rewrite(start, body):
        line = one_line(body)
        if line is None:
            return start, body
        data = json.dumps({"error": line}).encode()
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        print(f"refused (422): {line}", file=sys.stderr, flush=True)
        return dict(start, headers=headers + [(b"content-length", str(len(data)).encode())]), data

    return answers_with(422, send, rewrite)


def one_line(body: bytes) -> str | None:
    """The one line of a FastAPI validation answer's body (None when it is not one)."""
    try:
        details = json.loads(body).get("detail")
    except (ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(details, list) or not details or not all(isinstance(d, dict) for d in details):
        return None
    first = details[0]
    where = ".".join(str(part) for part in first.get("loc", []) if part != "body") or "the body"
    line = f"{where}: {first.get('msg', 'not accepted')}"
    given = first.get("input")
    if where == "the body" and isinstance(given, str):
        line += " (send the JSON body with Content-Type: application/json)"
    elif given is not None and not isinstance(given, (dict, list)):
        line += f" (got {shown(given)})"
    return line + (f"; and {len(details) - 1} more" if len(details) > 1 else "")


async def forward(app, scope, body: bytes, receive, send) -> None:
    """Hand the request on to ``app`` with ``body`` (already read from ``receive``) as its body."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    await app(scope, replay, send)


async def read_body(receive, limit: int, within_s: float | None = None, count=None) -> bytes | None:
    """An ASGI request's whole body, or None as soon as it passes ``limit`` bytes.

    ``count``: called with the size of each part as it arrives; a line back (the part may not be held) raises
    :class:`OverBudget` with it.

    Raises: TimeoutError when the whole body has not arrived ``within_s`` seconds after the first read (None: no
    bound), e.g. an upload trickled a few bytes at a time to hold a connection open. OverBudget (above)."""
    deadline = None if within_s is None else asyncio.get_running_loop().time() + within_s
    body, more = bytearray(), True  # grown in place: a body of many parts is not copied at each
    while more:
        if deadline is None:
            message = await receive()
        else:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
        part = message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) + len(part) > limit:
            return None
        if part and count is not None:
            refused = count(len(part))
            if refused is not None:
                raise OverBudget(refused)
        body += part
    return bytes(body)


def declared_length(scope) -> int | None:
    """A request's Content-Length (None: none, or not a number: a chunked body)."""
    value = next((v for k, v in scope.get("headers", []) if k.lower() == b"content-length"), None)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


async def receive_body(scope, receive, send, limit: int, bodies: ArrivingBodies, too_big: str,
                       too_slow: str | None = None, within_s: float | None = None) -> bytes | None:
    """A request's whole body, or None once it has been answered in one line with its connection closed: 413
    ``too_big`` when its Content-Length or the bytes sent pass ``limit`` (the Content-Length before any byte is
    read); 429 when its address has as many bodies or bytes arriving as ``bodies`` allows, or everyone has; 408
    ``too_slow`` when it is not whole ``within_s`` seconds (default: ``bodies.within_s``) after its headers."""
    within_s = bodies.within_s if within_s is None else within_s
    declared = declared_length(scope)
    if declared is not None and declared > limit:
        await reply(send, 413, {"error": too_big}, close=True)
        return None
    client = client_of(scope)
    refused = bodies.start(client)
    if refused is not None:
        await reply(send, 429, {"error": refused}, close=True)
        return None
    held = 0

    def count(size: int) -> str | None:
        nonlocal held
        refused = bodies.add(client, size)
        held += size if refused is None else 0
        return refused

    try:
        body = await read_body(receive, limit, within_s, count)
    except TimeoutError:
        await reply(send, 408, {"error": too_slow or f"a request body must arrive whole within {within_s:g} s of "
                                                    f"its headers: send it at once"}, close=True)
        return None
    except OverBudget as error:
        await reply(send, 429, {"error": str(error)}, close=True)
        return None
    finally:
        bodies.end(client, held)
    if body is None:
        await reply(send, 413, {"error": too_big}, close=True)
    return body


async def reply(send, status: int, content: dict, close: bool = False) -> None:
    """Answer a refused request with ``status`` and ``content`` (JSON), and print its one line to the server log.
    ``close``: the connection is closed after the answer (its body was not read whole, and is not going to be)."""
    print(f"refused ({status}): {content.get('error')}", file=sys.stderr, flush=True)
    data = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status,
                "headers": headers + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": data})
