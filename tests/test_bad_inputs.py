"""Inputs that got a traceback, an unrelated exception or no word at all (issue 31, item 5): each gets one clear
line now, in the engine, the loader, the command lines and the serving layer's settings."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import tiny_llama

from packed_ss import DecodeConfig, generate
from packed_ss.models import DualModeModel, ModelLoadError

ROOT = Path(__file__).resolve().parents[1]
LONG_NAME = "x" * 256  # longer than any file name may be


# --- the engine ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [None, "assets/model", 5])
def test_generate_needs_a_loaded_model(model):
    with pytest.raises(TypeError, match=r"^model must be a loaded model \(DualModeModel.from_pretrained"):
        generate(model, [1, 2], DecodeConfig())


def test_the_confidence_order_is_refused_on_a_left_to_right_model():
    model = tiny_llama()
    with pytest.raises(ValueError, match="order 'confidence' needs an any-order model"):
        generate(model, [2, 3], DecodeConfig(order="confidence", max_new_tokens=2))


@pytest.mark.parametrize("stops", [(5,), ("ok", None), "abc", ("",)])
def test_stop_strings_must_be_non_empty_texts(stops):
    with pytest.raises(ValueError, match="stop strings must be a tuple of non-empty texts"):
        DecodeConfig(stop_strings=stops)


@pytest.mark.parametrize("ids", [[-1], [10 ** 6], [True], ["3"], [1.5]])
def test_decode_refuses_ids_outside_the_vocabulary(ids):
    model = tiny_llama(vocab_size=20)
    with pytest.raises(ValueError, match=r"^token ids are integers from 0 to 19, got"):
        model.decode(ids)
    with pytest.raises(ValueError, match=r"^token ids are integers from 0 to 19"):
        model.token_strings(ids)
    assert model.decode([2, 3]) == "w0 w1"


# --- the loader and the command lines --------------------------------------------------------------------
@pytest.mark.parametrize("name", [LONG_NAME, "a\x00b", "/" + LONG_NAME])
def test_a_name_no_folder_can_have_is_a_load_error(name):
    with pytest.raises(ModelLoadError) as refused:
        DualModeModel.from_pretrained(name)
    message = str(refused.value)
    assert "\n" not in message and len(message) < 300  # one line, the name cut short
    if len(name) > 255:
        assert "is no folder or hub id this machine can open (File name too long)" in message


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _refusal(done_code, stderr: str) -> None:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert done_code not in (0, None) and "Traceback" not in stderr and "please report it" not in stderr
    assert "no folder or hub id this machine can open" in lines[-1] or "--port must be a port number" in lines[-1]


@pytest.mark.parametrize("command", [
    ["-m", "packed_ss", "generate", "--model", LONG_NAME, "--prompt", "a"],
    ["app.py", "--port", "99999"],
])
def test_command_lines_refuse_impossible_names_and_ports_in_one_line(command):
    """As processes: the two entry points a user starts (the rest of the cases run in this process, below)."""
    done = _run(*command)
    _refusal(done.returncode, done.stderr)


@pytest.mark.parametrize("command", [
    ["bench", "--model", LONG_NAME, "--prompts", "humaneval", "--limit", "1", "--schedules", "ar"],
    ["app", "--model", LONG_NAME],
    ["app", "--port", "-1"],
])
def test_the_command_lines_main_functions_refuse_them_in_one_line(command, tmp_path, capsys, monkeypatch):
    import app
    from packed_ss.bench.cli import main as bench_main

    def built(*args, **kwargs):  # the refusal comes before any page is built (and no server blocks the test)
        raise AssertionError("app.main went on to build the page")

    monkeypatch.setattr(app, "build_demo", built)

    if command[0] == "bench":  # its own --out: the project's bench-out may hold results already
        code = bench_main([*command[1:], "--out", str(tmp_path / "out")])
    else:
        with pytest.raises(SystemExit) as stopped:
            app.main(command[1:])
        code = stopped.value.code
    _refusal(code, capsys.readouterr().err)


def test_a_checkpoint_with_nan_weights_is_refused_at_load(tmp_path):
    import torch

    model = tiny_llama(vocab_size=20)
    model.model.config.mask_token_id = 1
    with torch.no_grad():
        model.model.model.layers[0].mlp.up_proj.weight[0, 0] = float("nan")
    model.model.float().save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"1 of its weight tensors hold NaN or infinite values "
                                             r"\(model.layers.0.mlp.up_proj.weight\)"):
        DualModeModel.from_pretrained(tmp_path, device="cpu")


def test_a_base_model_for_a_checkpoint_that_is_not_setdlm_is_warned_about(tiny_model_dir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DualModeModel.from_pretrained(tiny_model_dir, device="cpu", base_model="Qwen/Qwen3-0.6B")
    assert any("applies to SetDLM checkpoints only" in str(w.message) for w in caught)


# --- the serving layer's settings (every endpoint validates through RequestValues) -----------------------
@pytest.mark.parametrize("field, value, message", [
    ("max_new_tokens", True, "new-token limit must be a whole number, got True"),
    ("temperature", True, "temperature must be a number, got True"),
    ("block_size", False, "block size must be a whole number, got False"),
    ("block_size", "abc", "block size must be a whole number"),
    ("block_size", None, "block size must be a whole number"),
    ("max_new_tokens", "abc", "new-token limit must be a whole number"),
    ("temperature", "NaN", "temperature must be a finite number"),
    ("seed", "x", "seed must be a whole number"),
    ("drafter_quality", "q", "drafter quality must be a number"),
])
def test_request_values_refuse_wrong_types_in_one_line(field, value, message):
    from serve.errors import UserError
    from serve.settings import RequestValues

    with pytest.raises(UserError, match=message):
        RequestValues(prompt="def f(x):", **{field: value}).settings()


# --- the page's events over raw HTTP --------------------------------------------------------------------
STEP_VALUES = ["", "w1 w2 w3", "packed", 4, 0, 0, 1, 0, 4, False, "", "model", 0.8, "ltr", False]
FIELDS = {"block": 3, "temperature": 4, "seed": 7, "max_new": 8, "quality": 12}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    import app
    from helpers import serve

    yield from serve(app.build_demo(str(tiny_model_dir)))


def _call(url: str, endpoint: str, data: list) -> tuple[int, str]:
    from test_public_server import raw_call

    return raw_call(url, endpoint, {"data": data})


@pytest.mark.parametrize("field, value, message", [
    ("block", "abc", "block size must be a whole number, got 'abc'"),
    ("block", None, "got an empty field (a number too long for the page to hold"),  # a 400-digit seed arrived so
    ("max_new", "abc", "new-token limit must be a whole number, got 'abc'"),
    ("temperature", "NaN", "temperature must be a finite number"),
    ("seed", "x", "seed must be a whole number, got 'x'"),
    ("seed", None, "seed must be a whole number from 0 to 4294967295, got an empty field"),  # a 400-digit seed
    ("quality", "q", "drafter quality must be a number, got 'q'"),
    ("max_new", True, "new-token limit must be a whole number, got True"),
])
def test_a_raw_step_with_a_wrong_type_gets_one_line_and_the_log_one_line(server, capfd, field, value, message):
    from test_public_server import stream_result

    values = list(STEP_VALUES)
    values[FIELDS[field]] = value
    capfd.readouterr()
    code, text = _call(server, "step", values)
    kind, data = stream_result(text)
    import html

    assert code == 200 and kind == "complete" and message in html.unescape(data[-1]), text[:400]
    log = capfd.readouterr().err
    assert "refused /step: " in log and message in log and "Traceback" not in log
    code, text = _call(server, "step", STEP_VALUES)  # the session still steps
    assert stream_result(text)[0] == "complete"


def test_a_raw_replay_with_a_speed_that_is_no_number_gets_one_line(server):
    from test_public_server import stream_result

    code, text = _call(server, "replay", ["x"])
    kind, answer = stream_result(text)
    assert kind == "error" and answer["error"] == "the replay speed must be a number, got 'x'", text[:300]


def test_a_replay_in_a_session_without_a_race_adds_no_message(server):
    """The page chains the replay to every race; after a refused race the race's own result area says why."""
    from helpers import page_event

    kind, outputs = page_event(server, "replay", [1], session="no-race-yet")
    assert kind == "complete" and all(out.get("__type__") == "update" and len(out) <= 2 for out in outputs), outputs


