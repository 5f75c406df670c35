"""Milliseconds of a 1-row native eager call after 150 tokens under OpenMP's wait settings and thread counts, on an
idle machine and beside busy processes: each setting in a fresh process (OpenMP reads its settings when torch loads).

    python scripts/omp_wait.py --burn 2 --repeats 3 --json docs/figures/omp-wait.json

Measures every setting at 1 thread and at every core, idle, then (``--burn N``) beside N CPU-burning processes;
prints one line per measurement: the median over ``--repeats`` fresh processes (taken in turn) of each process's
median of 100 calls after 20 warm-up calls. One process's figure can be far off another's, so take 3 or more. With
``--json`` it writes the
table docs/speed.md shows (``python -m packed_ss.bench.tables`` draws it). Speed is measured here, never asserted by
a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # the row's label -> the environment it sets
    "OpenMP's default wait (spins about 300,000 times)": {},
    "`OMP_WAIT_POLICY=PASSIVE`": {"OMP_WAIT_POLICY": "PASSIVE"},
    "`GOMP_SPINCOUNT=10000` (the project's default)": {"GOMP_SPINCOUNT": "10000"},
}


def one(threads: int) -> float:
    """Median ms of a 1-row call in this process (torch imported here, after the environment is set)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from packed_ss.cli import quiet_loaders
    from packed_ss.layout import prefill_layout, verify_layout
    from packed_ss.models import DualModeModel

    torch.set_num_threads(threads)
    quiet_loaders()
    model = DualModeModel.from_pretrained(ROOT / "assets" / "model", device="cpu")
    prefix = list(range(5, 155))
    model.reset(len(prefix) + 9, block_size=4)
    model.forward(prefill_layout(prefix[:-1], 0, model.mask_token_id), (len(prefix) - 2,))
    cached = model.cache_length
    layout = verify_layout([prefix[-1]], [], cached)
    times = []
    for _ in range(120):
        start = time.perf_counter()
        model.forward(layout, layout.verify_rows)
        times.append((time.perf_counter() - start) * 1000)
        model.rollback(cached)
    return statistics.median(times[20:])


def measure(env: dict, threads: int) -> float | None:
    """One setting's median in a fresh process; None (and the error on stderr) where the process failed."""
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, __file__, "--one", str(threads)], env={**base, **env},
                          capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stderr.strip()[-300:], file=sys.stderr)
        return None
    return float(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn", type=int, default=0, help="CPU-burning processes beside the calls (default 0)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per measurement (default 3)")
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/omp-wait.json)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one))
        return 0
    thread_counts = sorted({1, os.cpu_count() or 1})
    phases = [0] + ([args.burn] if args.burn > 0 else [])
    found = {}
    for burn in phases:
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burn)]
        try:
            runs: dict[tuple, list[float]] = {}
            for _ in range(max(1, args.repeats)):  # in turn, so that a slow spell of the machine hits every setting
                for label, env in SETTINGS.items():
                    for threads in thread_counts:
                        ms = measure(env, threads)
                        runs.setdefault((label, threads), []).extend([] if ms is None else [ms])
            for (label, threads), times in runs.items():
                found[label, burn, threads] = ms = statistics.median(times) if times else None
                print(f"{label[:28]:28} beside {burn} busy, {threads} thread(s): "
                      + (f"{ms:.2f} ms (processes: {', '.join(f'{t:.2f}' for t in times)})" if ms is not None
                         else "failed"), flush=True)
        finally:
            for b in burners:
                b.kill()
    if args.json:
        sys.path.insert(0, str(ROOT))
        from packed_ss.bench.grid import Column, save

        keys = [(burn, threads) for burn in phases for threads in thread_counts]
        columns = [Column("setting")] + [
            Column(f"{'idle' if burn == 0 else f'beside {burn} busy processes'}, {threads} "
                   f"thread{'s' if threads > 1 else ''} (ms)", 2) for burn, threads in keys]
        rows = [[label] + [found[label, burn, threads] for burn, threads in keys] for label in SETTINGS]
        save(args.json, columns, rows, note=f"1-row native eager call after 150 tokens; per process the median of 100 "
                                            f"calls, then the median of {args.repeats} processes")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
