"""Where a 1-row model call's time goes on this machine, and the decoder's own (non-model) share.

    python scripts/profile_call.py --threads 2 --limit 20 --block-size 6

Part 1 times a single-row causal call (an AR step) over a cached prompt and splits it with
``torch.profiler``: the self CPU time of the tensor operators (matrix products, attention, cache
concatenation, the rest) against the wall time of the call; what is left is Python and dispatch in the
framework (``torch.nn`` modules, transformers' layers, mask and cache bookkeeping). It also prints the
arithmetic the call needs (2 x parameters FLOPs per row) and what that costs at the matrix products'
measured rate.

Part 2 runs Packed-SS on HumanEval prompts and prints the engine's non-model decoder time (everything
between model calls: layouts, masks, argmax, acceptance, cache rollback, records) as a share of wall.

``--json PATH`` writes part 1's split and part 2's share as the table docs/speed.md shows
(``python -m packed_ss.bench.tables`` draws it). Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GROUPS = {  # operator name -> group shown in the table
    "aten::mm": "matrix products", "aten::addmm": "matrix products", "aten::bmm": "matrix products",
    "aten::matmul": "matrix products", "aten::linear": "matrix products",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention kernel",
    "aten::scaled_dot_product_attention": "attention kernel",
    "aten::_scaled_dot_product_attention_math": "attention kernel",
    "aten::cat": "concatenation (aten::cat)",
}


def one_row_call(model, prompt: list[int]):
    """A closure running one AR step (1 row) after ``prompt`` is cached, then trimming the cache back."""
    from packed_ss.layout import prefill_layout, verify_layout

    model.reset()
    first = prefill_layout(prompt, 0, model.mask_token_id)
    model.forward(first, first.verify_rows)
    model.rollback(len(prompt) - 1)
    layout = verify_layout([prompt[-1]], [], len(prompt) - 1, name="ar")

    def step():
        out = model.forward(layout, layout.verify_rows)
        model.rollback(len(prompt) - 1)
        return out

    return step


def profile_one_row(model, prompt: list[int], repeats: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    step = one_row_call(model, prompt)
    for _ in range(20):
        step()
    times = []
    for _ in range(repeats):
        times.append(step().model_ms)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        profiled_ms = (time.perf_counter() - start) * 1000 / repeats  # the profiler slows every operator
    groups: dict[str, float] = {}
    total_ops, op_calls = 0.0, 0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        group = GROUPS.get(event.key, "other tensor operators")
        groups[group] = groups.get(group, 0.0) + event.self_cpu_time_total
        total_ops += event.self_cpu_time_total
        op_calls += event.count
    call_ms = statistics.median(times)
    per_call = {k: v / repeats / 1000 for k, v in groups.items()}  # ms per call (profiled)
    params = sum(p.numel() for p in model.model.parameters())
    embed = model.model.get_input_embeddings().weight.numel()
    flops = 2 * (params - embed)  # one row through every layer and the LM head
    mm_ms = per_call.get("matrix products", 0.0)
    return dict(call_ms=call_ms, groups=per_call, ops_ms=total_ops / repeats / 1000, profiled_ms=profiled_ms,
                flops=flops, threads=torch.get_num_threads(), mm_ms=mm_ms, op_calls=op_calls / repeats)


def decoder_share(model, prompts: list[list[int]], block_size: int, new_tokens: int) -> dict:
    from packed_ss import DecodeConfig, generate

    config = DecodeConfig(block_size=block_size, max_new_tokens=new_tokens)
    generate(model, prompts[0], config, "packed")  # warm-up
    model_s = other_s = 0.0
    iterations = 0
    start = time.perf_counter()
    for ids in prompts:
        run = generate(model, ids, config, "packed")
        model_s, other_s = model_s + run.model_s, other_s + run.other_s
        iterations += len(run.records)
    return dict(model_s=model_s, other_s=other_s, iterations=iterations, wall=time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=20, help="HumanEval prompts for part 2")
    parser.add_argument("--block-size", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=200, help="1-row calls timed and profiled")
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/profile-call.json)")
    args = parser.parse_args(argv)
    import torch

    from packed_ss.bench.plan import load_prompts
    from packed_ss.models import DualModeModel

    torch.set_num_threads(args.threads)
    model = DualModeModel.from_pretrained(args.model, device="cpu", dtype="float32")
    prompts = [model.encode(p.text) for p in load_prompts("humaneval", args.limit)]

    found = profile_one_row(model, prompts[0], args.repeats)
    call = found["profiled_ms"]
    print(f"1-row call after a {len(prompts[0])}-token prompt ({found['threads']} threads): median "
          f"{found['call_ms']:.2f} ms over {args.repeats} calls; {call:.2f} ms each under the profiler, which "
          f"splits it (shares of the profiled time), {found['op_calls']:.0f} tensor operators per call:")
    for group, ms in sorted(found["groups"].items(), key=lambda kv: -kv[1]):
        print(f"  {group:28s} {ms:6.3f} ms  {100 * ms / call:5.1f}%")
    rest = max(0.0, call - found["ops_ms"])
    print(f"  {'Python and dispatch (rest)':28s} {rest:6.3f} ms  {100 * rest / call:5.1f}%")
    print(f"  arithmetic: {found['flops'] / 1e6:.1f} MFLOP per row; the matrix products ran at "
          f"{found['flops'] / max(found['mm_ms'], 1e-9) / 1e6:.1f} GFLOP/s (profiled); the whole call averages "
          f"{1000 * found['call_ms'] / found['op_calls']:.1f} us per tensor operator unprofiled")

    share = decoder_share(model, prompts, args.block_size, args.max_new_tokens)
    total = share["model_s"] + share["other_s"]
    print(f"Packed-SS, B = {args.block_size}, {len(prompts)} prompts, {share['iterations']} iterations: model "
          f"{share['model_s']:.2f} s, non-model decoder time {share['other_s']:.3f} s = "
          f"{100 * share['other_s'] / total:.1f}% of decoder wall "
          f"({1000 * share['other_s'] / share['iterations']:.3f} ms per iteration)")
    if args.json:
        from packed_ss.bench.grid import Column, save

        parts = sorted(found["groups"].items(), key=lambda kv: -kv[1]) + [("Python and dispatch (the rest)", rest)]
        rows = [[group, ms, 100 * ms / call] for group, ms in parts]
        rows.append([f"(unprofiled: the call's median, {found['op_calls']:.0f} tensor operators per call)",
                     found["call_ms"], None])
        rows.append([f"(Packed-SS, B = {args.block_size}, {len(prompts)} prompts: non-model decoder time per iteration)",
                     1000 * share["other_s"] / share["iterations"], 100 * share["other_s"] / total])
        save(args.json, [Column("part"), Column("ms per call", 3), Column("share (%)", 1)], rows,
             note=f"a 1-row call after a {len(prompts[0])}-token prompt, {found['threads']} threads, "
                  f"{args.repeats} calls profiled; the last row's share is of Packed-SS's decoder wall")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
