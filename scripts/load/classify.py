"""Classify fuzz-results.jsonl into (a) clear one-line refusal, (b) traceback / {"error": null} / unrelated
exception / dropped answer, (c) accepted silently though it should be refused, (d) server stopped answering;
'ok' = accepted and the value is a legitimate input (null/"" = the parameter's default, plain text prompt...)."""
import json, collections
import sys
R = [json.loads(l) for l in open(sys.argv[1] if len(sys.argv) > 1 else "fuzz-results.jsonl")]

def cls(r):
    k, a, ep, p, v = r["kind"], r["answer"], r["endpoint"], r["param"], r["value"]
    if k in ("timeout", "nostream"):
        return "d"
    if k == "conn":
        return "b"  # answer dropped mid-stream; the server kept answering (checked after each)
    if k == "error":
        e = json.loads(a).get("error") if a.startswith("{") and "...(+" not in a else a
        if e is None or "Traceback" in str(e):
            return "b"
        return "a"
    if k == "http":
        return "a"
    # complete
    if "pss-error" in a:
        return "a"
    if v == "huge" and p in ("temperature", "top_k"):
        return "c"
    if ep == "/race" and p == "lanes" and v in ("ar", "quadratic"):
        return "c"
    if ep == "benchmark_run" and p == "source":
        return "c"
    if ep in ("replay", "load_example", "on_model", "scrub", "GET /gradio_api/file="):
        return "c"
    if ep == "step_by" and v != "call":
        return "c"
    return "ok"

C = collections.defaultdict(list)
for r in R:
    C[cls(r)].append(r)
print({k: len(v) for k, v in sorted(C.items())}, "total", len(R))
for k in "bcd":
    print(f"\n== ({k}) {len(C[k])}")
    for r in C[k]:
        print(f'#{r["i"]} {r["endpoint"]} [{r["param"]}] = {r["value"][:70]!s} -> {r["kind"]}: {r["answer"][:150]}')
print("\n== ok (legitimate values accepted)", len(C["ok"]))
print(collections.Counter((r["endpoint"], r["param"], r["value"][:20]) for r in C["ok"]).most_common())