def _upload(path):
    return {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": str(path).rsplit("/", 1)[-1]}


# Page-only events sent wrong types answered {"error": null} with a traceback in the log, or accepted junk without
# a word (load test, issue 31): every value Gradio's own checks refuse is now one line (serve.blocks), and the
# handlers check what Gradio lets through.
@pytest.mark.parametrize("event, value, message", [
    ("load_example", 999, "example must be a whole number in [0, "),
    ("load_example", "x", "example must be a whole number"),
    ("load_example", -1, "example must be a whole number"),  # loaded the last example
    ("load_example", 1.5, "example must be a whole number"),
    ("load_example", [0], "example must be a whole number"),
    ("on_model", 5, "the model must be a name, got 5"),
    ("on_model", ["assets/model"], "the model must be a name"),
    ("on_model", "bogus", "model 'bogus' is not offered on this server"),  # hid the order choice without a word
    ("on_speed", "x", "Play speed (steps per second) cannot take 'x': not a value of the kind this control holds"),
    ("on_play", "x", "cannot take 'x'"),
    ("on_explain", "x", "cannot take 'x'"),
    ("on_explain", 10 ** 30, "cannot take 1e+30 (a 31-digit number): Value 1e+30 (a 31-digit number) is "
                             "greater than maximum value 32."),  # Gradio's own check: its words, no traceback
    ("on_speed", 10 ** 400, "cannot take 1e+400 (a 401-digit number): Value 1e+400 (a 401-digit number) is greater"),
    ("scrub", 10 ** 400, "the iteration must be a number, got 1e+400 (a 401-digit number)"),  # OverflowError
    ("replay", -10 ** 400, "the replay speed must be a number, got -1e+400 (a 401-digit number)"),
    ("on_speed", -1, "cannot take -1: Value -1 is less than minimum value 0.5."),
    ("replay", -1, "the replay speed must be above 0 and at most 100 (times real time), got -1"),
    ("replay", 0, "the replay speed must be above 0"),
    ("replay", 1e308, "the replay speed must be above 0"),
    ("scrub", "x", "the iteration must be a number, got 'x'"),  # showed iteration 0 without a word
    ("scrub", None, "the iteration must be a number, got an empty field"),
    ("chosen", _upload("/etc/passwd"), "only a file uploaded through this page is taken"),
    ("chosen_1", _upload(str(ROOT / "app.py")), "only a file uploaded through this page is taken"),
    ("chosen", 5, "cannot take 5"),
    ("chosen_1", {"a": 1}, "not a value of the kind this control holds"),
    ("chosen", [_upload("/etc/passwd")], "cannot take"),
    ("chosen_1", "/etc/passwd", "cannot take"),
])
def test_a_page_event_sent_a_value_of_the_wrong_kind_gets_one_line(server, capfd, event, value, message):
    from helpers import page_event

    capfd.readouterr()
    kind, answer = page_event(server, event, [value])
    assert kind == "error" and isinstance(answer, str) and message in answer and "\n" not in answer, answer
    log = capfd.readouterr().err
    assert "refused /" in log and message in log and "Traceback" not in log, log[-2000:]
    assert page_event(server, "load_example", [0])[0] == "complete"  # the server still answers


@pytest.mark.parametrize("data", [[999], ["x"]])
def test_load_example_is_no_api_endpoint(server, data):
    import json

    code, text = _call(server, "load_example", data)
    assert code == 404 and "no such endpoint" in json.loads(text)["error"]


def test_a_refused_api_request_logs_one_line(server, capfd):
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    capfd.readouterr()
    with pytest.raises(AppError, match="temperature must be a number, got True"):
        Client(server, verbose=False).predict("w1", temperature=True, api_name="/generate")
    log = capfd.readouterr().err
    assert "refused /generate: temperature must be a number, got True" in log and "Traceback" not in log


@pytest.mark.parametrize("value", [5, "x", {"a": 1}, [1, 2], True])
def test_a_raw_step_by_with_another_value_gets_one_line(server, capfd, value):
    from test_public_server import stream_result

    capfd.readouterr()
    code, text = _call(server, "step_by", [value])
    kind, answer = stream_result(text)
    assert kind == "error" and answer["error"].startswith("step by must be 'iteration' or 'call', got"), text[:300]
    log = capfd.readouterr().err
    assert "refused /step_by: step by must be" in log and "Traceback" not in log


@pytest.mark.parametrize("index, value, message", [
    (15, 5, "lanes must be text such as 'ar,diffusion', got int 5"),
    (15, ["nope"], "optional race lanes are"),
    (16, 7, "block_sizes must be text, got int 7"),
])
def test_a_raw_page_race_with_a_wrong_lane_or_size_choice_gets_one_line(server, index, value, message):
    import html

    from test_public_server import stream_result

    values = list(STEP_VALUES) + [["lookup"], "same"]
    values[index] = value
    code, text = _call(server, "ui_race", values)
    kind, data = stream_result(text)
    assert kind == "complete" and message in html.unescape(data[0]), text[:300]


@pytest.mark.parametrize("field,value,message", [
    ("top_k", 10**30, "top-k must be an integer from 0 \\(off\\) to 2147483647"),
    ("top_k", 2**64, "top-k must be an integer from 0 \\(off\\) to 2147483647"),
    ("temperature", 1e30, "temperature must be a finite number from 0 to 100"),
])
def test_values_past_any_use_are_refused_before_they_reach_a_json_reply(field, value, message):
    """A race with top_k 2**64 ran whole and then broke the reply's JSON encoder (load test, issue 31)."""
    from packed_ss.config import DecodeConfig

    with pytest.raises(ValueError, match=message):
        DecodeConfig(**{field: value})


def test_a_huge_integer_in_any_number_field_of_any_event_gets_one_line(server, capfd):
    """A 400-digit integer overflowed float() in the message that should have refused it ("unexpected error
    (OverflowError)", and through replay, scrub and step_by {"error": null} plus a traceback; issue 35, item 5).
    Sent as the page sends it, into each number and slider of every event in turn."""
    import http.client
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(server.rstrip("/") + "/config", timeout=30).read())
    components = {c["id"]: c for c in config["components"]}
    host, port = server.split("//")[1].strip("/").split(":")
    sent = 0
    capfd.readouterr()
    for dependency in config["dependencies"]:
        inputs = dependency["inputs"]
        for index, component in enumerate(inputs):
            if components[component].get("type") not in ("number", "slider"):
                continue
            values = [json.dumps(components[i].get("props", {}).get("value")) for i in inputs]
            values[index] = "-" * (sent % 2) + "1" + "0" * 400  # JSON numbers, as a client may send them
            session = f"huge-{sent}"
            body = ('{"data": [%s], "fn_index": %d, "session_hash": "%s", "event_data": null, "trigger_id": null}'
                    % (",".join(values), dependency["id"], session))
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            conn.request("POST", "/gradio_api/queue/join", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            assert answer.status == 200, answer.read()
            answer.read()
            conn.request("GET", f"/gradio_api/queue/data?session_hash={session}")
            done = next(json.loads(line[5:]) for line in (raw.decode().strip() for raw in conn.getresponse())
                        if line.startswith("data:") and '"process_completed"' in line)
            output = done.get("output", {})
            if "error" in output:  # refused by the event: its words, one line
                assert output["error"] and "\n" not in output["error"] and "401-digit" in output["error"], output
            sent += 1
    log = capfd.readouterr().err
    assert sent >= 30 and "Traceback" not in log and "unexpected error" not in log, log[-3000:]
    assert log.count("401-digit number") >= sent // 2


def _raw(url: str, method: str, path: str, body: str | None = None) -> tuple[int, str]:
    import http.client

    host, port = url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body, {"Content-Type": "application/json"} if body is not None else {})
    answer = conn.getresponse()
    return answer.status, answer.read().decode()  # a cut-off stream raises IncompleteRead here


