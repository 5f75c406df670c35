"""A race's own iterations projected onto call costs measured on a GPU: what each lane's calls would cost there.

``scripts/gpu_check.py`` times one model call at 1, 2, 4, ..., 256 rows on a GPU (model time, synchronised, over a
fixed cached prefix) and writes the table to its JSON (``per_call_cost``). :func:`load_tables` reads every such
table of a file; :func:`project` sums, over a lane's calls, the measured cost at the call's row count (linear
between measured row counts, the end value beyond them). The result is a projection from measured call costs,
model time only (no host work between calls): it says what the race's schedule of calls would cost on that
device, never what a run there measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class CallTable:
    """Measured model time of one call by its row count, on one device.

    Attributes:
        device: the device's name ("NVIDIA H200"). date: the day it was measured (YYYY-MM-DD).
        model: which model's calls ("the embedded model, bfloat16").
        rows, ms: row counts (ascending) and the median milliseconds of a call of that many rows.
        source: the file the table came from (shown beside the projection).
        forward: what ran the calls (the file's ``forward``; files without one were measured on transformers'
            forward, eagerly).
    """

    device: str
    date: str
    model: str
    rows: tuple[int, ...]
    ms: tuple[float, ...]
    source: str
    forward: str = "transformers' forward, eager"

    def cost_ms(self, rows: int) -> float:
        """Milliseconds of a call of ``rows`` rows: linear between the measured row counts, the nearest end's
        value outside them."""
        return float(np.interp(rows, self.rows, self.ms))

    @property
    def label(self) -> str:
        return f"{self.model}, {self.forward}, {self.device} ({self.date})"


MODELS = {  # per_call_cost keys of scripts/gpu_check.py -> what the model is
    "embedded_float32": "the embedded model, float32",
    "embedded_bfloat16": "the embedded model, bfloat16",
    "nld_shaped_bfloat16": "a 1.34B NLD-shaped model, bfloat16",
}


def load_tables(path: str | Path) -> list[CallTable]:
    """Every per-call table in one ``scripts/gpu_check.py`` JSON file (``per_call_cost``), with its device and the
    date in the file's name (``gpu_check-<device>-YYYY-MM-DD.json``).

    Raises: OSError when the file cannot be read; ValueError when it is no such JSON (no device name, no table).
    """
    path = Path(path)
    data = json.loads(path.read_text())
    device = (data.get("environment") or {}).get("device_name")
    tables = data.get("per_call_cost") or {}
    if not device or not isinstance(tables, dict):
        raise ValueError(f"{path.name} is not the JSON of scripts/gpu_check.py (no device name or per_call_cost)")
    date = "-".join(path.stem.split("-")[-3:])
    forward = {"transformers (eager)": "transformers' forward, eager"}.get(tables.get("forward"),
                                                                          tables.get("forward"))
    out = []
    for key, table in tables.items():
        if not isinstance(table, dict) or not table.get("by_rows"):
            continue
        points = sorted((int(r["rows"]), float(r["median_ms"])) for r in table["by_rows"])
        out.append(CallTable(device=device, date=date, model=MODELS.get(key, key.replace("_", " ")),
                             rows=tuple(r for r, _ in points), ms=tuple(m for _, m in points), source=path.name,
                             **({"forward": forward} if forward else {})))
    if not out:
        raise ValueError(f"{path.name} holds no per-call table")
    return out


def project(call_rows: Sequence[int], table: CallTable) -> float:
    """Projected model milliseconds of calls of ``call_rows`` rows each (one entry per call) on ``table``'s device."""
    return sum(table.cost_ms(rows) for rows in call_rows)
