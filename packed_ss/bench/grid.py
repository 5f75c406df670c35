"""A measuring script's table of figures, kept as JSON beside the docs and drawn into them by
``python -m packed_ss.bench.tables`` (kind ``grid``), so that no figure in a table is typed by hand.

A grid file holds the columns, the rows as measured (numbers, text, or ``{"estimate", "low", "high"}`` for a ratio
with its interval) and where they came from: the machine, the date (UTC) and the command of each script run that
wrote into it. A script that measures one row per command (``scripts/call_form_ab.py``) adds its row under a key,
replacing that key's row from an earlier run, so one file gathers several commands.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from packed_ss.bench.report import _interval
from packed_ss.machine import machine

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Column:
    """One column: its heading, the decimals of its numbers (``None``: as written) and a suffix (e.g. ``"x"``)."""

    name: str
    decimals: int | None = None
    suffix: str = ""


def command_line(argv: list[str] | None = None) -> str:
    """The command that is running, as a reader would type it from the repository root
    (``python scripts/x.py --flag 1``)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join(["python", str(script), *argv[1:]])


def _provenance(note: str) -> dict:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    return {"machine": machine(), "date": datetime.now(timezone.utc).date().isoformat(),
            "command": command_line(), "load_average_at_end": load, "note": note}


def save(path: str | Path, columns: list[Column], rows: list[list], note: str = "") -> dict:
    """Write a grid of ``rows`` (one value per column) to ``path`` with this run's provenance; returns the data.

    Raises: ValueError for a row whose length is not the columns'."""
    _check(columns, rows)
    data = {"columns": [asdict(c) for c in columns], "rows": rows, "runs": [_provenance(note)]}
    _write(path, data)
    return data


def put_row(path: str | Path, columns: list[Column], key: str, row: list, note: str = "") -> dict:
    """Add ``row`` to the grid at ``path`` (made if missing) under ``key``, replacing the row an earlier run wrote
    under the same key; the run's provenance is kept under the same key. Returns the data.

    Raises: ValueError for a row whose length is not the columns', or a file whose columns differ."""
    _check(columns, [row])
    path = Path(path)
    wanted = [asdict(c) for c in columns]
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"columns": wanted, "rows": [],
                                                                                 "runs": [], "keys": []}
    if data["columns"] != wanted:
        raise ValueError(f"{path} has other columns; write this grid to another file")
    run = {**_provenance(note), "key": key}
    if key in data["keys"]:
        at = data["keys"].index(key)
        data["rows"][at] = row
        data["runs"] = [r for r in data["runs"] if r.get("key") != key]
    else:
        data["keys"].append(key)
        data["rows"].append(row)
    data["runs"].append(run)
    _write(path, data)
    return data


def _check(columns: list[Column], rows: list[list]) -> None:
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"a row has {len(row)} values for {len(columns)} columns: {row!r}")


def _write(path: str | Path, data: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def _cell(value, column: dict) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict):  # a ratio and its interval, as the benchmark's reports write them
        return _interval(value, column["decimals"] if column["decimals"] is not None else 3)
    if isinstance(value, float) and column["decimals"] is not None:
        return f"{value:.{column['decimals']}f}{column['suffix']}"
    return f"{value}{column['suffix']}"


def render(data: dict) -> str:
    """The grid as a provenance line (dates, machine, commands) and a Markdown table.

    Raises: KeyError for data that is not a grid (no ``columns``, ``rows`` or ``runs``)."""
    columns, runs = data["columns"], data["runs"]
    dates = sorted({r["date"] for r in runs})
    machines = sorted({r["machine"] for r in runs})
    commands = list(dict.fromkeys(r["command"] for r in runs))
    notes = list(dict.fromkeys(r["note"] for r in runs if r.get("note")))
    said = (f"Measured on {', '.join(dates)} on {'; '.join(machines)}"
            + (f" ({'; '.join(notes)})" if notes else "") + "; "
            + ("command" if len(commands) == 1 else "commands") + ": "
            + ", ".join(f"`{c}`" for c in commands) + ".")
    head = "| " + " | ".join(c["name"] for c in columns) + " |\n" + "|" + "---|" * len(columns) + "\n"
    body = "".join("| " + " | ".join(_cell(v, c) for v, c in zip(row, columns)) + " |\n" for row in data["rows"])
    return said + "\n\n" + head + body