@pytest.mark.parametrize("fn_index, data, status, message", [
    (-1, [], 404, "no event -1: the page's events are 0 to "),
    (10**9, [], 404, "no event 1000000000: the page's events are 0 to "),
    (31, [], 404, "no event 31: the page's events are 0 to "),
    ("4", [], 404, "no event '4': the page's events are 0 to "),
    (True, [], 404, "no event True: the page's events are 0 to "),
    ("step", [""] * 16, 422, "takes 15 values in 'data', got 16 values"),  # was accepted
    ("step", "x", 422, "takes 15 values in 'data', got no list of values"),
])
def test_a_queue_join_naming_no_event_or_the_wrong_values_gets_one_line(server, capfd, fn_index, data, status,
                                                                         message):
    """Gradio answered HTTP 500 with a KeyError for an fn_index it does not have (issue 35, item 5)."""
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(server.rstrip("/") + "/config", timeout=30).read())
    if fn_index == "step":
        fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "step")
    if fn_index == 31:
        fn_index = len(config["dependencies"])  # one past the last
        message = f"no event {fn_index}: the page's events are 0 to "
    capfd.readouterr()
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": "joiner", "event_data": None,
                       "trigger_id": None})
    code, text = _raw(server, "POST", "/gradio_api/queue/join", body)
    assert code == status and message in json.loads(text)["error"], text
    log = capfd.readouterr().err
    assert f"refused ({status}): " in log and "Traceback" not in log


