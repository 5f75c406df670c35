"""The time budget against real time: heavy races on the embedded model, each with its predicted worst case
(``serve.limits.worst_case_seconds`` at the model's fitted call cost) and, when admitted, its measured time.

Usage: ``python scripts/measure_time_budget.py [--threads 2] [--max-seconds 20]``. Runs in this process
(no server); one measurement per lane where the budget allows no more.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LONG = ("def f(x):\n    return x + 1\n" * 200)[:3679]  # about 1,500 tokens
ALL_LANES = ["lookup", "packed-mixed", "partial", "diffusion"]
CASES = [  # (label, request values, optional lanes)
    ("scripted q = 0, B = 2, 512 tokens, every lane, 1,500-token prompt",
     dict(prompt=LONG, block_size=2, max_new_tokens=512, drafter="scripted", drafter_quality=0.0), ALL_LANES),
    ("scripted q = 0, B = 2, 300 tokens, default lanes, 1,500-token prompt",
     dict(prompt=LONG, block_size=2, max_new_tokens=300, drafter="scripted", drafter_quality=0.0),
     ["lookup", "packed-mixed"]),
    ("B = 8, 512 tokens, default lanes", dict(prompt="def fibonacci(n):\n", block_size=8, max_new_tokens=512),
     ["lookup", "packed-mixed"]),
    ("B = 8, 512 tokens, lookup, packed-mixed and diffusion lanes",
     dict(prompt="def fibonacci(n):\n", block_size=8, max_new_tokens=512), ["lookup", "packed-mixed", "diffusion"]),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=20.0)
    args = parser.parse_args()
    import torch

    from serve.errors import UserError
    from serve.race import run_race
    from serve.server import Server
    from serve.settings import RequestValues

    torch.set_num_threads(args.threads)
    server = Server(max_seconds=args.max_seconds)
    cost = server.tasks.cost(("", "", None))
    print(f"fitted call cost: tau = {cost.tau_ms:.2f} ms, delta = {cost.delta_ms:.4f} ms/row, mu = {cost.mu_ms:.5f} "
          f"ms/key, kappa = {cost.kappa_ms:.2e} ms/(row key); budget {args.max_seconds:g} s\n")
    print("| race | outcome | rounds | measured (s) |")
    print("|---|---|---|---|")
    for label, values, lanes in CASES:
        start = time.perf_counter()
        try:
            result = run_race(server.tasks, RequestValues(**values).settings(), extra=lanes,
                              max_rows=server.max_rows, max_seconds=server.max_seconds)
        except UserError as error:
            print(f"| {label} | refused: {str(error).split(';')[0]} | - | - |", flush=True)
            continue
        outcome = (f"admitted, cut off at the limit: {', '.join(result.cut_off)}" if result.cut_off else
                   f"admitted, every lane stopped at {result.stopped_at} tokens" if result.stopped_at else "admitted")
        print(f"| {label} | {outcome} | {result.rounds} | {time.perf_counter() - start:.1f} |", flush=True)


if __name__ == "__main__":
    main()
