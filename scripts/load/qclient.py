"""Raw Gradio queue client (what the page does): POST /gradio_api/queue/join with fn_index,
then read /gradio_api/queue/data SSE for that session. Works for every dependency, private ones included."""
import json, os, time, uuid, random, string
import httpx

BASE = os.environ.get("LOAD_URL", "http://127.0.0.1:7911")
API = BASE + "/gradio_api"


def new_session():
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(11))


def call(fn_index, data, session_hash=None, timeout=90.0, trigger_id=None):
    """Return dict(kind=..., payload=..., wall=...). kind: complete|error|http|timeout|conn."""
    sh = session_hash or new_session()
    t0 = time.time()
    body = {"data": data, "event_data": None, "fn_index": fn_index, "trigger_id": trigger_id, "session_hash": sh}
    try:
        r = httpx.post(API + "/queue/join", json=body, timeout=30)
    except Exception as e:
        return {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}
    if r.status_code != 200:
        return {"kind": "http", "payload": f"{r.status_code} {r.text[:500]}", "wall": time.time() - t0}
    ev = r.json().get("event_id")
    msgs = []
    try:
        with httpx.stream("GET", API + "/queue/data", params={"session_hash": sh}, timeout=timeout) as s:
            for line in s.iter_lines():
                if time.time() - t0 > timeout:
                    return {"kind": "timeout", "payload": msgs[-3:], "wall": time.time() - t0}
                if not line.startswith("data:"):
                    continue
                m = json.loads(line[5:])
                if m.get("event_id") not in (None, ev):
                    continue
                msgs.append(m.get("msg"))
                if m.get("msg") == "process_completed":
                    out = m.get("output", {})
                    wall = time.time() - t0
                    if m.get("success") and "error" not in out:
                        return {"kind": "complete", "payload": out.get("data"), "wall": wall}
                    return {"kind": "error", "payload": {"error": out.get("error"), "title": out.get("title")}, "wall": wall}
                if m.get("msg") == "close_stream":
                    break
    except httpx.ReadTimeout:
        return {"kind": "timeout", "payload": msgs[-3:], "wall": time.time() - t0}
    except Exception as e:
        return {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}
    return {"kind": "nostream", "payload": msgs[-3:], "wall": time.time() - t0}


def alive():
    try:
        r = httpx.get(BASE + "/config", timeout=10)
        return r.status_code == 200
    except Exception:
        return False


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1])


_INDEX: dict[str, int] = {}


def fn_index(name: str) -> int:
    """The page's dependency index of the event whose ``api_name`` is ``name`` (private ones included)."""
    if not _INDEX:
        config = httpx.get(BASE + "/config", timeout=30).json()
        _INDEX.update({d.get("api_name"): d["id"] for d in config["dependencies"]})
    return _INDEX[name]


def call_named(name, data, **kwargs):
    """:func:`call` for the event named ``name`` (see :func:`fn_index`)."""
    return call(fn_index(name) if isinstance(name, str) else name, data, **kwargs)
