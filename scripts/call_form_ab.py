"""The native forward's call forms, interleaved on one model (issue 55, docs/speed.md).

``--compare form`` (default): in place, where the call writes its keys and values into the cache and attends over
the cache alone (eager calls' form and the graph path's), against read-only, where the cache is only read, the
call's own keys are attended apart and the caller writes them afterwards (torch.compile's form).
``--compare attention``: eager in-place calls attending written out (scores, softmax, values) against one
``scaled_dot_product_attention``.

Both sides must give the same tokens (checked). Prints each side's median wall time per run, per schedule and
prompt (``--prompt long``: an 834-token prompt, where attention weighs more).

    python scripts/call_form_ab.py --threads 1 --repeats 8
    python scripts/call_form_ab.py --threads 1 --repeats 8 --compiled   # torch.compile's calls, each form compiled
    python scripts/call_form_ab.py --threads 1 --repeats 6 --compare attention --prompt long

``--json PATH`` adds the run's row (each schedule's first side / second side) to the table at PATH, replacing the row
an earlier run of the same arguments wrote; docs/speed.md draws docs/figures/call-forms.json
(``python -m packed_ss.bench.tables``). Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = {
    "short": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):",
    "long": "import os\nimport sys\n\n" + "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(60)),
}
# --compare -> the two sides: (label, the adapter attribute it sets, its value)
SIDES = {
    "form": (("in place", "in_place", True), ("read-only", "in_place", False)),
    "attention": (("sdpa", "attention", "sdpa"), ("written", "attention", "written")),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=8, help="timed runs per side and schedule (>= 1)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=8)
    parser.add_argument("--compare", choices=tuple(SIDES), default="form")
    parser.add_argument("--prompt", choices=tuple(PROMPTS), default="short")
    parser.add_argument("--compiled", action="store_true",
                        help="torch.compile's calls (each form's shapes compiled in the untimed runs)")
    parser.add_argument("--json", type=Path, help="add this run's row to the table here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error("--repeats and --threads must be >= 1")
    if args.compiled and args.compare != "form":
        parser.error("--compiled compares the call forms only (compiled calls attend written out)")

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
    prompt = model.encode(PROMPTS[args.prompt])
    config = DecodeConfig(block_size=args.block_size, max_new_tokens=args.max_new_tokens)
    sides = SIDES[args.compare]
    ratios = {}
    for schedule in ("ar", "packed"):
        tokens, times = {}, {label: [] for label, _, _ in sides}
        for label, attribute, value in sides * 2:  # untimed
            setattr(model.static, attribute, value)
            tokens[label] = generate(model, prompt, config, schedule).token_ids
        for repeat in range(args.repeats):
            for label, attribute, value in (sides if repeat % 2 == 0 else sides[::-1]):
                setattr(model.static, attribute, value)
                start = time.perf_counter()
                generate(model, prompt, config, schedule)
                times[label].append(time.perf_counter() - start)
        if len(set(tokens.values())) != 1:
            print(f"error: {schedule}'s tokens differ between the sides", file=sys.stderr)
            return 1
        medians = {label: statistics.median(found) * 1000 for label, found in times.items()}
        (first, *_), (second, *_) = sides
        ratios[schedule] = medians[first] / medians[second]
        print(f"{schedule}, {len(prompt)}-token prompt: " + ", ".join(f"{k} {ms:.1f} ms" for k, ms in medians.items())
              + f" (median of {args.repeats}; {first} / {second} {medians[first] / medians[second]:.3f})")
    if args.json:
        from packed_ss.bench.grid import Column, put_row

        (first, *_), (second, *_) = sides
        flags = list(argv if argv is not None else sys.argv[1:])
        if "--json" in flags:
            at = flags.index("--json")
            del flags[at:at + 2]
        label = (f"{first} / {second}, {'compiled' if args.compiled else 'eager'}, {len(prompt)}-token prompt, "
                 f"{args.threads} thread{'s' if args.threads > 1 else ''}")
        columns = [Column("comparison (median wall per run)"), Column("AR", 3), Column("Packed-SS", 3)]
        put_row(args.json, columns, " ".join(flags), [label, ratios["ar"], ratios["packed"]],
                note=f"B = {args.block_size}, {args.max_new_tokens} new tokens, median of {args.repeats} runs per side")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
