"""A request is stopped only by its own connection closing (issue 67, item 4): a Fit in a fresh page was once
answered "the client disconnected; the run was stopped" 6.3 s after it began, 12 s after another page had closed
during the same Fit. A request's liveness check (serve.limits.client_alive) noted every running event of its
page, so another event of the same page or client ending ended it too.

The app here is two events beside each other: ``hold`` runs until the test releases it (or its liveness check
says its client left) and answers what the check says then; ``quick`` ends when the test lets it.
"""

import http.client
import json
import queue
import threading
import time

import pytest
from helpers import page_event, serve

WAIT_S = 60.0  # the most any step waits for the server (a bound for a hang, never a speed asserted)


@pytest.fixture(scope="module")
def app_parts():
    import gradio as gr

    from serve.limits import client_alive

    release, quick_go = threading.Event(), threading.Event()
    started, ended = queue.Queue(), queue.Queue()
    with gr.Blocks() as demo:
        box = gr.Textbox()

        def running() -> int:
            return sum(1 for jobs in demo._queue.active_jobs or [] for event in jobs or [])

        def hold(text, request: gr.Request):
            alive = client_alive(demo, request.session_hash, None, request.request)
            started.put(request.session_hash)
            end = time.monotonic() + WAIT_S
            while not release.is_set() and alive() and time.monotonic() < end:
                time.sleep(0.05)
            while alive() and running() > 1 and time.monotonic() < end:  # the other events have ended first
                time.sleep(0.05)
            answer = "alive" if alive() else "stopped"
            ended.put((request.session_hash, answer))
            return answer

        def quick(text):
            quick_go.wait(WAIT_S)
            return "quick"

        box.submit(hold, box, box, api_name="hold", concurrency_limit=None)
        box.change(quick, box, box, api_name="quick", concurrency_limit=None)
    for url in serve(demo):
        yield url, release, quick_go, started, ended


def _reset(release, quick_go, started, ended):
    for event in (release, quick_go):
        event.clear()
    for box in (started, ended):
        while not box.empty():
            box.get_nowait()


def test_a_quick_request_ending_beside_a_long_one_of_the_same_client_leaves_it_running(app_parts):
    """gradio_client gives all the jobs of one Client one ``session_hash``: the quick job ending ended the long
    one."""
    from gradio_client import Client

    url, release, quick_go, started, ended = app_parts
    _reset(release, quick_go, started, ended)
    client = Client(url, verbose=False)
    try:
        quick_job = client.submit("x", api_name="/quick")
        hold_job = client.submit("x", api_name="/hold")
        started.get(timeout=WAIT_S)  # the long one noted its own event while the quick one was running
        quick_go.set()
        assert quick_job.result(timeout=WAIT_S) == "quick"
        release.set()
        assert hold_job.result(timeout=WAIT_S) == "alive"  # "stopped" when the quick job's end counted as its own
    finally:
        release.set()
        quick_go.set()
        client.close()


def _host(url: str) -> tuple[str, int]:
    host, port = url.split("//")[1].strip("/").split(":")
    return host, int(port)


def test_a_page_closing_during_a_request_does_not_stop_the_same_request_of_another_page(app_parts):
    url, release, quick_go, started, ended = app_parts
    _reset(release, quick_go, started, ended)
    import urllib.request

    config = json.loads(urllib.request.urlopen(url.rstrip("/") + "/config", timeout=30).read())
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "hold")
    conn = http.client.HTTPConnection(*_host(url), timeout=WAIT_S)
    body = {"data": ["x"], "fn_index": fn_index, "session_hash": "page-a", "event_data": None, "trigger_id": None}
    conn.request("POST", "/gradio_api/queue/join", json.dumps(body), {"Content-Type": "application/json"})
    assert conn.getresponse().read()
    conn.request("GET", "/gradio_api/queue/data?session_hash=page-a")
    stream = conn.getresponse()
    assert started.get(timeout=WAIT_S) == "page-a"
    stream.close()  # page A closes while its request runs
    conn.close()
    assert ended.get(timeout=WAIT_S) == ("page-a", "stopped")  # its own connection closed: stopped
    answers = []
    page_b = threading.Thread(target=lambda: answers.append(page_event(url, "hold", ["x"], session="page-b",
                                                                       timeout=WAIT_S)))
    page_b.start()
    try:
        assert started.get(timeout=WAIT_S) == "page-b"
    finally:
        release.set()
        page_b.join(WAIT_S)
    assert answers == [("complete", ["alive"])]
