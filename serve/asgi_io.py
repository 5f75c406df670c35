"""ASGI plumbing of the request gate: reading a body within limits, handing a request on, answering in one line.

Gradio and FastAPI answer some refusals field by field (a 422 listing each field) or as a server error (500); the
page and the CLI show one line. :func:`answers_with` rewrites an answer of one status on its way out.
"""

from __future__ import annotations

import asyncio
import json
import sys

from packed_ss.inputs import shown


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


async def read_body(receive, limit: int, within_s: float | None = None) -> bytes | None:
    """An ASGI request's whole body, or None as soon as it passes ``limit`` bytes.

    Raises: TimeoutError when the whole body has not arrived ``within_s`` seconds after the first read (None: no
    bound), e.g. an upload trickled a few bytes at a time to hold a connection open."""
    deadline = None if within_s is None else asyncio.get_running_loop().time() + within_s
    body, more = b"", True
    while more:
        if deadline is None:
            message = await receive()
        else:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - asyncio.get_running_loop().time()))
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if len(body) > limit:
            return None
    return body


async def reply(send, status: int, content: dict) -> None:
    """Answer a refused request with ``status`` and ``content`` (JSON), and print its one line to the server log."""
    print(f"refused ({status}): {content.get('error')}", file=sys.stderr, flush=True)
    data = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
