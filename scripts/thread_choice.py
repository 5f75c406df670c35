"""The app's default race on a shared CPU: per-call milliseconds with the old default (torch's threads, OpenMP's
default spin), the measured default (packed_ss.threads) and ``--threads 1``, each beside a bounded CPU burner (one
busy process per core); then four concurrent default races against one.

    python scripts/thread_choice.py --new-tokens 128 --json docs/figures/thread-choice.json

Each setting runs in a process of its own (OpenMP reads its wait setting when torch loads). Prints one Markdown
table: per lane, time/NFE in ms and whether the lane finished within the server's time limit; ``--json`` writes the
same table for docs/app.md (``python -m packed_ss.bench.tables`` draws it). Speed is measured here, never asserted
by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BURN = "import time\nend = time.monotonic() + {s}\nwhile time.monotonic() < end:\n    pass\n"


def one(threads: int | None, races: int, new_tokens: int) -> dict:
    """Run ``races`` default races at once on a fresh server; per lane: the median time/NFE and the cut-off count."""
    sys.path.insert(0, str(ROOT))
    from serve.race import run_race
    from serve.server import Server
    from serve.settings import RequestValues

    server = Server(device="cpu", threads=threads)
    settings = server.settings(RequestValues("", "def fibonacci(n):", "packed", 8, 0.0, 0, 1.0, 0, new_tokens,
                                             False, "", "model", 0.8, "ltr", False))
    results = []

    def race():
        results.append(run_race(server.tasks, settings, max_rows=server.max_rows, max_seconds=server.max_seconds))

    workers = [threading.Thread(target=race) for _ in range(races)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    out = {"wall_s": time.perf_counter() - start, "threads": server.threads.describe(), "lanes": {}}
    for lane in results[0].lanes:
        same = [r.lane(lane.schedule) for r in results]
        out["lanes"][lane.schedule] = {"ms": statistics.median(x.metrics["time_per_nfe_ms"] for x in same),
                                       "cut": sum(x.cut_off for x in same), "tokens": min(x.metrics["tokens"] for x in same)}
    return out


def measure(label: str, env: dict, threads: int | None, races: int, new_tokens: int, burn_s: float) -> dict:
    """:func:`one` in a fresh process with ``env``, beside one burner per core."""
    burners = [subprocess.Popen([sys.executable, "-c", BURN.format(s=burn_s)]) for _ in range(os.cpu_count() or 1)]
    try:
        code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import thread_choice; "
                f"print(json.dumps(thread_choice.one({threads!r}, {races}, {new_tokens})))")
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    finally:
        for b in burners:
            b.kill()
    if done.returncode:
        sys.exit(f"{label}: {done.stderr.strip().splitlines()[-1]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{label}: {result['wall_s']:.1f} s, {result['threads']}", file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128, help="the race's new-token limit (the app's: 128)")
    parser.add_argument("--burn-s", type=float, default=120.0, help="seconds each burner runs at most")
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/thread-choice.json)")
    args = parser.parse_args()
    spin_free = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    cores = os.cpu_count() or 1
    settings = [(f"before: {cores} threads, OpenMP's default spin", {**spin_free, "GOMP_SPINCOUNT": "300000"}, cores, 1),
                ("measured default", spin_free, None, 1),
                ("--threads 1", spin_free, 1, 1),
                ("measured default, 4 races at once", spin_free, None, 4)]
    rows = [(label, measure(label, env, threads, races, args.new_tokens, args.burn_s))
            for label, env, threads, races in settings]
    lanes = list(rows[0][1]["lanes"])
    print(f"Default race ({args.new_tokens} new tokens, B = 8), {cores} burner processes beside it; time/NFE in ms "
          f"(median over the races), '(cut)' where the time limit stopped the lane.\n")
    print("| setting | threads chosen | " + " | ".join(lanes) + " | wall (s) |")
    print("|---" * (len(lanes) + 3) + "|")
    grid = []
    for label, result in rows:
        cells = [f"{v['ms']:.2f}" + (" (cut)" if v["cut"] else "") for v in result["lanes"].values()]
        print(f"| {label} | {result['threads'].split(' (')[0]} | " + " | ".join(cells)
              + f" | {result['wall_s']:.1f} |")
        grid.append([label, result["threads"].split(" (")[0], *cells, result["wall_s"]])
    if args.json:
        sys.path.insert(0, str(ROOT))
        from packed_ss.bench.grid import Column, save

        save(args.json, [Column("setting"), Column("threads chosen"), *(Column(f"{lane} (ms)") for lane in lanes),
                         Column("race wall (s)", 1)], grid,
             note=f"the default race, {args.new_tokens} new tokens, B = 8, beside {cores} CPU-burning processes; "
                  f"time/NFE per lane, the median over the races, (cut) where the time limit stopped the lane")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