@pytest.mark.parametrize("path, message", [
    ("/gradio_api/queue/data?session_hash=unknown", "no event of session 'unknown' is waiting"),
    ("/gradio_api/queue/data", "no event of session '' is waiting"),
    ("/gradio_api/call/nope/x", "/call/nope/x: no such endpoint; the documented ones are /generate, /race"),
    ("/gradio_api/call/v2/generate/x", "/generate: no event 'x' is waiting"),  # the keyword form's stream
    ("/gradio_api/call/generate/0123456789abcdef", "/generate: no event '0123456789abcdef' is waiting"),
    ("/gradio_api/call/generate/" + "e" * 300, "/generate: no event 'eeee"),
])
def test_a_result_stream_for_an_unknown_session_or_event_gets_one_line(server, capfd, path, message):
    """These streams were cut off with a traceback in the log (8 cases of issue 35, item 5)."""
    import json

    capfd.readouterr()
    code, text = _raw(server, "GET", path)
    assert code == 404 and message in json.loads(text)["error"], text[:300]
    log = capfd.readouterr().err
    assert "refused (404): " in log and "Traceback" not in log


def test_a_known_call_still_streams_its_result(server):
    from test_public_server import raw_call, stream_result

    code, text = raw_call(server, "generate", {"data": ["w1 w2", "ar", 4, 0.0, 4]})
    assert code == 200 and stream_result(text)[0] == "complete", text[:300]
    code, text = raw_call(server, "generate", {"data": ["w1 w2", "ar", 4, 0.0, 4], "session_hash": "own-session-1"})
    assert code == 200 and stream_result(text)[0] == "complete", text[:300]  # with a session hash of its own


