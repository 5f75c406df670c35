"""Slow clients are timed out (issue 54, item 5): header blocks left unfinished stayed open (200 held for 32 s),
since uvicorn has no header timeout and its keep-alive timer stops at the first byte."""

import socket

import pytest

from helpers import serve


@pytest.fixture(scope="module")
def url():
    import gradio as gr

    from serve import slow_clients

    slow_clients.HEADERS_WITHIN_S = 1.0  # the module's deadline, short for the test (read when armed)
    with gr.Blocks() as demo:
        gr.Markdown("slow clients")
    try:
        yield from serve(demo)
    finally:
        slow_clients.HEADERS_WITHIN_S = 10.0


def _connect(url: str) -> socket.socket:
    host, port = url.split("//")[1].strip("/").split(":")
    connection = socket.create_connection((host, int(port)), timeout=10)
    return connection


def _closed_within(connection: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``connection`` (reads end) within ``seconds`` (nothing else is sent to it)."""
    connection.settimeout(seconds)
    try:
        return connection.recv(1024) == b""
    except (socket.timeout, TimeoutError):
        return False
    except ConnectionResetError:
        return True


def test_an_unfinished_header_block_is_closed_and_a_whole_one_answered(url):
    half = _connect(url)
    half.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # never ends its headers
    silent = _connect(url)  # never sends a byte
    try:
        assert _closed_within(half, 8.0) and _closed_within(silent, 8.0)  # closed after 1 s; never without the fix
        whole = _connect(url)
        whole.sendall(b"GET /config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert whole.recv(64).startswith(b"HTTP/1.1 200")
        whole.close()
    finally:
        half.close()
        silent.close()
