"""Raw Gradio queue client (what the page does): POST /gradio_api/queue/join with fn_index,
then read /gradio_api/queue/data SSE for that session. Works for every dependency, private ones included."""
import json, os, time, uuid, random, string
import httpx

BASE = os.environ.get("LOAD_URL", "http://127.0.0.1:7911")
API = BASE + "/gradio_api"


def new_session():
    return "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(11))


def call(fn_index, data, session_hash=None, timeout=90.0, trigger_id=None, address=None):
    """Return dict(kind=..., payload=..., wall=...). kind: complete|error|http|timeout|conn. ``address``: sent as
    X-Forwarded-For (the server trusts it from 127.0.0.1), so that one script poses as several visitors."""
    sh = session_hash or new_session()
    t0 = time.time()
    headers = {"X-Forwarded-For": address} if address else {}
    body = {"data": data, "event_data": None, "fn_index": fn_index, "trigger_id": trigger_id, "session_hash": sh}
    try:
        r = httpx.post(API + "/queue/join", json=body, timeout=30, headers=headers)
    except Exception as e:
        return {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}
    if r.status_code != 200:
        return {"kind": "http", "payload": f"{r.status_code} {r.text[:500]}", "wall": time.time() - t0}
    ev = r.json().get("event_id")
    msgs = []
    try:
        with httpx.stream("GET", API + "/queue/data", params={"session_hash": sh}, timeout=timeout,
                          headers=headers) as s:
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


def api_call(name, data, address=None, timeout=120.0):
    """A raw ``POST /gradio_api/call/<name>`` and its result stream: dict(kind=complete|error|http|conn, payload,
    wall)."""
    t0 = time.time()
    headers = {"X-Forwarded-For": address} if address else {}
    try:
        r = httpx.post(f"{API}/call/{name}", json={"data": data}, headers=headers, timeout=30)
        if r.status_code != 200:
            return {"kind": "http", "payload": f"{r.status_code} {r.text[:500]}", "wall": time.time() - t0}
        event, last = None, None
        with httpx.stream("GET", f"{API}/call/{name}/{r.json()['event_id']}", headers=headers, timeout=timeout) as s:
            for line in s.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    last = line[5:].strip()
                    if event in ("complete", "error"):
                        break
        return {"kind": event, "payload": last, "wall": time.time() - t0}
    except Exception as e:
        return {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}


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
