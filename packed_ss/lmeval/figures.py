"""What each lm-eval request cost under each schedule, summed per task, and set against ``ar`` of the same run.

Metric definitions are the engine's (:mod:`packed_ss.records`): tokens/NFE = new tokens / model forwards (prefill
included); throughput = new tokens / decoder wall time (tokenisation and lm-eval's own work excluded, paper E.5);
mean acceptance length = tokens committed per verifying iteration (A = h + 1, fewer where EOS, a stop string or the
limit cut it; the prefill iteration excluded).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from packed_ss.bench.files import write_texts
from packed_ss.records import SOURCE_AR, RunRecord


@dataclass(frozen=True)
class RequestFigures:
    """One ``generate_until`` request decoded by one schedule.

    Attributes:
        task, doc_id: lm-eval's task name and document index of the request; None when lm-eval did not say.
        prompt_hash: lm-eval's hash of the context (``hash_string``): with ``task`` and ``doc_id``, the key of the
            request's line in lm-eval's ``samples_<task>_*.jsonl`` (whose fields are lm-eval's own).
        request: the request's index in its ``generate_until`` call.
        schedule: the schedule's name; ``graded`` is True for the one whose text lm-eval received.
        prompt_tokens, new_tokens: tokens of the (truncated) context and of the generation, before lm-eval's stop
            sequences cut the text.
        nfe: model forwards, prefill included.
        mean_acceptance_length: tokens committed per iteration after the prefill, over ``acceptance_iterations``
            iterations (the verifying ones; AR's one-token iterations, A = 1).
        acceptance_histogram: verifying iterations by accepted draft tokens h = 0..W.
        wall_s: decoder wall time (seconds).
        stop_reason: ``"eos"``, ``"limit"`` or ``"stop string"``.
        agrees: for a schedule that is not graded, at T = 0 in left-to-right order and neither of the two native
            diffusion: whether its text equals the graded one's (the schedules are lossless, so False is a bug);
            None where texts may differ by design or only one schedule ran.
    """

    task: str | None
    doc_id: int | None
    prompt_hash: str
    request: int
    schedule: str
    graded: bool
    prompt_tokens: int
    new_tokens: int
    nfe: int
    mean_acceptance_length: float
    acceptance_iterations: int
    acceptance_histogram: tuple[int, ...]
    wall_s: float
    stop_reason: str | None
    agrees: bool | None

    @property
    def tokens_per_nfe(self) -> float:
        return self.new_tokens / self.nfe if self.nfe else 0.0

    def row(self) -> dict:
        """JSON-ready, with tokens/NFE and throughput (tokens per second) written out."""
        out = asdict(self)
        out["acceptance_histogram"] = list(self.acceptance_histogram)
        out["tokens_per_nfe"] = round(self.tokens_per_nfe, 4)
        out["throughput"] = round(self.new_tokens / self.wall_s, 2) if self.wall_s > 0 else 0.0
        return out


def request_figures(run: RunRecord, task: str | None, doc_id: int | None, prompt_hash: str, request: int,
                    graded: bool, agrees: bool | None) -> RequestFigures:
    """The figures of one finished run (:func:`packed_ss.engine.generate`'s record)."""
    return RequestFigures(task=task, doc_id=doc_id, prompt_hash=prompt_hash, request=request, schedule=run.schedule, graded=graded,
                          prompt_tokens=run.prompt_len, new_tokens=run.tokens, nfe=run.nfe,
                          mean_acceptance_length=run.mean_acceptance_length,
                          acceptance_iterations=acceptance_iterations(run),
                          acceptance_histogram=tuple(run.acceptance_histogram), wall_s=run.wall_s,
                          stop_reason=run.stop_reason, agrees=agrees)


def acceptance_iterations(run: RunRecord) -> int:
    """The iterations ``run.mean_acceptance_length`` averages over (:func:`packed_ss.records.summarize`'s rule):
    the verifying ones, else AR's one-token iterations."""
    verifying = sum(r.verifies for r in run.records)
    return verifying or sum(SOURCE_AR in r.appended_sources for r in run.records)


def summarize(figures: list[RequestFigures], reference: str = "ar") -> list[dict]:
    """One row per (task, schedule), in the order first seen: requests, new tokens, NFE, tokens/NFE, mean acceptance
    length (over every request's iterations after the prefill), decoder seconds, throughput (tokens per second), and where the same task
    was decoded by ``reference`` too, the schedule's throughput and tokens/NFE as multiples of the reference's
    (``speedup``, ``tokens_per_nfe_ratio``); ``disagreements``: requests whose text differed from the graded
    schedule's at T = 0."""
    groups: dict[tuple, list[RequestFigures]] = {}
    for item in figures:
        groups.setdefault((item.task, item.schedule), []).append(item)
    rows = {key: _totals(items) for key, items in groups.items()}
    for (task, schedule), row in rows.items():
        base = rows.get((task, reference))
        row.update(task=task, schedule=schedule, speedup=None, tokens_per_nfe_ratio=None)
        if base is not None and schedule != reference and base["throughput"] and base["tokens_per_nfe"]:
            row["speedup"] = round(row["throughput"] / base["throughput"], 3)
            row["tokens_per_nfe_ratio"] = round(row["tokens_per_nfe"] / base["tokens_per_nfe"], 3)
    return [rows[key] for key in groups]


def _totals(items: list[RequestFigures]) -> dict:
    tokens = sum(i.new_tokens for i in items)
    nfe = sum(i.nfe for i in items)
    wall = sum(i.wall_s for i in items)
    counted = sum(i.acceptance_iterations for i in items)
    committed = sum(i.mean_acceptance_length * i.acceptance_iterations for i in items)
    return dict(requests=len(items), new_tokens=tokens, nfe=nfe,
                tokens_per_nfe=round(tokens / nfe, 4) if nfe else 0.0,
                mean_acceptance_length=round(committed / counted, 4) if counted else 0.0,
                wall_s=round(wall, 4), throughput=round(tokens / wall, 2) if wall > 0 else 0.0,
                disagreements=sum(i.agrees is False for i in items))


def summary_line(row: dict, reference: str = "ar") -> str:
    """One line of a :func:`summarize` row, e.g. ``gsm8k · packed: 3 requests, 96 new tokens in 40 NFE (2.40
    tokens/NFE, mean acceptance length 2.29), 0.52 s decoding, 184.6 tokens/s; against ar: 1.62x throughput,
    2.40x tokens/NFE``."""
    requests = f"{row['requests']} request{'s' if row['requests'] != 1 else ''}"
    line = (f"{row['task'] or 'untitled task'} · {row['schedule']}: {requests}, {row['new_tokens']} new tokens in "
            f"{row['nfe']} NFE ({row['tokens_per_nfe']:.2f} tokens/NFE, mean acceptance length "
            f"{row['mean_acceptance_length']:.2f}), {row['wall_s']:.2f} s decoding, {row['throughput']:.1f} tokens/s")
    if row["speedup"] is not None:
        line += (f"; against {reference}: {row['speedup']:.2f}x throughput, "
                 f"{row['tokens_per_nfe_ratio']:.2f}x tokens/NFE")
    if row["disagreements"]:
        line += f"; {row['disagreements']} text(s) differ from the graded schedule's (a bug: please report it)"
    return line


def write_figures(folder: Path, stamp: str, figures: list[RequestFigures], settings: dict,
                  reference: str = "ar") -> list[Path]:
    """Write ``requests_<stamp>.jsonl`` (one :class:`RequestFigures` row per line), ``summary_<stamp>.json`` (the
    settings and :func:`summarize`'s rows) and ``summary_<stamp>.md`` (the lines) into ``folder``, whole or not at
    all. Returns the three paths. Raises: OSError when the folder cannot be written."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = summarize(figures, reference)
    paths = [folder / f"requests_{stamp}.jsonl", folder / f"summary_{stamp}.json", folder / f"summary_{stamp}.md"]
    lines = "".join(json.dumps(item.row()) + "\n" for item in figures)
    summary = json.dumps({"settings": settings, "tasks": rows}, indent=2) + "\n"
    markdown = "# Decoding figures\n\n" + "".join(f"- {summary_line(row, reference)}\n" for row in rows)
    write_texts(list(zip(paths, (lines, summary, markdown))))
    return paths