def test_a_call_result_is_read_by_its_event_id_not_its_session_hash(server):
    """Gradio's result route falls back to reading the id as a session hash: whoever knew a raw call's session hash
    took its result, and its own client then got "no event" (issue 35)."""
    import json

    from test_public_server import raw_call, stream_result

    code, text = raw_call(server, "generate", {"data": ["w1 w2", "ar", 4, 0.0, 4], "session_hash": "probesess77"},
                          read_stream=False)
    assert code == 200, text
    code, stolen = _raw(server, "GET", "/gradio_api/call/generate/probesess77")
    assert code == 404 and "no event 'probesess77' is waiting" in json.loads(stolen)["error"], stolen
    code, mine = _raw(server, "GET", f"/gradio_api/call/generate/{json.loads(text)['event_id']}")
    assert code == 200 and stream_result(mine)[0] == "complete", mine[:300]


# --- the hostile rerun of issue 35 (F3, F5): routes past the checks ------------------------------------------
@pytest.mark.parametrize("path, body, status, message", [
    ("/gradio_api/call/v2/generate", '{"data": ["x"]}', 422, "/call/v2/generate: unknown parameter(s) data"),
    ("/gradio_api/call/v2/generate", '[]', 422, "/call/v2/generate: send a JSON object of the parameters prompt"),
    ("/gradio_api/call/v2/generate", '{"schedule": "ar"}', 422, "missing required parameter(s) prompt"),
    ("/gradio_api/call/v2/nope", "{}", 404, "/nope: no such endpoint; the documented ones are /generate"),
    ("/gradio_api/call/a/b", '{"data": []}', 404, "/call/a/b: no such endpoint"),
    ("/gradio_api/run/generate", '{"data": ["x"]}', 404, "direct calls take the page's own events only"),
    ("/gradio_api/api/generate", '{"data": []}', 404, "direct calls take the page's own events only"),
    ("/gradio_api/run/step", '{"data": []}', 404, "direct calls take the page's own events only"),
    ("/gradio_api/run/predict", '{"data": [], "fn_index": [4]}', 404, "direct calls take the page's own events"),
    ("/gradio_api/queue/join", '{"data": [], "fn_index": [4], "session_hash": "abc123def45"}', 404, "no event [4]"),
    ("/gradio_api/queue/join", '{"data": [0], "fn_index": 0, "session_hash": ""}', 422, "needs a session_hash"),
    ("/gradio_api/queue/join", '{"data": [0], "fn_index": 0}', 422, "needs a session_hash"),
    # a lone surrogate in a raw call's body poisoned Gradio's analytics for everyone
    ("/gradio_api/call/generate", '{"data": ["x"], "session_hash": "\\ud800"}', 422, "/generate: session_hash: 1 to"),
    ("/gradio_api/call/v2/generate", '{"prompt": "x", "session_hash": 5}', 422, "/generate: session_hash: 1 to"),
    ("/gradio_api/cancel", '{"session_hash": "\\ud800", "fn_index": 0, "event_id": "x"}', 422, "/cancel: session_hash"),
    ("/gradio_api/component_server", '{"data": 1, "component_id": 99999, "session_hash": "x", "fn_name": "y"}', 404,
     "no component of this page answers server calls"),
    # routes of features the page does not have
    ("/gradio_api/process_recording", "{}", 404, "this page has no screen recording"),
    ("/gradio_api/stream/abc", '{"data": [1]}', 404, "this page has no streaming inputs or outputs"),
    ("/gradio_api/stream/abc/close", "{}", 404, "this page has no streaming inputs or outputs"),
])
def test_every_route_past_the_defaults_answers_a_bad_request_in_one_line(server, capfd, path, body, status, message):
    """Gradio's keyword form (call/v2), its direct routes (run/, api/) and odd queue joins answered HTTP 500 with a
    traceback (issue 35's hostile rerun, F5 a-d)."""
    import json

    capfd.readouterr()
    code, text = _raw(server, "POST", path, body)
    assert code == status and message in json.loads(text)["error"], text[:300]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("path", ["/gradio_api/heartbeat/%00", "/gradio_api/heartbeat/" + "a" * 5000,
                                  "/gradio_api/heartbeat/%C3%A9", "/gradio_api/heartbeat/a%20b",
                                  "/gradio_api/queue/data?session_hash=%00",
                                  "/gradio_api/queue/data?session_hash=" + "a" * 50_000])  # item 5: cut-off streams
