"""Each speculative schedule's best block size B for a race (:class:`BestBlockSizes`): from the saved
benchmark when it measured this model, else a short probe."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from packed_ss.inputs import model_name
from packed_ss.schedules import REGISTRY, SPECULATIVE

from serve.errors import UserError
from serve.gpu import GpuTasks
from serve.limits import check_work, deadline_after
from serve.settings import OPTIONAL_LANES, RunSettings


PROBE_BLOCK_SIZES = (2, 3, 4, 6, 8)  # block sizes a best-B probe tries
PROBE_TOKENS = 32  # new tokens of each probe run
PROBE_SHARE = 0.5  # part of a race's time limit its best-B probe may take
SAVED_REPORT = Path(__file__).resolve().parents[1] / "docs" / "bench-humaneval" / "summary.json"


class BestBlockSizes:
    """Each speculative schedule's fastest B, per model, precision and drafter, kept for the server's life.

    From the saved benchmark report (``docs/bench-humaneval``) when it measured this very model on this
    kind of device in this dtype; otherwise from a short probe on this machine: one greedy run of
    :data:`PROBE_TOKENS` tokens on the race's prompt at each B in :data:`PROBE_BLOCK_SIZES`, the highest
    throughput wins (one prompt: a rough choice, said so on the page).
    """

    def __init__(self, report: Path = SAVED_REPORT):
        self.report = report
        self._found: dict[tuple, tuple[dict[str, int], str]] = {}
        self._lock = threading.Lock()

    def choose(self, tasks: "GpuTasks", settings: RunSettings, prompt_ids: Sequence[int],
               max_rows: int, max_seconds: float | None = None) -> tuple[dict[str, int], str]:
        """``({schedule: B}, where it came from)``. Raises: UserError when a probe would exceed ``max_rows`` or
        (predicted) ``max_seconds``."""
        model = tasks.store.get(*settings.model_ref[:2])
        key = (tasks.store.resolve(settings.model), str(model.dtype), str(model.device), settings.scripted)
        with self._lock:
            if key in self._found:
                return self._found[key]
        found = self._from_report(key[0], model) or self._probe(tasks, settings, prompt_ids, max_rows, max_seconds)
        with self._lock:
            self._found[key] = found
        return found

    def _from_report(self, identity: str, model) -> tuple[dict[str, int], str] | None:
        try:
            summary = json.loads(self.report.read_text(encoding="utf-8"))
            meta, sizes = summary["meta"], summary["config"]["block_sizes"]
        except (OSError, ValueError, KeyError):
            return None
        same = (meta.get("model") == model_name(identity) and meta.get("dtype") == str(model.dtype).removeprefix("torch.")
                and str(meta.get("device", "")).split(":")[0] == model.device.type)
        if not same or not all(s in sizes for s in SPECULATIVE):
            return None
        lanes = set(SPECULATIVE) | set(OPTIONAL_LANES)  # every lane the saved benchmark measured
        return ({s: int(b) for s, b in sizes.items() if s in lanes and s in REGISTRY},
                f"each schedule's best B from the saved benchmark of this model ({model_name(str(self.report.parent))})")

    @staticmethod
    def _probe(tasks: "GpuTasks", settings: RunSettings, prompt_ids: Sequence[int],
               max_rows: int, max_seconds: float | None = None) -> tuple[dict[str, int], str]:
        base = replace(settings.config, temperature=0.0, max_new_tokens=PROBE_TOKENS)
        runs = [(s, b) for s in SPECULATIVE for b in PROBE_BLOCK_SIZES]
        work = sum(check_work([s], len(prompt_ids), replace(base, block_size=b), max_rows) for s, b in runs)
        if work > max_rows:
            raise UserError(f"finding each schedule's best B needs up to {work:,} model rows on this prompt; this "
                            f"server allows {max_rows:,} per request: use the same B for every lane, or a shorter prompt")
        speed: dict[str, dict[int, float]] = {s: {} for s in SPECULATIVE}
        # No refusal on predicted time: the probe is cut off from the clock after half the request's time limit,
        # so the race itself keeps the other half (a cut probe run still gives its throughput so far).
        deadline = deadline_after(None if max_seconds is None else max_seconds * PROBE_SHARE)
        for s, b in runs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            run = tasks.generate(settings.model_ref, prompt_ids, replace(base, block_size=b), s, float(work), None, left)
            speed[s][b] = run.throughput
        best = {s: max(speed[s], key=speed[s].get) for s in SPECULATIVE}
        tried = ", ".join(map(str, PROBE_BLOCK_SIZES))
        return best, (f"each schedule's best B from a short probe on this machine ({PROBE_TOKENS} tokens of this "
                      f"prompt at B = {tried}; one prompt, so a rough choice)")
