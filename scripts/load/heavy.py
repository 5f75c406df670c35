"""Heavy requests with long prompts against a running app (``LOAD_URL``, default http://127.0.0.1:7911): each one's
admission and wall time. Usage: ``PYTHONPATH=scripts/load python scripts/load/heavy.py TAG`` (TAG names the run,
e.g. burn or noburn); writes heavy-TAG.json. Run a CPU-burning process beside the server for the loaded case."""
import json, sys, time
from gradio_client import Client
import qclient as q

TAG = sys.argv[1]
only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
import argparse as _stdlib
SOURCE = open(_stdlib.__file__, encoding="utf-8").read()  # Python 3.11's argparse.py: real code as a long prompt
P = SOURCE[:6357]  # about 1,800 tokens of the embedded model
c = Client(q.BASE, verbose=False)
ALL = "lookup,packed-mixed,partial,diffusion"

P15 = SOURCE[:5163]  # about 1,500 tokens
SHORT = "def f(x):"
cases = [
    ("race all lanes B=8 L=128 p1800", "/race", P, dict(block_size=8, max_new_tokens=128, lanes=ALL)),
    ("race all lanes B=8 L=232 p1800", "/race", P, dict(block_size=8, max_new_tokens=232, lanes=ALL)),
    ("race all lanes B=2 L=244 scripted q=0 p1800", "/race", P, dict(block_size=2, max_new_tokens=244, lanes=ALL, drafter="scripted", drafter_quality=0.0)),
    ("race all lanes B=16 L=64 p1800", "/race", P, dict(block_size=16, max_new_tokens=64, lanes=ALL)),
    ("race all lanes B=2 L=512 scripted q=0 p1500", "/race", P15, dict(block_size=2, max_new_tokens=512, lanes=ALL, drafter="scripted", drafter_quality=0.0)),
    ("race all lanes B=2 L=300 scripted q=0 p1500", "/race", P15, dict(block_size=2, max_new_tokens=300, lanes=ALL, drafter="scripted", drafter_quality=0.0)),
    ("race all lanes B=2 L=340 scripted q=0 p1500", "/race", P15, dict(block_size=2, max_new_tokens=340, lanes=ALL, drafter="scripted", drafter_quality=0.0)),
    ("race all lanes B=2 L=240 scripted q=0 p1800", "/race", P, dict(block_size=2, max_new_tokens=240, lanes=ALL, drafter="scripted", drafter_quality=0.0)),
    ("race default lanes B=2 L=244 p1800", "/race", P, dict(block_size=2, max_new_tokens=244)),
    ("race all lanes B=8 L=512 p1500", "/race", P15, dict(block_size=8, max_new_tokens=512, lanes=ALL)),
    ("generate quadratic B=32 L=93 p1800", "/generate", P, dict(schedule="quadratic", block_size=32, max_new_tokens=93)),
    ("generate quadratic B=32 L=94 p1800", "/generate", P, dict(schedule="quadratic", block_size=32, max_new_tokens=94)),
    ("generate quadratic B=32 L=184 p1800", "/generate", P, dict(schedule="quadratic", block_size=32, max_new_tokens=184)),
    ("generate packed B=8 L=232 p1800", "/generate", P, dict(schedule="packed", block_size=8, max_new_tokens=232)),
    ("generate packed B=8 L=512 p1500", "/generate", P15, dict(schedule="packed", block_size=8, max_new_tokens=512)),
    ("generate linear B=2 L=512 p1500", "/generate", P15, dict(schedule="linear", block_size=2, max_new_tokens=512)),
    ("generate ar L=512 p1500", "/generate", P15, dict(schedule="ar", max_new_tokens=512)),
    ("generate diffusion B=32 L=512 p1500", "/generate", P15, dict(schedule="diffusion", block_size=32, max_new_tokens=512)),
    ("generate packed L=513 (over cap)", "/generate", SHORT, dict(schedule="packed", max_new_tokens=513)),
]
STEP = [
    ("step quadratic B=32 L=93 p1800", ["assets/model", P, "quadratic", 32, 0, 0, 1, 0, 93, False, "", "model", 0.8, "ltr", False]),
    ("step quadratic B=32 L=94 p1800", ["assets/model", P, "quadratic", 32, 0, 0, 1, 0, 94, False, "", "model", 0.8, "ltr", False]),
    ("step packed B=8 L=512 p1500", ["assets/model", P15, "packed", 8, 0, 0, 1, 0, 512, False, "", "model", 0.8, "ltr", False]),
    ("step linear B=2 L=512 p1500", ["assets/model", P15, "linear", 2, 0, 0, 1, 0, 512, False, "", "model", 0.8, "ltr", False]),
]

out = []
for name, api, prompt, kw in cases:
    if only and name not in only:
        continue
    t0 = time.time()
    try:
        r = c.predict(prompt, api_name=api, **kw)
        wall = time.time() - t0
        rec = dict(request=name, admitted=True, wall=round(wall, 2), cut_off=r.get("cut_off"),
                   stop_reason=r.get("stop_reason") or {k: (l.get("stop_reason"), l.get("tokens"), len(l.get("slices") or [])) for k, l in (r.get("lanes") or {}).items()},
                   note=r.get("note"), tokens=r.get("tokens"), server_wall_s=r.get("wall_s"),
                   keys=sorted(r.keys()))
        if api == "/race":
            rec["race"] = {k: r.get(k) for k in ("verdict", "cut_off", "rounds", "stopped_at_tokens", "compute_s", "interleaved_iterations", "isolation")}
        rec["raw_head"] = json.dumps({k: v for k, v in r.items() if k not in ("lanes", "token_ids", "text", "model_note")})[:1200]
    except Exception as e:
        rec = dict(request=name, admitted=False, wall=round(time.time() - t0, 2), refusal=str(e)[:600])
    print(json.dumps(rec)[:1500], flush=True)
    out.append(rec)

for name, data in STEP:
    if only and name not in only:
        continue
    r = q.call_named("step", data, timeout=120)
    last = r["payload"][-1] if r["kind"] == "complete" else r["payload"]
    rec = dict(request=name, kind=r["kind"], wall=round(r["wall"], 2), admitted=not ("pss-error" in str(last)),
               answer=str(last)[:600])
    print(json.dumps(rec), flush=True)
    out.append(rec)

json.dump(out, open(f"heavy-{TAG}.json", "w"), indent=1)