def test_a_session_hash_in_a_path_or_query_is_checked_on_every_route(server, capfd, path):
    """A heartbeat for a NUL session logged about 100 lines of tracebacks (httpx.InvalidURL) and ran no unload;
    spaces, accents and 5,000 characters were taken."""
    import json

    capfd.readouterr()
    code, text = _raw(server, "GET", path)
    assert code == 422 and "session_hash: 1 to 256 printable ASCII characters" in json.loads(text)["error"], text
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("path, message", [
    ("/gradio_api/deep_link?session_hash=abcdefghijk", "this page has no deep links"),  # wrote 176 KB a call
    ("/monitoring/summary", "this page has no public monitoring"),  # every visitor's request counts
    ("/monitoring", "this page has no public monitoring"),  # printed the monitoring key to the log
    # whatever ids they carry ("stream/" was answered as a bad session hash)
    ("/gradio_api/stream/", "this page has no streaming"), ("/gradio_api/stream/%00/0/1/playlist.m3u8",
                                                            "this page has no streaming"),
    ("/gradio_api/deep_link?session_hash=%ED%A0%80", "this page has no deep links"),
])
def test_routes_of_features_the_page_does_not_have_answer_404(server, capfd, path, message):
    import json

    capfd.readouterr()
    code, text = _raw(server, "GET", path)
    assert code == 404 and message in json.loads(text)["error"], text
    log = capfd.readouterr()
    assert "Traceback" not in log.err and "Monitoring URL" not in log.out + log.err


