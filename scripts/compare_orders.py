"""Confidence order against left-to-right order, from two benchmark runs of one any-order model.

    python scripts/compare_orders.py runs/ao-ltr runs/ao-confidence

Each folder is a ``python -m packed_ss.bench --order ...`` output (``examples.csv``, ``summary.json``) over
the same prompts. For every schedule measured in both, it prints the paired ratios confidence / ltr
(throughput, tokens/NFE, time/NFE; 95% percentile bootstrap over prompts, the same resampled prompts for
every schedule, as the benchmark does) and how many prompts' outputs differ between the two orders (the
paper's speed-accuracy trade-off, Appendix C). The two runs were timed one after the other, not
interleaved per prompt, so read small throughput differences as ties. ``--json PATH`` writes the same table for
docs/speed.md (``python -m packed_ss.bench.tables`` draws it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from packed_ss.bench.report import _label
    from packed_ss.bench.summary import compare, complete_prompts, read_examples

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ltr", type=Path, help="benchmark folder measured with --order ltr")
    parser.add_argument("confidence", type=Path, help="benchmark folder measured with --order confidence")
    parser.add_argument("--resamples", type=int, default=20_000)
    parser.add_argument("--json", type=Path, help="write the table here (e.g. docs/figures/orders.json)")
    args = parser.parse_args(argv)
    runs = {}
    for order, folder in (("ltr", args.ltr), ("confidence", args.confidence)):
        summary = json.loads((folder / "summary.json").read_text())
        if summary["config"].get("order") != order:
            parser.error(f"{folder} was measured with --order {summary['config'].get('order')}, not {order}")
        runs[order] = read_examples(folder / "examples.csv")
    ltr, confidence = runs["ltr"], runs["confidence"]
    confidence = confidence.assign(schedule=confidence["schedule"] + "@confidence")
    both = pd.concat([ltr, confidence], ignore_index=True)
    names = [s for s in ltr["schedule"].unique() if f"{s}@confidence" in set(confidence["schedule"])]
    prompts = complete_prompts(both, names + [f"{s}@confidence" for s in names], 1)
    print(f"{len(prompts)} prompts in both runs\n")
    print("| schedule | throughput ratio | tokens/NFE ratio | time/NFE ratio | outputs differing |")
    print("|---|---|---|---|---|")
    rows = []
    for name in names:
        c = compare(both, f"{name}@confidence", name, prompts, args.resamples)
        hashes = {order: frame[frame["schedule"] == key].set_index("prompt_index")["token_hash"]
                  for order, frame, key in (("ltr", ltr, name), ("confidence", confidence, f"{name}@confidence"))}
        differing = int((hashes["ltr"].loc[prompts] != hashes["confidence"].loc[prompts]).sum())
        cells = [f"{c[k]['estimate']:.3f} [{c[k]['low']:.3f}, {c[k]['high']:.3f}]"
                 for k in ("throughput_ratio", "tokens_per_nfe_ratio", "time_per_nfe_ratio")]
        print(f"| {name} | {' | '.join(cells)} | {differing} of {len(prompts)} |")
        rows.append([_label(name)] + [{k: c[key][k] for k in ("estimate", "low", "high")}
                                      for key in ("throughput_ratio", "tokens_per_nfe_ratio", "time_per_nfe_ratio")]
                    + [f"{differing} of {len(prompts)}"])
    if args.json:
        from packed_ss.bench.grid import Column, save

        columns = [Column("schedule (confidence / ltr)"), Column("throughput ratio", 3), Column("tokens/NFE ratio", 3),
                   Column("time/NFE ratio", 3), Column("outputs differing")]
        save(args.json, columns, rows, note=f"{len(prompts)} prompts in both runs, 95% bootstrap intervals over "
                                            f"prompts, {args.resamples:,} resamples")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
