"""The native forward's two eager call forms, interleaved on one model (issue 55, docs/speed.md).

In place: the call writes its keys and values into the cache and attends over the cache alone (eager calls' form
and the graph path's). Read-only: the cache is only read, the call's own keys are attended apart and the caller
writes them afterwards (torch.compile's form). Both must give the same tokens (checked); the script prints each
form's median wall time per run.

    python scripts/call_form_ab.py --threads 1 --repeats 8
    python scripts/call_form_ab.py --threads 1 --repeats 8 --compiled   # torch.compile's calls, each form compiled
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=8, help="timed runs per form and schedule (>= 1)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--compiled", action="store_true",
                        help="torch.compile's calls (each form's shapes compiled in the untimed runs)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")

    import torch

    from packed_ss import DecodeConfig, generate
    from packed_ss.cli import quiet_loaders
    from packed_ss.models import DualModeModel

    quiet_loaders()
    torch.set_num_threads(args.threads)
    model = DualModeModel.from_pretrained(args.model, device="cpu", compiled=args.compiled)
    if args.compiled and not model.compiled:
        print(f"error: calls are not compiled ({model.compile_note})", file=sys.stderr)
        return 2
    if model.path != "native":
        print(f"error: the model runs on transformers' forward ({model.path_note})", file=sys.stderr)
        return 2
    prompt = model.encode("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):")
    config = DecodeConfig(block_size=args.block_size, max_new_tokens=args.max_new_tokens)
    forms = {"in place": True, "read-only": False}
    for schedule in ("ar", "packed"):
        tokens, times = {}, {name: [] for name in forms}
        for name, flag in list(forms.items()) * 2:  # untimed
            model.static.in_place = flag
            tokens[name] = generate(model, prompt, config, schedule).token_ids
        for repeat in range(args.repeats):
            order = list(forms.items()) if repeat % 2 == 0 else list(forms.items())[::-1]
            for name, flag in order:
                model.static.in_place = flag
                start = time.perf_counter()
                generate(model, prompt, config, schedule)
                times[name].append(time.perf_counter() - start)
        if len(set(tokens.values())) != 1:
            print(f"error: {schedule}'s tokens differ between the forms", file=sys.stderr)
            return 1
        medians = {name: statistics.median(found) * 1000 for name, found in times.items()}
        print(f"{schedule}: " + ", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
              + f" (median of {args.repeats}; in place / read-only {medians['in place'] / medians['read-only']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
