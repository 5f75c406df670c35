"""Results a visitor keeps: a step-through run's records (JSON), a race's table (CSV) and result (JSON).

The contents are built by pure functions (:func:`step_records`, :func:`race_rows`, :func:`race_csv`);
:func:`offer` writes one of them where the page serves files from and registers it as the session's
(:class:`serve.uploads.SessionFiles`: another session naming it is refused, it goes when the session ends). A session
keeps one file of each kind (its next export replaces it), and a file holds at most :data:`MAX_DOWNLOAD_BYTES`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from collections.abc import Sequence

from serve.errors import UserError
from serve.lanes import cost_ratio, speed_ratio
from serve.race import RaceResult
from serve.uploads import SessionFiles

MAX_DOWNLOAD_BYTES = 8 * 2**20  # one download file (a 512-token run at B = 32 writes about 2 MB of records)
RACE_COLUMNS = ("schedule", "title", "shown", "block_size", "tokens", "nfe", "tokens_per_nfe", "time_per_nfe_ms",
                "time_per_nfe_vs_ar", "wall_s", "throughput", "speed_vs_ar", "speed_vs_ar_low",
                "speed_vs_ar_high", "paired_slices",
                "mean_acceptance_length", "identical_to_ar", "first_difference")


def settings_json(settings) -> dict:
    """A run's settings (:class:`serve.settings.RunSettings`) as JSON-ready values: the model, the prompt, the
    schedule, the decoding config, the precision, the scripted drafter's q (None: the model's own) and chat."""
    return {"model": settings.model, "prompt": settings.prompt, "schedule": settings.schedule,
            "config": {k: list(v) if isinstance(v, tuple) else v
                       for k, v in dataclasses.asdict(settings.config).items()},
            "precision": settings.precision, "scripted_drafter_q": settings.scripted, "chat": settings.chat}


def iteration_json(record) -> dict:
    """One :class:`~packed_ss.records.IterationRecord` as JSON-ready values: every field, with each call as its
    name, rows, cached keys, model time and adapter rows (its attention mask is left out: it follows from the
    schedule, and an R x R mask per call would weigh more than the rest)."""
    out = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "calls":
            value = [{"name": c.layout.name, "rows": c.layout.rows, "cached": c.layout.cached,
                      "model_ms": c.model_ms, "adapter_selected": c.adapter_selected,
                      "adapter_evaluated": c.adapter_evaluated} for c in value]
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


def step_records(run) -> dict:
    """A step-through run (:class:`serve.step.StepRun`) as one JSON object: its settings, prompt token ids, the
    metrics over every iteration computed so far, the iteration shown, and each iteration's record."""
    from packed_ss.records import summarize

    records = list(run.records)
    summary = summarize(records, run.settings.schedule, run.settings.config.block_size,
                        run.settings.config.temperature, len(run.prompt_ids))
    metrics = summary.metrics()
    metrics["text"] = run.model.decode(list(summary.token_ids)) if summary.token_ids else ""
    return {"settings": settings_json(run.settings), "prompt_token_ids": list(run.prompt_ids),
            "iterations_done": len(records), "iteration_shown": run.position, "finished": run.finished,
            "metrics": metrics, "records": [iteration_json(r) for r in records]}


def race_rows(result: RaceResult) -> list[dict]:
    """The race table (the page's summary, hidden reference lanes included) as one dict per lane, keys
    :data:`RACE_COLUMNS`."""
    ar = result.lane("ar")
    rows = []
    for lane in result.lanes:
        m = lane.metrics
        ratio = speed_ratio(lane, ar) if ar is not None and lane is not ar else None
        rows.append({"schedule": lane.schedule, "title": lane.title, "shown": lane.shown,
                     "block_size": m.get("block_size") if lane.schedule != "ar" else None,
                     "tokens": m["tokens"], "nfe": m["nfe"], "tokens_per_nfe": m["tokens_per_nfe"],
                     "time_per_nfe_ms": m["time_per_nfe_ms"], "time_per_nfe_vs_ar": cost_ratio(lane, ar),
                     "wall_s": m["wall_s"], "throughput": m["throughput"],
                     "speed_vs_ar": ratio.estimate if ratio else None,
                     "speed_vs_ar_low": ratio.low if ratio else None, "speed_vs_ar_high": ratio.high if ratio else None,
                     "paired_slices": ratio.n if ratio else None,
                     "mean_acceptance_length": m["mean_acceptance_length"] if lane.schedule != "diffusion" else None,
                     "identical_to_ar": (lane.identical if lane.compared is not None or lane.schedule == "ar" else ""),
                     "first_difference": lane.first_difference})
    return rows


def race_csv(result: RaceResult) -> str:
    """The race table as CSV text: a header of :data:`RACE_COLUMNS`, one row per lane (empty cells: not
    applicable)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=RACE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(race_rows(result))
    return out.getvalue()


def offer(files: SessionFiles, session: str, name: str, text: str, slot: str) -> str:
    """Write ``text`` as file ``name`` where the page serves files from (:meth:`SessionFiles.publish`: a folder of
    its own), registered as ``session``'s file for ``slot`` (the session's earlier file for that slot is removed).
    Returns the served path.

    Raises: UserError when the text is over :data:`MAX_DOWNLOAD_BYTES` or cannot be written (a full disk)."""
    data = text.encode("utf-8")
    if len(data) > MAX_DOWNLOAD_BYTES:
        raise UserError(f"{name} would be {len(data) / 2**20:.1f} MB, more than the {MAX_DOWNLOAD_BYTES // 2**20} MB "
                        f"a download may hold: use fewer new tokens")
    try:
        return files.publish(session, name, data, slot=slot)
    except OSError as error:
        raise UserError(f"{name} could not be written on the server ({error.strerror or type(error).__name__}): "
                        f"try again later") from None


def offer_json(files: SessionFiles, session: str, name: str, value, slot: str) -> str:
    """:func:`offer` for a JSON value (indented, no NaN)."""
    return offer(files, session, name, json.dumps(value, indent=1, allow_nan=False), slot)


def offer_race(files: SessionFiles, session: str, result: RaceResult) -> Sequence[str]:
    """A race's two files for ``session``: race-table.csv and race.json (:meth:`RaceResult.to_json`)."""
    return [offer(files, session, "race-table.csv", race_csv(result), "race-table"),
            offer_json(files, session, "race.json", result.to_json(), "race-json")]
