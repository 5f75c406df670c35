"""Eager and compiled model calls against this machine's limits: tau and delta of each path and the roofline.

Usage::

    python scripts/call_paths.py [--model assets/model] [--threads 2] [--repeats 3]

Prints, for the model in float32 on the CPU: the per-call cost fit tau + delta * rows of eager calls (static
cache) and of compiled calls (``--compile``'s path), each from :func:`packed_ss.cost.call_cost` (median model
time of calls of 1, 8, 24 and 48 causal rows after a 64-token prefix), repeated ``--repeats`` times in
alternation (medians of the fits); then :func:`packed_ss.cost.roofline`: FLOPs per row, the measured matrix
product throughput, the compute limit per row, and the weight-read limit of one call. The Explain tab shows the
same figures for the app's model. ``--json PATH`` writes them as the table docs/speed.md shows
(``python -m packed_ss.bench.tables`` draws it). Speed is measured here, never asserted by a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="assets/model")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="fits per path, alternated (medians reported)")
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/call-paths.json)")
    args = parser.parse_args(argv)
    import torch

    from packed_ss.cost import call_cost, roofline
    from packed_ss.models import DualModeModel

    torch.set_num_threads(args.threads)
    model = DualModeModel.from_pretrained(args.model, device="cpu", dtype="float32")
    fits: dict[str, list] = {"eager": [], "compiled": []}
    for _ in range(args.repeats):
        for name in fits:
            adapter = model.share(compiled=name == "compiled")
            for attribute in ("call_cost_fit", "call_cost_fit_compiled"):  # measure again, not the cached fit
                model.model.__dict__.pop(attribute, None)
            fits[name].append(call_cost(adapter))
    medians = {}
    for name, found in fits.items():
        tau = statistics.median(f.tau_ms for f in found)
        delta = statistics.median(f.delta_ms for f in found)
        medians[name] = tau, delta
        print(f"{name:8s} tau = {tau:.3f} ms, delta = {delta:.4f} ms/row, 1-row call {tau + delta:.3f} ms "
              f"({args.repeats} fits: tau {', '.join(f'{f.tau_ms:.2f}' for f in found)})")
    roof = roofline(model, repeats=7)
    spec = (f" (datasheet {roof.spec_gflops:.0f} GFLOP/s, {roof.spec_read_gbs:.0f} GB/s)"
            if roof.spec_gflops and roof.spec_read_gbs else "")
    print(f"roofline: {roof.flops_per_row / 1e6:.2f} MFLOP per row at {roof.gflops:.1f} GFLOP/s = "
          f"{roof.compute_ms_per_row:.4f} ms per row; {roof.weight_bytes / 2 ** 20:.1f} MiB of weights read at "
          f"{roof.read_gbs:.1f} GB/s = {roof.read_ms:.3f} ms per call{spec}; the floor of a call is the larger: "
          f"the read up to {roof.crossover_rows:.0f} rows (a 1-row call cannot beat {roof.ms(1):.3f} ms), the "
          f"arithmetic beyond")
    if args.json:
        from packed_ss.bench.grid import Column, save

        columns = [Column(""), Column("per call (ms)", 3), Column("per row (ms)", 3), Column("1-row call (ms)", 3)]
        rows = [[f"{name} calls (fit tau + delta R, static cache)", tau, delta, tau + delta]
                for name, (tau, delta) in medians.items()]
        rows += [[f"compute limit: {roof.flops_per_row / 1e6:.2f} MFLOP per row (2 per weight, LM head included) at "
                  f"{roof.gflops:.1f} GFLOP/s (a 1024 x 1024 product)", None, roof.compute_ms_per_row,
                  roof.compute_ms_per_row],
                 [f"weight-read limit: {roof.weight_bytes / 2 ** 20:.1f} MiB of weight matrices read once per call at "
                  f"{roof.read_gbs:.1f} GB/s (a read over a buffer that size)", roof.read_ms, None, roof.read_ms]]
        save(args.json, columns, rows, note=f"float32, {args.threads} threads, medians of {args.repeats} fits per path")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
