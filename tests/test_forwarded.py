"""Which address a request counts as: behind one trusted proxy, the last entry of its ``X-Forwarded-For`` list (the
one the proxy appended), never an earlier one, which the client writes itself. Every per-address limit (the queue's
places, heavy slots, upload bytes, sessions, Step runs) is as good as this address."""

import http.client
import json

import pytest
from helpers import serve


@pytest.fixture(scope="module")
def url():
    import gradio as gr

    from serve.server import client_address

    def whoami(request: gr.Request) -> str:
        return client_address(request)

    with gr.Blocks() as demo:
        gr.api(whoami, api_name="whoami")
    yield from serve(demo)


def _address(url: str, *forwarded: str) -> str:
    """The address the server counts a raw call sent with these ``X-Forwarded-For`` headers as (from 127.0.0.1, the
    trusted proxy of uvicorn's default)."""
    host, port = url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = [("Content-Type", "application/json"), *(("X-Forwarded-For", value) for value in forwarded)]
    conn.putrequest("POST", "/gradio_api/call/whoami")
    body = json.dumps({"data": []}).encode()
    for key, value in [*headers, ("Content-Length", str(len(body)))]:
        conn.putheader(key, value)
    conn.endheaders(body)
    event = json.loads(conn.getresponse().read())["event_id"]
    conn.request("GET", f"/gradio_api/call/whoami/{event}")
    text = conn.getresponse().read().decode()
    return json.loads(text.strip().split("data: ")[-1])[0]


@pytest.mark.parametrize("forwarded, counted", [
    (["198.51.100.7"], "198.51.100.7"),
    (["203.0.113.9, 198.51.100.7"], "198.51.100.7"),  # the client wrote the first entry, the proxy the last
    (["1.1.1.1, 2.2.2.2, 203.0.113.9, 198.51.100.7"], "198.51.100.7"),
    (["203.0.113.9", "198.51.100.7"], "198.51.100.7"),  # two headers are one list, in order
    (["not-an-address, 198.51.100.7"], "198.51.100.7"),  # junk before the last hop changes nothing
    (["198.51.100.7, 127.0.0.1"], "198.51.100.7"),  # a trusted proxy's own entry is passed over
    (["203.0.113.9, "], "127.0.0.1"),  # an empty last hop: the request counts as the proxy's own
    ([" , "], "127.0.0.1"),
])
def test_a_forged_forwarded_list_counts_as_its_last_hop(url, forwarded, counted):
    assert _address(url, *forwarded) == counted


def test_forged_first_entries_do_not_make_one_client_many(url):
    """A client behind the proxy writing a new first entry on every request stays one address."""
    seen = {_address(url, f"10.0.{n}.1, 198.51.100.7") for n in range(5)}
    assert seen == {"198.51.100.7"}


def test_a_server_trusting_every_address_refuses_to_start(monkeypatch):
    """With ``FORWARDED_ALLOW_IPS=*`` uvicorn trusts every hop and takes the list's first entry, which any client
    writes: one client could pose as any number of visitors. The app names the fix instead of starting."""
    from serve.options import app_parser, options_problem

    args = app_parser().parse_args([])
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    assert "FORWARDED_ALLOW_IPS" in options_problem(args, [])
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.0.0.0/8, 127.0.0.1")
    assert options_problem(args, []) is None
