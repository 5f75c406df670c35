"""The task harness (``python -m packed_ss.bench --task ...``): the paper's experiments (Section 4, Appendix E) on
one process or many.

Per task: the records become prompts (optionally as chat messages), the prompts are split across the
processes ``accelerate launch`` started (prompt i goes to process i mod N; one model per process and device,
each process timing its own prompts alone), every timed run is appended as one JSON line to
``OUT/runs/TASK.rankK.rows.jsonl`` as soon as it ends (its row, its output text), so ``--resume`` skips the prompts
whose runs are all there. When every process is done, the main process merges the rows, grades each
distinct response once (scoring is outside the timed region, E.5), and writes per task the benchmark's own
files (``OUT/TASK/``: examples.csv, summary.json, summary.md, report.html, grades.csv) and across tasks the
paper-style report (``OUT/paper.md``, ``OUT/paper.json``, ``OUT/report.html``).
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from packed_ss.bench.accuracy import accuracy_summary
from packed_ss.bench.paper import paper_html, paper_markdown
from packed_ss.bench.plan import BenchConfig, BenchError, Prompt
from packed_ss.bench.report import write_outputs
from packed_ss.bench.run import BenchResult, run_benchmark
from packed_ss.bench.summary import _clean, complete_prompts, examples_frame, summarize
from packed_ss.bench.tasks import Task, task_prompts

RUNS = "runs"  # folder of the per-run rows


@dataclass(frozen=True)
class HarnessPlan:
    """What the harness runs.

    Attributes:
        tasks: the tasks, in order.
        configs: one :class:`BenchConfig` per task (its output cap and block sizes).
        records: one list of records per task (:func:`~packed_ss.bench.tasks.load_records`, ``--limit`` applied).
        chat: send each prompt as a user message in the tokenizer's chat template.
        resume: keep the rows already written and run only the prompts that lack some.
    """

    tasks: tuple[Task, ...]
    configs: tuple[BenchConfig, ...]
    records: tuple[list, ...]
    chat: bool = False
    resume: bool = False


class Processes:
    """This process's place among the ones ``accelerate launch`` started (one process without it).

    Args: device: the ``--device`` asked for; a CPU run (or a machine without CUDA) synchronises the
        processes over gloo, a CUDA run over NCCL."""

    def __init__(self, device: str | None = None):
        from accelerate import PartialState

        self.state = PartialState(cpu=not _has_cuda() or str(device or "").startswith("cpu"))
        self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        self.state.wait_for_everyone()

    def device(self, requested: str | None) -> str | None:
        """The device of this process: the one asked for, else (several processes) accelerate's."""
        if requested is not None or self.world == 1:
            return requested
        return str(self.state.device)


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def chat_wanted(model, name: str, chat: str) -> bool:
    """``--chat``: ``on`` needs a chat template (BenchError otherwise), ``off`` never, ``auto`` when the tokenizer
    has one and the checkpoint is not a base model (its name says ``base``)."""
    if chat == "on" and not model.has_chat_template:
        raise BenchError(f"--chat on: the tokenizer of {name!r} has no chat template; use --chat off")
    if chat == "auto":
        return model.has_chat_template and "base" not in name.lower()
    return chat == "on"


def rows_file(out: Path, task: str, rank: int) -> Path:
    return out / RUNS / f"{task}.rank{rank}.rows.jsonl"