def test_the_keyword_form_of_a_documented_call_still_streams_its_result(server):
    import json

    code, text = _raw(server, "POST", "/gradio_api/call/v2/generate",
                      json.dumps({"prompt": "w1 w2", "schedule": "ar", "max_new_tokens": 4}))
    assert code == 200, text
    code, stream = _raw(server, "GET", f"/gradio_api/call/v2/generate/{json.loads(text)['event_id']}")
    assert code == 200 and "event: complete" in stream, stream[:300]


def _queue_stub(delay_s: float = 0.0, shares: dict | None = None):
    """The middleware over a stand-in for Gradio's join route (each join answered with a new event id after
    ``delay_s``, the event then held by the queue). Returns (the queue's events, the listeners, ``join(address)``:
    a coroutine giving the join's HTTP status)."""
    import asyncio
    import itertools
    import json

    from serve.address_shares import CallListeners
    from serve.request_gate import RequestGate

    numbers, events, listeners = itertools.count(), {}, CallListeners()

    class Queue:
        event_ids_to_events = events  # what Gradio's queue holds: waiting or running

    async def gradio(scope, receive, send):
        await asyncio.sleep(delay_s)
        event = f"e{next(numbers)}"
        events[event] = object()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": json.dumps({"event_id": event}).encode()})

    app = RequestGate(gradio, endpoints={}, listeners=listeners, takes_files=set(), events={0: 1, 1: 1},
                          queue=lambda: Queue, shares=shares)

    async def join(address: str, fn_index: int = 0) -> int:
        body = json.dumps({"data": [1], "fn_index": fn_index, "session_hash": f"s{next(numbers)}"}).encode()
        answers = []

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            answers.append(message)

        scope = {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [],
                 "client": (address, 5000)}
        await app(scope, receive, send)
        return answers[0]["status"]

    return events, listeners, join


def test_one_address_cannot_fill_the_queue():
    """One client's 40 queued benchmark joins filled Gradio's queue (32): everyone else's short requests got 503
    (issue 35's hostile rerun, F6). An address may have PER_CLIENT_EVENTS events waiting or running; another
    address is not affected, and the first may send more once its events are done."""
    import asyncio

    from serve.address_shares import PER_CLIENT_EVENTS

    events, _, join = _queue_stub()
    assert [asyncio.run(join("203.0.113.9")) for _ in range(PER_CLIENT_EVENTS)] == [200] * PER_CLIENT_EVENTS
    assert asyncio.run(join("203.0.113.9")) == 429
    assert asyncio.run(join("198.51.100.7")) == 200  # another visitor still gets in
    events.clear()  # the first address's events are done
    assert asyncio.run(join("203.0.113.9")) == 200


def test_one_address_holds_half_the_model_requests_places():
    """One address's 8 model requests, each waited for before the next, took all 8 of the compute group's places: a
    four-token request from another address waited 9 s (issue 35). An address may hold half of a
    group's places, so another address always finds one free."""
    import asyncio

    from app import group_shares
    from serve.address_shares import address_share

    assert [address_share(n) for n in (1, 2, 8, 9)] == [1, 1, 4, 4]
    events, _, join = _queue_stub(delay_s=0.01, shares={0: ("compute", address_share(8))})

    async def burst():
        return await asyncio.gather(*(join("203.0.113.9", 0) for _ in range(8)), join("198.51.100.7", 0))

    statuses = asyncio.run(burst())
    assert sorted(statuses[:8]) == [200] * 4 + [429] * 4 and statuses[8] == 200
    events.clear()  # its requests are done: it may send more
    assert asyncio.run(join("203.0.113.9", 0)) == 200
    import app

    demo = app.build_demo(compute_concurrency=8)
    shares = group_shares(demo)
    compute = {f.api_name for i, f in demo.fns.items() if shares.get(i) == ("compute", 4)}
    assert {"generate", "race"} <= compute and ("benchmark", 1) in shares.values()
    step = {f.api_name for i, f in demo.fns.items() if shares.get(i) == ("step", 4)}  # 4 of the 8 Step places
    assert {"step", "scrub", "back", "reset"} <= step


