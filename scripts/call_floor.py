"""Milliseconds per model call at 1, 12 and 24 rows after the same prefix, on every path that runs the weights.

Paths: the native forward (eager and compiled), transformers' forward (eager and compiled, static cache), and
llama.cpp (where llama-cpp-python is installed) on the same weights in GGUF. Each call is a causal block of R rows
over a cache of ``--prefix`` tokens (the tokens of a held-out HumanEval prompt), rolled back after it, so that every
path computes the same call again and again; the figure is the median of ``--calls`` calls after warm-up calls.

    python scripts/call_floor.py --threads 2 --prefix 150 --calls 200 --json docs/figures/call-floor.json

Prints one Markdown table (ms per call, and each path's ratio to llama.cpp at the same rows) and the load average;
``--json`` writes the same table for docs/speed.md (``python -m packed_ss.bench.tables`` draws it).
Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ROWS = (1, 12, 24)


def engine_calls(model, prefix: list[int], rows: int, calls: int, warm: int) -> float:
    """Median ms of a causal call of ``rows`` rows after ``prefix`` (minus its last token) through ``model``."""
    from packed_ss.layout import prefill_layout, verify_layout

    model.reset(len(prefix) + rows + 8, block_size=rows if rows > 1 else 4)
    model.forward(prefill_layout(prefix[:-1], 0, model.mask_token_id), (len(prefix) - 2,))
    cached = model.cache_length
    layout = verify_layout([prefix[-1]], list(prefix[:rows - 1]), cached)
    times = []
    for index in range(warm + calls):
        out = model.forward(layout, layout.verify_rows)
        model.rollback(cached)
        if index >= warm:
            times.append(out.model_ms)
    return statistics.median(times)


def llamacpp_calls(model, prefix: list[int], rows: int, calls: int, warm: int) -> float:
    from packed_ss.llamacpp import LlamaCppModel

    lane = LlamaCppModel(model) if not hasattr(llamacpp_calls, "lane") else llamacpp_calls.lane
    llamacpp_calls.lane = lane
    llm = lane.llm
    llm.reset()
    llm.eval(list(prefix[:-1]))
    cached = llm.n_tokens
    block = [prefix[-1], *prefix[:rows - 1]]
    times = []
    for index in range(warm + calls):
        llm.n_tokens = cached
        start = time.perf_counter()
        llm.eval(block)
        elapsed = (time.perf_counter() - start) * 1000
        if index >= warm:
            times.append(elapsed)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "assets" / "model"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefix", type=int, default=150, help="tokens before the call (default 150)")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warm", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/call-floor.json)")
    args = parser.parse_args()
    import torch

    from packed_ss.bench.plan import load_prompts
    from packed_ss.cli import quiet_loaders
    from packed_ss.llamacpp import llamacpp_problem
    from packed_ss.models import DualModeModel

    torch.set_num_threads(args.threads)
    quiet_loaders()
    base = DualModeModel.from_pretrained(args.model, device="cpu")
    text = "\n".join(p.text for p in load_prompts("humaneval", None)[:3])
    prefix = base.encode(text)[:args.prefix]
    paths = {"native, eager": base, "native, compiled": base.share(compiled=True),
             "transformers, eager": DualModeModel(base.model, base.tokenizer, base.mask_token_id, base.eos_token_id,
                                                  path="transformers"),
             "transformers, compiled": DualModeModel(base.model, base.tokenizer, base.mask_token_id,
                                                     base.eos_token_id, path="transformers", compiled=True)}
    table = {}
    for name, model in paths.items():
        for rows in ROWS:
            engine_calls(model, prefix, rows, 2, 1)  # compiles the shape (compiled paths), untimed
            table[name, rows] = engine_calls(model, prefix, rows, args.calls, args.warm)
            print(f"{name:24} {rows:3} rows: {table[name, rows]:.3f} ms", file=sys.stderr)
    if llamacpp_problem(base) is None:
        for rows in ROWS:
            table["llama.cpp", rows] = llamacpp_calls(base, prefix, rows, args.calls, args.warm)
            print(f"{'llama.cpp':24} {rows:3} rows: {table['llama.cpp', rows]:.3f} ms", file=sys.stderr)
    names = list(dict.fromkeys(name for name, _ in table))
    print(f"Prefix {len(prefix)} tokens, {args.threads} threads, median of {args.calls} calls; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end.\n")
    print("| path | " + " | ".join(f"{r} row{'s' if r > 1 else ''} (ms)" for r in ROWS)
          + (" | " + " | ".join(f"/ llama.cpp at {r}" for r in ROWS) if "llama.cpp" in names else "") + " |")
    print("|---" * (1 + len(ROWS) * (2 if "llama.cpp" in names else 1)) + "|")
    for name in names:
        cells = [f"{table[name, r]:.3f}" for r in ROWS]
        if "llama.cpp" in names:
            cells += [f"{table[name, r] / table['llama.cpp', r]:.2f}x" for r in ROWS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        from packed_ss.bench.grid import Column, save

        columns = [Column("path")] + [Column(f"{r} row{'s' if r > 1 else ''} (ms)", 3) for r in ROWS]
        rows = [[name] + [table[name, r] for r in ROWS] for name in names]
        if "llama.cpp" in names:
            columns += [Column(f"/ llama.cpp at {r}", 2, "x") for r in ROWS]
            rows = [row + [table[row[0], r] / table["llama.cpp", r] for r in ROWS] for row in rows]
        save(args.json, columns, rows, note=f"causal call after {len(prefix)} tokens, {args.threads} threads, "
                                            f"median of {args.calls} calls")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