def read_rows(out: Path, task: str) -> list[dict]:
    """Every run row written for ``task`` by any process (a line cut short by an interruption is skipped)."""
    rows = []
    for path in sorted((out / RUNS).glob(f"{task}.rank*.rows.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def finished(rows: list[dict], config: BenchConfig) -> set[str]:
    """Prompt ids with a run of every schedule and sample."""
    needed = len(config.schedules) * config.samples
    seen: dict[str, set] = {}
    for row in rows:
        seen.setdefault(row["prompt_id"], set()).add((row["schedule"], row["sample"]))
    return {pid for pid, runs in seen.items() if len(runs) >= needed}


def run_settings(meta: dict, config: BenchConfig, chat: bool) -> dict:
    """What a task's runs depend on (model, dtype, chat, every decoding setting), to compare on ``--resume``."""
    from dataclasses import asdict

    decoding = {k: v for k, v in asdict(config).items() if k not in ("resamples", "level", "warmup")}
    return json.loads(json.dumps({"model": meta.get("model"), "model_sha256": meta.get("model_sha256"),
                                  "family": meta.get("family"), "dtype": meta.get("dtype"), "chat": chat,
                                  "decoding": decoding}))


def keep_settings(out: Path, task: str, settings: dict, resume: bool, main: bool) -> None:
    """A fresh run (main process): forget the task's old rows, write the settings. ``--resume``: refuse when the
    rows there were made with other settings (they would be reported under the new ones).

    Raises: BenchError naming what differs."""
    path = out / RUNS / f"{task}.settings.json"
    if resume and path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        if old != settings:
            flat_old, flat_new = _flat(old), _flat(settings)
            changed = [f"{k} {flat_old.get(k)!r} -> {flat_new.get(k)!r}" for k in sorted(set(flat_old) | set(flat_new))
                       if flat_old.get(k) != flat_new.get(k)]
            raise BenchError(f"--resume: the {task} runs in {out / RUNS} were made with other settings "
                             f"({'; '.join(changed[:4])}); repeat those settings, or leave out --resume to start over")
        return
    if not main:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if not resume:
        for old in path.parent.glob(f"{task}.rank*"):
            old.unlink()
    path.write_text(json.dumps(settings, indent=2), encoding="utf-8")


def _flat(settings: dict) -> dict:
    return {**{k: v for k, v in settings.items() if k != "decoding"}, **settings.get("decoding", {})}


def measure_task(model, task: Task, prompts: list[Prompt], config: BenchConfig, out: Path, procs: Processes,
                 resume: bool, progress, meta: dict) -> None:
    """Time this process's share of ``prompts`` (those not finished yet when resuming), appending rows."""
    done = finished(read_rows(out, task.name), config) if resume else set()
    mine = [p for i, p in enumerate(prompts) if i % procs.world == procs.rank and p.id not in done]
    if not mine:
        return
    path = rows_file(out, task.name, procs.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        def keep(row: dict, token_ids: tuple[int, ...]) -> None:
            text = model.decode(list(token_ids))  # after the timed run: detokenisation is not timed (E.5)
            handle.write(json.dumps({**row, "task": task.name, "output": text}) + "\n")
            handle.flush()

        result = run_benchmark(model, mine, config, progress, {**meta, "task": task.name}, on_run=keep)
    extra = {"divergences": result.summary["meta"].get("divergences", []),
             "skipped": result.summary["meta"].get("skipped_prompts", [])}
    with path.with_name(path.name.replace(".rows.", ".meta.")).open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(extra) + "\n")
    if result.interrupted:
        raise KeyboardInterrupt


def merged(out: Path, task: Task, prompts: list[Prompt]) -> tuple[pd.DataFrame, dict]:
    """The task's rows from every process (the last run of each prompt, sample, schedule and B kept), with
    their prompt's global index; and the merged divergences and skipped prompts."""
    index = {p.id: i for i, p in enumerate(prompts)}
    latest = {}
    for row in read_rows(out, task.name):
        if row["prompt_id"] in index:
            latest[(row["prompt_id"], row["sample"], row["schedule"], row["block_size"])] = row
    rows = [{**row, "prompt_index": index[row["prompt_id"]]} for row in latest.values()]
    rows.sort(key=lambda r: (r["prompt_index"], r["sample"], r["position"]))
    frame = examples_frame(rows)
    frame["output"] = [r["output"] for r in rows]
    extra = {"divergences": [], "skipped_prompts": []}
    for path in sorted((out / RUNS).glob(f"{task.name}.rank*.meta.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            item = json.loads(line)
            extra["divergences"] += item["divergences"]
            extra["skipped_prompts"] += item["skipped"]
    for key in extra:  # a resumed prompt may have been reported twice
        extra[key] = list({json.dumps(x, sort_keys=True): x for x in extra[key]}.values())
    return frame, extra


def grade(task: Task, records: list[dict], frame: pd.DataFrame, progress: Callable[[int, int], None]) -> pd.DataFrame:
    """One verdict per row; each distinct (prompt, output) is graded once (greedy lossless schedules repeat
    AR's output). Returns the rows' ``prompt_id``, ``schedule``, ``sample``, ``correct``, ``status``, ``detail``."""
    cache = {}
    verdicts = []
    for done, (index, output) in enumerate(zip(frame["prompt_index"], frame["output"])):
        progress(done, len(frame))
        key = (index, output)
        if key not in cache:
            cache[key] = task.grade(records[index], output)
        verdicts.append(cache[key])
    progress(len(frame), len(frame))
    return pd.DataFrame({"prompt_index": frame["prompt_index"], "prompt_id": frame["prompt_id"],
                         "schedule": frame["schedule"], "sample": frame["sample"],
                         "correct": [v.correct for v in verdicts], "status": [v.status for v in verdicts],
                         "detail": [v.detail for v in verdicts]})


def machine() -> str:
    """The machine in one line: GPU name(s) or CPU, cores, OS."""
    import os

    import torch

    if torch.cuda.is_available():
        gpus = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        return f"{gpus}; {os.cpu_count()} CPU cores; {platform.system()} {platform.release()}"
    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores; {platform.system()}"


def run_harness(model, plan: HarnessPlan, out: Path, procs: Processes, meta: dict, progress_factory) -> dict | None:
    """Measure every task (this process's prompts), then, on the main process, merge, grade and report.

    Args:
        model: the loaded :class:`~packed_ss.models.DualModeModel` of this process.
        plan: what to run.
        out: the output folder (shared by the processes).
        procs: this process's place (:class:`Processes`).
        meta: identity entries for the report (model, fingerprint, device, dtype...).
        progress_factory: ``label -> progress(done, total, text)`` for one progress bar.
    Returns: the paper report's dict on the main process, None on the others.
    Raises: KeyboardInterrupt after writing what was measured.
    """
    loaded = []
    for task, config, records in zip(plan.tasks, plan.configs, plan.records):
        prompts = task_prompts(task, records)
        if plan.chat:
            prompts = [replace(p, text=model.chat_text(p.text)) for p in prompts]
        loaded.append((task, config, records, prompts))
    for task, config, *_ in loaded:
        keep_settings(out, task.name, run_settings(meta, config, plan.chat), plan.resume, procs.main)
    procs.barrier()
    for task, config, records, prompts in loaded:
        measure_task(model, task, prompts, config, out, procs, plan.resume,
                     progress_factory(f"{task.name} [{procs.rank + 1}/{procs.world}]"), meta)
    procs.barrier()
    if not procs.main:
        return None
    entries = []
    for task, config, records, prompts in loaded:
        entries.append(report_task(task, config, records, prompts, out, meta, progress_factory))
    report = {"meta": {**meta, "machine": machine(), "processes": procs.world, "chat": plan.chat,
                       "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
              "tasks": entries}
    (out / "paper.json").write_text(json.dumps(report, indent=2, allow_nan=False), encoding="utf-8")
    (out / "paper.md").write_text(paper_markdown(report), encoding="utf-8")
    (out / "report.html").write_text(paper_html(report), encoding="utf-8")
    return report


def report_task(task: Task, config: BenchConfig, records: list[dict], prompts: list[Prompt], out: Path, meta: dict,
                progress_factory) -> dict:
    """Merge, grade and summarise one task; write its folder. Returns its entry of the paper report."""
    frame, extra = merged(out, task, prompts)
    info = {**meta, "task": task.name, **extra, "prompts_given": len(prompts)}
    summary = summarize(frame.drop(columns=["output"]), config, None, info)
    folder = out / task.name
    write_outputs(BenchResult(frame.drop(columns=["output"]), examples_frame([]), summary), folder)
    accuracy = None
    if task.graded and len(frame):
        grades = grade(task, records, frame, _counts(progress_factory(f"grading {task.name}")))
        grades.to_csv(folder / "grades.csv", index=False)
        prompts_done = complete_prompts(frame, config.schedules, config.samples)
        accuracy = accuracy_summary(grades, config.schedules, prompts_done, config.temperature, config.resamples,
                                    config.seed, config.level, config.order)
    return {"task": task.name, "summary": summary, "accuracy": None if accuracy is None else _clean(accuracy)}


def _counts(progress):
    return lambda done, total: progress(done, total, "grading")


def print_paths(out: Path, tasks) -> None:
    print("\n".join(f"wrote {out / t.name}/" for t in tasks) + f"\nwrote {out / 'paper.md'}\nwrote "
          f"{out / 'report.html'}", file=sys.stderr)