def test_one_address_queues_one_benchmark_at_a_time():
    """The server runs one benchmark at a time for everyone: one address queued three from three sessions and a
    visitor's waited 53 s behind them (issue 35)."""
    import asyncio

    events, _, join = _queue_stub(delay_s=0.01, shares={1: ("benchmark", 1)})

    async def burst():
        return await asyncio.gather(*(join("203.0.113.9", 1) for _ in range(3)), join("198.51.100.7", 1),
                                    join("203.0.113.9", 0))

    statuses = asyncio.run(burst())
    assert sorted(statuses[:3]) == [200, 429, 429] and statuses[3:] == [200, 200]  # other events are not limited
    assert asyncio.run(join("203.0.113.9", 1)) == 429  # its benchmark is still queued
    events.clear()  # done
    assert asyncio.run(join("203.0.113.9", 1)) == 200


def test_a_burst_from_one_address_is_counted_as_it_arrives():
    """30 joins sent together from one address were all accepted (the count saw only events already answered) and
    filled the queue: a place is now held from the check to the answer."""
    import asyncio

    from serve.address_shares import PER_CLIENT_EVENTS

    events, listeners, join = _queue_stub(delay_s=0.05)  # Gradio's join takes a while to answer

    async def burst():
        return await asyncio.gather(*(join("203.0.113.9") for _ in range(30)), join("198.51.100.7"))

    statuses = asyncio.run(burst())
    assert statuses[:30].count(200) == PER_CLIENT_EVENTS and statuses[:30].count(429) == 30 - PER_CLIENT_EVENTS
    assert statuses[30] == 200  # another address is not affected
    assert listeners.queued("203.0.113.9", events) == PER_CLIENT_EVENTS  # no place left held
    events.clear()
    assert asyncio.run(join("203.0.113.9")) == 200


def _event(server: str, api_name: str) -> int:
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(server.rstrip("/") + "/config", timeout=30).read())
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == api_name)


@pytest.mark.parametrize("api_name, route, data, session, status, message", [
    # a lone surrogate as session hash broke Gradio's clean-up of every later event
    ("generate", "queue/join", None, "\ud800", 422, "needs a session_hash: 1 to 256 printable ASCII characters"),
    ("generate", "queue/join", None, " ", 422, "needs a session_hash"),
    ("js_fn", "queue/join", [], "abcdefghijk", 404, "runs in the browser only: there is nothing to call"),
    ("js_fn", "run/predict", [], "abcdefghijk", 404, "direct calls take the page's own events only"),
    ("load_example", "run/predict", ["x"], "abcdefghijk", 422, "example must be a whole number in [0, "),
    ("step_by", "run/predict", ["x"], "abcdefghijk", 422, "step by must be 'iteration' or 'call'"),
    ("load_example", "run/predict", [0], "", 422, "an event needs a session_hash"),
])
def test_the_pages_events_refuse_bad_values_and_sessions_in_one_line_with_a_client_error(
        server, capfd, api_name, route, data, session, status, message):
    """The page's unqueued events answered a refusal with HTTP 500; a browser-only event gave a traceback (issue
    35)."""
    import json

    index = _event(server, api_name)
    if data is None:
        data = ["def f(x):", "packed", 8, 0, 0, 1, 0, 4, "", False, "", "model", 0.8, "ltr", False]
    capfd.readouterr()
    body = json.dumps({"data": data, "fn_index": index, "session_hash": session, "event_data": None,
                       "trigger_id": None})
    code, text = _raw(server, "POST", f"/gradio_api/{route}", body)
    assert code == status and message in json.loads(text)["error"], text[:300]
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("path, body, content_type, line", [
    ("/gradio_api/cancel", {"session_hash": "abcdefgh", "fn_index": "a", "event_id": "x"}, "application/json",
     "fn_index: Input should be a valid integer, unable to parse string as an integer (got 'a')"),
    ("/gradio_api/call/generate", {"data": ["def f(x):"]}, "text/plain",
     "the body: Input should be a valid dictionary or object to extract fields from (send the JSON body with "
     "Content-Type: application/json)"),
])
def test_fastapis_field_by_field_refusals_come_as_one_line(server, path, body, content_type, line):
    """Two refusals were Gradio's (FastAPI's) multi-field JSON: a JSON body sent as text/plain, and a cancel naming
    fn_index "a" (issue 54, item 5)."""
    import http.client

    host, port = server.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": content_type})
    answer = conn.getresponse()
    assert answer.status == 422
    assert json.loads(answer.read()) == {"error": line}
