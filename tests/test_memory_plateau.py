"""Memory reaches a plateau however many visitors call (issue 54, item 3): Gradio kept a copy of every component's
settings for each session hash, 10,000 sessions by default, and every raw API call is a session of its own (about
25 MB per 100 four-token /generate calls, never given back). The app keeps as many as it remembers sessions."""

import http.client
import json

from helpers import serve
from serve.sessions import MAX_HELD

CALLS = MAX_HELD + 44


def test_raw_calls_from_new_sessions_leave_at_most_max_held_session_states(tiny_model_dir):
    import app

    demo = app.build_demo(str(tiny_model_dir))
    for url in serve(demo):
        host, port = url.split("//")[1].strip("/").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        for i in range(CALLS):  # each raw call: a fresh session hash
            conn.request("POST", "/gradio_api/call/generate", json.dumps({"data": [f"w{i % 9 + 1}", "ar", 2, 0, 0,
                                                                                    1, 0, 1]}),
                         {"Content-Type": "application/json"})
            event = json.loads(conn.getresponse().read())["event_id"]
            conn.request("GET", f"/gradio_api/call/generate/{event}")
            assert "complete" in conn.getresponse().read().decode()
        held = len(demo.state_holder.session_data)
        assert 0 < held <= MAX_HELD, held  # 300 before: one per call
