"""The figures tables of README.md and the docs (:data:`FILES`), written from their JSON, never typed by hand.

A table in a markdown file sits between two markers naming its kind and its source::

    <!-- table: headline docs/bench-humaneval/summary.json -->
    | schedule | B | ... |
    <!-- /table -->

``python -m packed_ss.bench.tables`` rewrites every marked table of the given files (default :data:`FILES`) from
its JSON (a benchmark's ``summary.json``, :func:`packed_ss.bench.summary.summarize`); ``--check`` only says which
differ and exits 1 (the test suite runs that check). Kinds (:data:`KINDS`):

* ``headline``: each schedule's B, tokens/NFE, time/NFE (ms), throughput (tokens/s) and throughput over AR's;
* ``schedules``: the same with the share of wall time spent outside the model (non-model decoder time);
* ``comparisons``: every paired ratio of the run with its 95% interval (throughput, tokens/NFE, time/NFE);
* ``grid``: a measuring script's own table (``scripts/call_floor.py --json`` and the like,
  :mod:`packed_ss.bench.grid`), with the line that says when, where and by which command it was measured.

A table of measured figures outside the markers is a table typed by hand: :func:`unmarked_figures` finds them, and
the test suite fails on any in :data:`FILES`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from packed_ss.bench import grid
from packed_ss.bench.report import _interval, _label, _num

ROOT = Path(__file__).resolve().parents[2]
FILES = ("README.md", "docs/speed.md", "docs/any-order.md", "docs/command-line.md", "docs/app.md",
         "assets/model/README.md", "assets/model-anyorder/README.md")  # relative to the repository root
MARKED = re.compile(r"(<!-- table: (\w+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)
FIGURE = re.compile(r"\d\.\d")  # a measured figure has decimals; a table of names and formulas has none


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _grid(headers: list[str], rows: list[list[str]]) -> str:
    return "\n".join([_row(headers), "|" + "---|" * len(headers), *(_row(row) for row in rows)]) + "\n"


def provenance(summary: dict) -> str:
    """One line: when, on which machine, with how many threads and which calls the run was measured (its ``meta``)."""
    meta = summary.get("meta", {})
    calls = "compiled" if meta.get("compiled") else "eager"
    path = {"native": "the native forward", "transformers": "transformers' forward"}.get(meta.get("forward"), "")
    return (f"Measured on {str(meta.get('created', 'an unrecorded date'))[:10]} on {meta.get('machine', 'an unrecorded machine')}, "
            f"{meta.get('threads', '?')} torch threads, {calls} calls" + (f" of {path}" if path else "") + ".\n\n")


def headline(summary: dict) -> str:
    """Each schedule's figures and its throughput over AR's (``-`` without an AR row), below :func:`provenance`'s
    line. Raises: KeyError for a summary without ``schedules``."""
    found = summary["schedules"]
    ar = (found.get("ar") or {}).get("throughput")
    rows = []
    for name, item in found.items():
        over = f"{item['throughput'] / ar:.2f}x" if ar else "-"
        rows.append([_label(name), _num(item.get("block_size")).replace("n/a", "-"), _num(item["tokens_per_nfe"]),
                     _num(item["time_per_nfe_ms"], 2), _num(item["throughput"], 1), over])
    return provenance(summary) + _grid(["schedule", "B", "tokens/NFE", "time/NFE (ms)", "throughput (tok/s)", "vs AR"],
                                       rows)


def schedules(summary: dict) -> str:
    """Each schedule's figures and the share of its wall time outside the model (``(not split)`` for loops timed as
    one call, transformers' and llama.cpp's), below :func:`provenance`'s line."""
    rows = []
    for name, item in summary["schedules"].items():
        other, wall = item.get("other_mean_s"), item.get("wall_mean_s")
        share = f"{100 * other / wall:.1f}%" if other is not None and wall else "(not split)"
        rows.append([_label(name), _num(item.get("block_size")).replace("n/a", "-"), _num(item["tokens_per_nfe"]),
                     _num(item["time_per_nfe_ms"], 2), _num(item["throughput"], 1), share])
    return provenance(summary) + _grid(["schedule", "B", "tokens/NFE", "time/NFE (ms)", "throughput (tok/s)",
                                        "non-model share of wall"], rows)


def comparisons(summary: dict) -> str:
    """Every paired comparison of the run: ratio estimates with their intervals."""
    rows = [[f"{_label(c['numerator'])} / {_label(c['denominator'])}", _interval(c["throughput_ratio"]),
             _interval(c["tokens_per_nfe_ratio"]), _interval(c["time_per_nfe_ratio"])]
            for c in summary["comparisons"]]
    return _grid(["comparison", "throughput ratio", "tokens/NFE ratio", "time/NFE ratio"], rows)


KINDS = {"headline": headline, "schedules": schedules, "comparisons": comparisons, "grid": grid.render}


def unmarked_figures(text: str) -> list[str]:
    """The first line of every Markdown table of ``text`` that holds a figure with decimals outside the table
    markers (a table typed by hand). Tables inside fenced code blocks are not tables."""
    outside = MARKED.sub("", re.sub(r"```.*?```", "", text, flags=re.S))
    found, block = [], []
    for line in outside.splitlines() + [""]:
        if line.startswith("|"):
            block.append(line)
            continue
        if len(block) > 2 and any(FIGURE.search(row) for row in block[2:]):
            found.append(block[0])
        block = []
    return found


def rewritten(text: str, root: Path = ROOT) -> str:
    """``text`` with every marked table rewritten from its JSON (paths relative to ``root``).

    Raises: ValueError naming an unknown kind or a JSON file that cannot be read."""

    def table(match: re.Match) -> str:
        opening, kind, source = match.group(1), match.group(2), match.group(3)
        if kind not in KINDS:
            raise ValueError(f"unknown table kind {kind!r} (known: {', '.join(KINDS)})")
        try:
            summary = json.loads((root / source).read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValueError(f"cannot read {source}: {error}") from None
        return opening + KINDS[kind](summary) + match.group(5)

    return MARKED.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    """Rewrite (or with ``--check`` compare) the marked tables of ``files``; exit status 1 when a check finds one
    out of date, 2 for a file or JSON that cannot be read."""
    parser = argparse.ArgumentParser(prog="python -m packed_ss.bench.tables", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="*", default=list(FILES), help="markdown files (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only say which tables differ from their JSON")
    args = parser.parse_args(argv)
    stale = []
    for name in args.files:
        path = ROOT / name if not Path(name).is_absolute() else Path(name)
        try:
            text = path.read_text(encoding="utf-8")
            new = rewritten(text)
        except (OSError, ValueError) as error:
            print(f"error: {name}: {error}", file=sys.stderr)
            return 2
        if new != text:
            stale.append(name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python -m packed_ss.bench.tables)", file=sys.stderr)
        return 1
    print(("rewrote " if stale else "up to date: ") + ", ".join(stale or args.files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
