"""Microseconds of the shipped model's 17 projections, chained in one compiled graph, per register blocking of
inductor's float32 micro-GEMM and per row count (packed_ss/models/gemm_blocking.py).

Each blocking is measured in a fresh process of this script (``--worker``), since inductor keeps what it compiled:
the chain is the shipped model's shapes (per layer q|k|v 256 -> 768, o 256 -> 256, gate|up 256 -> 1,536, down
768 -> 256, four layers, then the LM head 256 -> 4,096) with random float32 weights frozen into the graph, compiled
with the engine's settings (``freezing``, ``max_autotune`` over the C++ template and ATen, the C++ wrapper). The
figure is the best of 5 repeats of the mean over ``--calls`` calls.

    python scripts/gemm_blocking.py --threads 1 --json docs/figures/gemm-blocking.json

Prints one Markdown table; ``--json`` writes it for docs/speed.md (``python -m packed_ss.bench.tables`` draws it).
Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCKINGS = ("torch", "6,32")  # torch's own choice (8, 48 here) and the engine's
ROWS = (1, 4, 6, 8, 12)
SHAPES = ((256, 768), (256, 256), (256, 1536), (768, 256))  # (in, out) of one layer's projections


def worker(blocking: str, rows: list[int], calls: int, threads: int) -> dict[int, float]:
    """Microseconds per chained call for each row count, compiled with ``blocking`` ("torch" or "rows,columns")."""
    import contextlib

    import torch
    import torch._inductor.config as inductor

    from packed_ss.models.gemm_blocking import few_row_blocking

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=generator) * 0.05 for _ in range(4) for k, n in SHAPES]
    head = torch.randn(4096, 256, generator=generator) * 0.05

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.ParameterList([torch.nn.Parameter(w, requires_grad=False) for w in weights])
            self.head = torch.nn.Parameter(head, requires_grad=False)

        def forward(self, x):
            for layer in range(4):
                qkv = torch.nn.functional.linear(x, self.w[4 * layer])
                h = x + torch.nn.functional.linear(qkv[:, :256] * qkv[:, 256:512], self.w[4 * layer + 1])
                gate_up = torch.nn.functional.linear(h, self.w[4 * layer + 2])
                inner = torch.nn.functional.silu(gate_up[:, :768]) * gate_up[:, 768:]
                x = h + torch.nn.functional.linear(inner, self.w[4 * layer + 3])
            return torch.nn.functional.linear(x, self.head)

    def swap():
        if blocking == "torch":
            return contextlib.nullcontext()
        return few_row_blocking((*map(int, blocking.split(",")), 1))

    options = {"freezing": True, "cpp_wrapper": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
               "autotune_num_choices_displayed": 0}
    torch._dynamo.config.recompile_limit = 64
    chain = Chain().eval()
    out = {}
    for count in rows:
        x = torch.randn(count, 256, generator=generator)
        with torch.no_grad(), inductor.patch(options), swap():
            compiled = torch.compile(chain, dynamic=False, fullgraph=True)
            compiled(x)
        with torch.no_grad():
            for _ in range(50):
                compiled(x)
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(calls):
                    compiled(x)
                best = min(best, (time.perf_counter() - start) / calls * 1e6)
        out[count] = best
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/gemm-blocking.json)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, list(ROWS), args.calls, args.threads)))
        return 0
    from packed_ss.models.gemm_blocking import blocking_problem

    problem = blocking_problem()
    if problem:
        print(f"nothing to compare: {problem}", file=sys.stderr)
        return 1
    table = {}
    for blocking in BLOCKINGS:
        with tempfile.TemporaryDirectory(prefix="packed-ss-inductor-") as cache:  # nothing reused between sides
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
            done = subprocess.run([sys.executable, __file__, "--worker", blocking, "--calls", str(args.calls),
                                   "--threads", str(args.threads)], env=env, capture_output=True, text=True,
                                  check=False)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        table[blocking] = {int(k): v for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}
        print(f"{blocking}: " + ", ".join(f"{r} rows {table[blocking][r]:.0f} us" for r in ROWS), file=sys.stderr)
    names = {"torch": "torch's choice", "6,32": "(6, 32), the engine's"}
    print("| blocking | " + " | ".join(f"{r} row{'s' if r > 1 else ''} (us)" for r in ROWS) + " |")
    print("|---" * (1 + len(ROWS)) + "|")
    for blocking in BLOCKINGS:
        print(f"| {names[blocking]} | " + " | ".join(f"{table[blocking][r]:.0f}" for r in ROWS) + " |")
    if args.json:
        from packed_ss.bench.grid import Column, save

        columns = [Column("register blocking")] + [Column(f"{r} row{'s' if r > 1 else ''} (us)", 0) for r in ROWS]
        save(args.json, columns, [[names[b]] + [table[b][r] for r in ROWS] for b in BLOCKINGS],
             note=f"the shipped model's 17 projections chained, compiled, {args.threads} thread(s), best of 5 means "
                  f"of {args.calls} calls")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
