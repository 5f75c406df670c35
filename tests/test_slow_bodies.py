"""Request bodies that arrive slowly cost the server a bounded buffer until their checks pass: 64 uploads from one
address, each sent but for its last bytes, held 780 MB for 30 s; a refused upload whose client sent on kept its
connection open as long as it sent; a queue join's body had no time bound at all. Each test's outcome is a status
and what is still counted, never a time."""

import asyncio
import json
import socket

import pytest
from helpers import serve

A, B = "203.0.113.9", "198.51.100.7"
UPLOAD = {"type": "http", "method": "POST", "path": "/gradio_api/upload",
          "headers": [(b"content-type", b"multipart/form-data; boundary=b0")]}
HEAD = b"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"p\"\r\n\r\n"


def _stalling(*parts: bytes):
    """An ASGI ``receive`` giving ``parts`` (more to come after each), then nothing more for ever."""
    parts = iter(parts)

    async def receive():
        part = next(parts, None)
        if part is None:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": part, "more_body": True}

    return receive


async def _answer(app, scope, receive) -> dict:
    """Run ``app`` on one request: {"status": ..., "error": ..., "close": whether the connection closes with it}."""
    sent = []

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 20)  # without a bound on the body, this raises instead
    headers = dict(sent[0].get("headers", []))
    return {"status": sent[0]["status"], "error": json.loads(sent[1]["body"]).get("error"),
            "close": headers.get(b"connection") == b"close"}


def _never_reached():
    reached = []

    async def app(scope, receive, send):
        reached.append(scope)

    return app, reached


def test_one_address_holds_a_few_arriving_bodies_and_a_few_bytes():
    from serve.asgi_io import ArrivingBodies
    from serve.uploads import BoundUploads

    gradio, reached = _never_reached()
    bodies = ArrivingBodies(per_client=2, client_bytes=3000, total_bytes=10_000)
    uploads = BoundUploads(gradio, within_s=0.3, bodies=bodies)

    async def both():
        a = [_answer(uploads, {**UPLOAD, "client": (A, 5000)}, _stalling(HEAD, b"x" * 500)) for _ in range(4)]
        b = _answer(uploads, {**UPLOAD, "client": (B, 5000)}, _stalling(HEAD, b"x" * 500))
        return await asyncio.gather(*a, b)

    answers = asyncio.run(both())
    assert sorted(a["status"] for a in answers[:4]) == [408, 408, 429, 429]  # two arrive (till their bound), two not
    assert answers[4]["status"] == 408  # the other address had a place of its own
    assert all(a["close"] for a in answers) and not reached
    assert any(a["error"].startswith("2 request bodies from your address are arriving") for a in answers)
    assert bodies.arriving(A) == bodies.arriving(B) == (0, 0)  # nothing counted once they are answered

    async def bytes_over():  # 2,500 bytes arriving, then another 1,000 from the same address
        first = _answer(uploads, {**UPLOAD, "client": (A, 5000)}, _stalling(HEAD, b"x" * 2400))
        second = _answer(uploads, {**UPLOAD, "client": (A, 5001)}, _stalling(HEAD, b"x" * 1000))
        return await asyncio.gather(first, second)

    first, second = asyncio.run(bytes_over())
    assert (first["status"], second["status"]) == (408, 429) and second["close"]
    assert second["error"].startswith("your address is sending ")
    assert bodies.arriving(A) == (0, 0)


def test_an_upload_past_its_addresss_budget_by_its_content_length_is_refused_before_it_is_read():
    from serve.uploads import BoundUploads

    gradio, reached = _never_reached()
    uploads = BoundUploads(gradio, client_bytes=2200)
    read = []

    async def receive():
        read.append(1)
        return {"type": "http.request", "body": b"", "more_body": True}

    uploads._reserve(2000, A)  # an earlier upload of 2,000 bytes from A
    declared = {**UPLOAD, "client": (A, 5000), "headers": [*UPLOAD["headers"], (b"content-length", b"1000")]}
    answer = asyncio.run(_answer(uploads, declared, receive))
    assert answer["status"] == 429 and answer["close"] and not read and not reached
    too_big = {**UPLOAD, "client": (B, 5000), "headers": [*UPLOAD["headers"], (b"content-length", b"99999999")]}
    answer = asyncio.run(_answer(uploads, too_big, receive))
    assert answer["status"] == 413 and answer["close"] and not read and not reached


def test_a_queue_join_whose_body_stalls_is_cut_at_its_time_bound():
    from serve.asgi_io import ArrivingBodies
    from serve.request_gate import RequestGate

    gradio, reached = _never_reached()
    gate = RequestGate(gradio, endpoints={}, takes_files=set(), events={0: 1}, bodies=ArrivingBodies(within_s=0.2))
    scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [], "client": (A, 5000)}
    answer = asyncio.run(_answer(gate, scope, _stalling(b'{"data": [1], "fn_index": 0, ')))
    assert answer["status"] == 408 and answer["close"] and not reached
    assert answer["error"] == "a request body must arrive whole within 0.2 s of its headers: send it at once"


def test_the_upload_middleware_and_the_gate_count_the_same_bodies():
    import app

    demo = app.build_demo()
    middleware = app.launch_kwargs(demo)["app_kwargs"]["middleware"]
    shared = {id(m.kwargs.get("bodies")) for m in middleware}
    assert len(middleware) == 2 and len(shared) == 1 and None not in (m.kwargs.get("bodies") for m in middleware)


@pytest.fixture(scope="module")
def url():
    import gradio as gr

    with gr.Blocks() as demo:
        gr.Markdown("slow bodies")
    yield from serve(demo)


def test_a_refused_upload_is_closed_though_its_client_sends_on(url):
    """An upload declaring 100 MB is answered at once (413), before its body, and its connection closed, whatever
    its client goes on sending (uvicorn kept reading it: its keep-alive timer restarts at every byte)."""
    host, port = url.split("//")[1].strip("/").split(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    connection.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                       b"boundary=b0\r\nContent-Length: 100000000\r\n\r\n" + HEAD)
    connection.settimeout(0.2)
    answer, closed = b"", False
    try:
        for _ in range(100):  # a chunk every 0.2 s for up to 20 s
            try:
                got = connection.recv(4096)
            except (socket.timeout, TimeoutError):
                connection.sendall(b"x" * 1024)
                continue
            if not got:
                closed = True
                break
            answer += got
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    finally:
        connection.close()
    assert answer.startswith(b"HTTP/1.1 413") and closed, answer[:200]
