"""Milliseconds of a 1-row and a 12-row native eager call after 150 tokens under OpenMP wait settings and thread
counts, idle or beside busy processes: each setting in a fresh process (OpenMP reads its settings when torch loads).

    python scripts/omp_wait.py            # idle
    python scripts/omp_wait.py --burn 2   # beside two CPU-burning processes

Prints one line per setting: the wait setting, threads, median ms at 1 and 12 rows (100 calls after 20 warm-up
calls). Speed is measured here, never asserted by a test.
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
SETTINGS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"}, "spin10000": {"GOMP_SPINCOUNT": "10000"}}


def one(threads: int) -> str:
    """Median ms of 1-row and 12-row calls in this process (torch imported here, after the environment is set)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from packed_ss.cli import quiet_loaders
    from packed_ss.layout import prefill_layout, verify_layout
    from packed_ss.models import DualModeModel

    torch.set_num_threads(threads)
    quiet_loaders()
    model = DualModeModel.from_pretrained(ROOT / "assets" / "model", device="cpu")
    prefix = list(range(5, 155))
    out = []
    for rows in (1, 12):
        model.reset(len(prefix) + rows + 8, block_size=max(4, rows))
        model.forward(prefill_layout(prefix[:-1], 0, model.mask_token_id), (len(prefix) - 2,))
        cached = model.cache_length
        layout = verify_layout([prefix[-1]], list(prefix[:rows - 1]), cached)
        times = []
        for _ in range(120):
            start = time.perf_counter()
            model.forward(layout, layout.verify_rows)
            times.append((time.perf_counter() - start) * 1000)
            model.rollback(cached)
        out.append(f"{rows} rows {statistics.median(times[20:]):.2f} ms")
    return ", ".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn", type=int, default=0, help="CPU-burning processes beside the calls (default 0)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(one(args.one))
        return 0
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    try:
        for name, env in SETTINGS.items():
            for threads in (1, os.cpu_count() or 1):
                done = subprocess.run([sys.executable, __file__, "--one", str(threads)], env={**base, **env},
                                      capture_output=True, text=True)
                line = done.stdout.strip().splitlines()[-1] if done.returncode == 0 else done.stderr.strip()[-200:]
                print(f"{name:10} {threads} thread{'s' if threads > 1 else ' '}: {line}", flush=True)
    finally:
        for b in burners:
            b.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
