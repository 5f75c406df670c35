"""Packed-SS with and without padded draft slots (Appendix D.1), same prompts, alternating order.

    python scripts/measure_padding.py --threads 2 --limit 40 --block-size 6

Prints throughput, decoder wall time and rows evaluated for each choice on this machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--limit", type=int, default=40, help="HumanEval prompts")
    parser.add_argument("--block-size", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    import torch

    from packed_ss import DecodeConfig, generate
    from packed_ss.bench.plan import load_prompts
    from packed_ss.models import DualModeModel

    torch.set_num_threads(args.threads)
    model = DualModeModel.from_pretrained(args.model, device="cpu", dtype="float32")
    prompts = [model.encode(p.text) for p in load_prompts("humaneval", args.limit)]
    config = DecodeConfig(block_size=args.block_size, max_new_tokens=args.max_new_tokens)
    for pad in (True, False):  # untimed warm-up of both shapes
        model.pads_drafts = pad
        generate(model, prompts[0], DecodeConfig(block_size=args.block_size, max_new_tokens=8), "packed")
    totals = {True: [0.0, 0, 0], False: [0.0, 0, 0]}  # wall s, tokens, rows
    for i, ids in enumerate(prompts):
        for pad in (True, False) if i % 2 == 0 else (False, True):
            model.pads_drafts = pad
            run = generate(model, ids, config, "packed")
            totals[pad][0] += run.wall_s
            totals[pad][1] += run.tokens
            totals[pad][2] += run.rows
    for pad, (wall, tokens, rows) in totals.items():
        print(f"{'padded to W' if pad else 'draft rows only'}: {tokens / wall:.1f} tokens/s, decoder wall "
              f"{wall:.2f} s, {rows} rows ({len(prompts)} prompts, B = {args.block_size}, {args.threads} threads)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
