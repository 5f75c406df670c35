"""The task harness (``python -m packed_ss.bench --task ...``): the paper's experiments (Section 4, Appendix E) on
one process or many.

Per task: the records become prompts (optionally as chat messages), the prompts are split across the
processes ``accelerate launch`` started (prompt i goes to process i mod N; one model per process and device,
each process timing its own prompts alone), every timed run is appended as one JSON line to
``OUT/runs/TASK.rankK.rows.jsonl`` as soon as it ends (its row, its output text), so ``--resume`` skips the prompts
whose runs are all there (a re-grade of finished runs decodes nothing). A run's seed is a hash of the run
seed, the prompt's id (task and record) and the sample (:func:`~packed_ss.bench.run.run_seed`), so sharding and
resuming give the rows of one uninterrupted process. When every process is done, the main process merges the
rows, cuts each response at the model's end markers, grades each distinct response once in parallel worker
processes (code in a sandbox; scoring is outside the timed region, E.5), and writes per task the
benchmark's own files (``OUT/TASK/``: examples.csv, summary.json, summary.md, report.html, grades.csv,
samples.jsonl: the per-sample log) and across tasks the paper-style report (``OUT/paper.md``,
``OUT/paper.json``, ``OUT/report.html``). Nothing measured is deleted: see :mod:`packed_ss.bench.files`.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from packed_ss.bench.files import frame_text, set_aside, write_text, write_texts
from packed_ss.bench.plan import BenchConfig, BenchError, Prompt
from packed_ss.bench.report import write_outputs
from packed_ss.bench.run import BenchResult, run_benchmark
from packed_ss.bench.summary import _clean, complete_prompts, examples_frame, summarize
from packed_ss.evals.accuracy import accuracy_summary
from packed_ss.evals.paper import paper_html, paper_markdown
from packed_ss.evals.task import END_MARKERS, Task, TaskData, clean_response, task_prompts
from packed_ss.sandbox import Sandbox, Verdict

RUNS = "runs"  # folder of the per-run rows


@dataclass(frozen=True)
class HarnessPlan:
    """What the harness runs.

    Attributes:
        tasks: the tasks, in order.
        configs: one :class:`BenchConfig` per task (its output cap and block sizes).
        data: one :class:`~packed_ss.evals.task.TaskData` per task (``--limit`` applied to its records).
        chat: ``--chat``: ``paper`` (the chat template where the paper used it, E.3), ``on`` or ``off``.
        chats: per task, whether its prompts go through the chat template and why (:func:`chat_wanted`; empty:
            decided from ``chat`` once the model is loaded).
        resume: keep the rows already written and run only the prompts that lack some.
        overwrite: move earlier results in the folder aside first (:func:`~packed_ss.bench.files.set_aside`).
        sandbox: where generated code runs (None when no task runs code).
        workers: grading processes at once.
    """

    tasks: tuple[Task, ...]
    configs: tuple[BenchConfig, ...]
    data: tuple[TaskData, ...]
    chat: str = "paper"
    chats: tuple[tuple[bool, str], ...] = ()
    resume: bool = False
    overwrite: bool = False
    sandbox: Sandbox | None = None
    workers: int = max(1, os.cpu_count() or 1)


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


def chat_wanted(model, task: Task, temperature: float, chat: str) -> tuple[bool, str]:
    """``--chat`` for one task: ``paper`` uses the chat template where the paper did (E.3: WritingBench at
    T > 0, when the tokenizer has one), ``on`` always (BenchError without a template), ``off`` never.

    Returns: (use it, the reason in a few words for the report)."""
    if chat == "on":
        if not model.has_chat_template:
            raise BenchError("--chat on: the model's tokenizer has no chat template; use --chat off")
        return True, "on (--chat on)"
    if chat == "off":
        return False, "off (--chat off)"
    if task.paper_chat(temperature):
        if model.has_chat_template:
            return True, "on, as the paper (E.3)"
        return False, "off: the paper uses the chat template here, but the tokenizer has none"
    return False, "off, as the paper (E.3)"


def end_markers(model) -> tuple[str, ...]:
    """Texts that end a response of ``model``: its EOS and special tokens (mask, BOS and unknown excepted) and
    the common end markers (:data:`~packed_ss.evals.task.END_MARKERS`)."""
    tokenizer = model.tokenizer
    skip = {getattr(tokenizer, "bos_token", None), getattr(tokenizer, "unk_token", None),
            getattr(tokenizer, "mask_token", None)}
    if getattr(model, "mask_token_id", None) is not None:
        skip.add(model.decode([model.mask_token_id]))
    own = list(getattr(tokenizer, "all_special_tokens", []) or [])
    if model.eos_token_id is not None:
        own.insert(0, model.decode([model.eos_token_id]))
    return tuple(dict.fromkeys(m for m in own + list(END_MARKERS) if m and m not in skip))


def end_token_ids(model) -> frozenset[int]:
    """The token ids that end a response of ``model``: its EOS and special tokens (mask, BOS and unknown
    excepted). A response is cut at the first of these tokens, not at their text: ``"</s>"`` written inside a
    string of the code stays."""
    tokenizer = model.tokenizer
    skip = {getattr(tokenizer, name, None) for name in ("bos_token_id", "unk_token_id")}
    skip.add(getattr(model, "mask_token_id", None))
    own = set(getattr(tokenizer, "all_special_ids", []) or [])
    if model.eos_token_id is not None:
        own.add(model.eos_token_id)
    return frozenset(i for i in own if i is not None and i not in skip)


def until_end_token(token_ids, ends: frozenset[int]) -> tuple[int, ...]:
    """``token_ids`` up to (without) the first one in ``ends``."""
    cut = next((i for i, token in enumerate(token_ids) if token in ends), len(token_ids))
    return tuple(token_ids[:cut])


def rows_file(out: Path, task: str, rank: int) -> Path:
    return out / RUNS / f"{task}.rank{rank}.rows.jsonl"


ROW_FIELDS = (("prompt_id", str), ("schedule", str), ("sample", int), ("position", int), ("tokens", int),
              ("nfe", int), ("wall_s", (int, float)), ("output", str))  # what a rows line must hold


def read_rows(out: Path, task: str) -> list[dict]:
    """Every run row written for ``task`` by any process (a line cut short by an interruption is skipped).

    Raises: BenchError (file and line named) for a rows file that cannot be read as text or a line that is
        not a row this harness wrote."""
    rows = []
    for path in sorted((out / RUNS).glob(f"{task}.rank*.rows.jsonl")):
        lines = _lines(path)
        for number, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                if number == len(lines) or (line.startswith("{") and not line.rstrip().endswith("}")):
                    continue  # a line cut short by an interruption (a resumed run appends after it)
                raise BenchError(f"{path}:{number} is not a JSON line; the rows file is damaged: move it away, or "
                                 f"leave out --resume and give another --out") from None
            rows.append(_checked_row(row, path, number))
    return rows


def _lines(path: Path) -> list[str]:
    return [line for line in _text(path).splitlines() if line.strip()]


def _checked_row(row, path: Path, number: int) -> dict:
    for name, kind in ROW_FIELDS:
        value = row.get(name) if isinstance(row, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BenchError(f"{path}:{number} is not a run row of this harness ({name!r} missing or of another "
                             f"type); move the file away, or leave out --resume and give another --out")
    return row


def check_resumable(out: Path, tasks) -> None:
    """Before the model loads: every settings, rows and meta file a ``--resume`` will read can be read.

    Raises: BenchError naming the first damaged file."""
    if (out / RUNS).exists() and not (out / RUNS).is_dir():
        raise BenchError(f"--resume: {out / RUNS} is a file, not the harness's runs folder; move it away")
    for task in tasks:
        path = out / RUNS / f"{task.name}.settings.json"
        if path.exists():
            _settings(path)
        read_rows(out, task.name)
        _meta(out, task.name)


def _settings(path: Path) -> dict:
    try:
        loaded = json.loads(_text(path))
    except (json.JSONDecodeError, RecursionError):
        loaded = None
    if not isinstance(loaded, dict):
        raise BenchError(f"--resume: {path} is damaged (not the JSON object this harness writes); its runs cannot "
                         f"be matched to settings: move the folder away, or give another --out")
    return loaded


def _meta(out: Path, task: str) -> dict:
    """The divergences and skipped prompts the processes wrote (BenchError for a line that is not theirs)."""
    extra = {"divergences": [], "skipped_prompts": []}
    for path in sorted((out / RUNS).glob(f"{task}.rank*.meta.jsonl")):
        for number, line in enumerate(_lines(path), 1):
            try:
                item = json.loads(line)
                extra["divergences"] += list(item["divergences"])
                extra["skipped_prompts"] += list(item["skipped"])
            except (json.JSONDecodeError, RecursionError, KeyError, TypeError):
                raise BenchError(f"{path}:{number} is not a meta line of this harness; move the file away, or "
                                 f"give another --out") from None
    return extra


def prompt_hash(text: str) -> str:
    """First 16 hex digits of the SHA-256 of a rendered prompt: a row's response is reused only for the
    same text (a changed prompt template or chat setting decodes again)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def current(rows: list[dict], prompts: list[Prompt]) -> list[dict]:
    """The rows whose prompt is one of ``prompts`` with the same rendered text."""
    hashes = {p.id: prompt_hash(p.text) for p in prompts}
    return [row for row in rows if hashes.get(row["prompt_id"]) == row.get("prompt_sha256")]


def finished(rows: list[dict], config: BenchConfig) -> set[str]:
    """Prompt ids with a run of every schedule and sample."""
    needed = len(config.schedules) * config.samples
    seen: dict[str, set] = {}
    for row in rows:
        seen.setdefault(row["prompt_id"], set()).add((row["schedule"], row["sample"]))
    return {pid for pid, runs in seen.items() if len(runs) >= needed}


def run_settings(meta: dict, config: BenchConfig, chat: bool, data: TaskData) -> dict:
    """What a task's runs depend on (model, dtype, chat, the data's identity, every decoding setting), to
    compare on ``--resume``."""
    from dataclasses import asdict

    decoding = {k: v for k, v in asdict(config).items() if k not in ("resamples", "level", "warmup")}
    return json.loads(json.dumps({"model": meta.get("model"), "model_sha256": meta.get("model_sha256"),
                                  "family": meta.get("family"), "dtype": meta.get("dtype"), "chat": chat,
                                  "compiled": bool(meta.get("compiled")), "data": data.identity(),
                                  "decoding": decoding}))


def check_settings(out: Path, task: str, settings: dict, resume: bool) -> None:
    """``--resume``: refuse when the rows there were made with other settings (they would be reported under the
    new ones), or when there are rows but no settings to match them to. Writes nothing.

    Raises: BenchError naming what differs, or a settings file that cannot be read."""
    path = out / RUNS / f"{task}.settings.json"
    if not resume:
        return
    if not path.is_file():
        if any((out / RUNS).glob(f"{task}.rank*.rows.jsonl")):
            raise BenchError(f"--resume: the {task} runs in {out / RUNS} have no settings file to match them to; move "
                             f"them away, or give another --out")
        return
    old = _settings(path)
    # the data's source path is shown, not compared: the same records by another path are the same data
    old_data, new_data = (dict(s.get("data") or {}, source=None) for s in (old, settings))
    if {**old, "data": old_data} != {**settings, "data": new_data}:
        flat_old, flat_new = _flat({**old, "data": old_data}), _flat({**settings, "data": new_data})
        changed = [f"{k} {flat_old.get(k)!r} -> {flat_new.get(k)!r}" for k in sorted(set(flat_old) | set(flat_new))
                   if flat_old.get(k) != flat_new.get(k)]
        raise BenchError(f"--resume: the {task} runs in {out / RUNS} were made with other settings "
                         f"({'; '.join(changed[:4])}); repeat those settings, or give another --out")


def keep_settings(out: Path, task: str, settings: dict, resume: bool, main: bool) -> None:
    """Write a task's settings (main process) unless a resume keeps the ones there. Call it only after
    :func:`check_settings` passed for every task, so a refusal changes nothing."""
    path = out / RUNS / f"{task}.settings.json"
    if not main or (resume and path.is_file()):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(settings, indent=2))


def _text(path: Path) -> str:
    """A run file's text. Raises: BenchError for one that is a folder, unreadable or not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
        raise BenchError(f"cannot read {path} as text ({reason}); move it away, or give another --out") from None


def _flat(settings: dict) -> dict:
    flat = {k: v for k, v in settings.items() if k not in ("decoding", "data")}
    flat.update({f"data {k}": v for k, v in (settings.get("data") or {}).items()})
    return {**flat, **(settings.get("decoding") or {})}


def measure_task(model, task: Task, prompts: list[Prompt], config: BenchConfig, out: Path, procs: Processes,
                 resume: bool, progress, meta: dict) -> None:
    """Time this process's share of ``prompts`` (those not finished yet when resuming), appending rows."""
    done = finished(current(read_rows(out, task.name), prompts), config) if resume else set()
    mine = [p for i, p in enumerate(prompts) if i % procs.world == procs.rank and p.id not in done]
    if not mine:
        return
    path = rows_file(out, task.name, procs.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    hashes = {p.id: prompt_hash(p.text) for p in mine}
    with path.open("a", encoding="utf-8") as handle:
        if handle.tell() and not path.read_bytes().endswith(b"\n"):
            handle.write("\n")  # after a line an interruption cut short, which is kept and skipped
        ends = end_token_ids(model)

        def keep(row: dict, token_ids: tuple[int, ...]) -> None:
            text = model.decode(list(token_ids))  # after the timed run: detokenisation is not timed (E.5)
            response = model.decode(list(until_end_token(token_ids, ends)))
            handle.write(json.dumps({**row, "task": task.name, "prompt_sha256": hashes[row["prompt_id"]],
                                     "output": text, "response": response}) + "\n")
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
    their prompt's global index; and the merged divergences and skipped prompts.

    Raises: BenchError for a rows or meta file that is not the harness's (:func:`read_rows`)."""
    index = {p.id: i for i, p in enumerate(prompts)}
    latest = {}
    for row in current(read_rows(out, task.name), prompts):
        if row["prompt_id"] in index:
            latest[(row["prompt_id"], row["sample"], row["schedule"], row.get("block_size"))] = row
    rows = [{**row, "prompt_index": index[row["prompt_id"]]} for row in latest.values()]
    rows.sort(key=lambda r: (r["prompt_index"], r["sample"], r["position"]))
    frame = examples_frame(rows)
    frame["output"] = [r["output"] for r in rows]
    frame["response"] = [r.get("response") if isinstance(r.get("response"), str) else None for r in rows]
    extra = _meta(out, task.name)
    for key in extra:  # a resumed prompt may have been reported twice
        extra[key] = list({json.dumps(x, sort_keys=True): x for x in extra[key]}.values())
    return frame, extra


def grade(task: Task, records: list[dict], frame: pd.DataFrame, progress: Callable[[int, int], None],
          sandbox: Sandbox | None, markers=END_MARKERS, workers: int = 1) -> pd.DataFrame:
    """One verdict per row, each distinct (prompt, response) graded once (greedy lossless schedules repeat AR's
    output), ``workers`` programs at a time.

    Args:
        task, records: the task and its records (``frame``'s ``prompt_index`` indexes them).
        frame: merged rows with the raw ``output`` and, where the run recorded it, the ``response`` cut at its
            first end token (:func:`until_end_token`).
        progress: ``(graded, total)``.
        sandbox: where code runs (:func:`~packed_ss.sandbox.find_sandbox`); unused by the other tasks.
        markers: texts that end a response (:func:`end_markers`).
    Returns: per row ``prompt_index``, ``prompt_id``, ``schedule``, ``sample``, ``seed``, ``response`` (cut at the
        first marker), ``correct``, ``status``, ``detail`` and the task's extracted values (GSM8K:
        ``strict``, ``strict_match``, ``flexible``, ``flexible_match``; code: ``program``).
    """
    cut = frame["response"] if "response" in frame else [None] * len(frame)
    # Cut at the first end token where the run recorded it; rows written before that, at the markers' text.
    cleaned = [response if isinstance(response, str) else clean_response(raw, markers)
               for raw, response in zip(frame["output"], cut)]
    keys = list(dict.fromkeys(zip(frame["prompt_index"], cleaned)))
    verdicts: dict[tuple, Verdict] = {}
    progress(0, len(keys))
    # Code: each thread waits on its own sandboxed child process. Mathematics: math-verify times its parsing with
    # signal.alarm, which works in the main thread only.
    with ThreadPoolExecutor(max_workers=max(1, workers) if task.runs_code else 1) as pool:
        if task.runs_code:
            jobs = {pool.submit(graded, task, records[index], response, sandbox): (index, response)
                    for index, response in keys}
            for done, job in enumerate(as_completed(jobs), 1):
                verdicts[jobs[job]] = job.result()
                progress(done, len(keys))
        else:
            for done, (index, response) in enumerate(keys, 1):
                verdicts[(index, response)] = graded(task, records[index], response, sandbox)
                progress(done, len(keys))
    extracted = {key: _extracted(task, records[key[0]], key[1]) for key in keys}
    rows = []
    for (index, pid, schedule, sample, seed), response in zip(
            zip(frame["prompt_index"], frame["prompt_id"], frame["schedule"], frame["sample"], frame["seed"]), cleaned):
        verdict = verdicts[(index, response)]
        rows.append({"prompt_index": index, "prompt_id": pid, "schedule": schedule, "sample": sample, "seed": seed,
                     "response": response, "correct": verdict.correct, "status": verdict.status,
                     "detail": verdict.detail, **extracted[(index, response)]})
    return pd.DataFrame(rows)


def graded(task: Task, record: dict, response: str, sandbox: Sandbox | None) -> Verdict:
    """``task.grade``'s verdict on one response; any error the grader raises on it (a parser's RecursionError on a
    deeply nested answer, a bug) is that response's own verdict, "failed: grader error ...", so the other responses
    are still graded and reported."""
    try:
        return task.grade(record, response, sandbox)
    except Exception as error:  # noqa: BLE001 - one answer's problem is its own verdict
        return Verdict(False, "failed", f"grader error ({type(error).__name__}: {str(error)[:160]})")


def _extracted(task: Task, record: dict, response: str) -> dict:
    """``task.extract`` on one response, or nothing where it fails (the verdict says why, :func:`graded`)."""
    try:
        return task.extract(record, response)
    except Exception:  # noqa: BLE001
        return {}


def sample_log(task: Task, records: list[dict], prompts: list[Prompt], frame: pd.DataFrame,
               grades: pd.DataFrame) -> str:
    """The per-sample log, one JSON line per graded run: the rendered prompt, the raw and the cut response,
    what the grader read from it, the target and the verdict (lm-eval-harness's ``--log_samples``)."""
    lines = []
    for raw, row in zip(frame["output"], grades.to_dict("records")):
        index = int(row["prompt_index"])
        extracted = {k: v for k, v in row.items() if k not in SAMPLE_KEYS}
        lines.append(json.dumps({
            "task": task.name, "prompt_id": row["prompt_id"], "schedule": row["schedule"], "sample": int(row["sample"]),
            "seed": int(row["seed"]), "prompt": prompts[index].text, "response_raw": raw,
            "response": row["response"], "extracted": _clean(extracted), "target": task.target(records[index]),
            "correct": bool(row["correct"]), "status": row["status"], "detail": row["detail"]}, ensure_ascii=False))
    return "\n".join(lines) + ("\n" if lines else "")


SAMPLE_KEYS = ("prompt_index", "prompt_id", "schedule", "sample", "seed", "response", "correct", "status", "detail")


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
        plan: what to run (``chats`` set).
        out: the output folder (shared by the processes).
        procs: this process's place (:class:`Processes`).
        meta: identity entries for the report (model, fingerprint, device, dtype...).
        progress_factory: ``label -> progress(done, total, text)`` for one progress bar.
    Returns: the paper report's dict on the main process, None on the others.
    Raises: KeyboardInterrupt after writing what was measured; BenchError for settings or rows that do not fit.
    """
    if not plan.chats:
        plan = replace(plan, chats=tuple(chat_wanted(model, task, config.temperature, plan.chat)
                                         for task, config in zip(plan.tasks, plan.configs)))
    loaded = []
    for task, data, (chat, _) in zip(plan.tasks, plan.data, plan.chats):
        prompts = task_prompts(task, data.records)
        if chat:
            prompts = [replace(p, text=model.chat_text(p.text)) for p in prompts]
        loaded.append(prompts)
    aside = set_aside(out) if plan.overwrite and procs.main else None
    if aside is not None:
        print(f"moved the earlier results in {out} to {aside}", file=sys.stderr)
    settings = [run_settings(meta, config, chat, data)
                for config, data, (chat, _) in zip(plan.configs, plan.data, plan.chats)]
    for task, wanted in zip(plan.tasks, settings):  # every task checked before any is written
        check_settings(out, task.name, wanted, plan.resume)
    for task, wanted in zip(plan.tasks, settings):
        keep_settings(out, task.name, wanted, plan.resume, procs.main)
    procs.barrier()
    for task, config, prompts in zip(plan.tasks, plan.configs, loaded):
        measure_task(model, task, prompts, config, out, procs, plan.resume,
                     progress_factory(f"{task.name} [{procs.rank + 1}/{procs.world}]"), meta)
    procs.barrier()
    if not procs.main:
        return None
    markers = end_markers(model)
    entries = [report_task(task, config, data, prompts, out, {**meta, "end_markers": list(markers)}, progress_factory,
                           plan, chat)
               for task, config, data, prompts, chat in zip(plan.tasks, plan.configs, plan.data, loaded, plan.chats)]
    report = {"meta": {**meta, "machine": machine(), "processes": procs.world, "chat": plan.chat,
                       "sandbox": plan.sandbox.name if plan.sandbox else None,
                       "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")},
              "tasks": entries}
    write_texts([(out / "paper.json", json.dumps(report, indent=2, allow_nan=False)),
                 (out / "paper.md", paper_markdown(report)), (out / "report.html", paper_html(report))])
    return report


def report_task(task: Task, config: BenchConfig, data: TaskData, prompts: list[Prompt], out: Path, meta: dict,
                progress_factory, plan: HarnessPlan, chat: tuple[bool, str]) -> dict:
    """Merge, grade and summarise one task; write its folder. Returns its entry of the paper report."""
    frame, extra = merged(out, task, prompts)
    info = {**meta, "task": task.name, **extra, "prompts_given": len(prompts)}
    summary = summarize(frame.drop(columns=["output", "response"], errors="ignore"), config, None, info)
    folder = out / task.name
    write_outputs(BenchResult(frame.drop(columns=["output", "response"], errors="ignore"), examples_frame([]), summary), folder)
    accuracy = None
    if task.graded and len(frame):
        bar = progress_factory(f"grading {task.name}")
        grades = grade(task, data.records, frame, lambda done, total: bar(done, total, "graded"), plan.sandbox,
                       meta.get("end_markers") or END_MARKERS, plan.workers)
        write_texts([(folder / "grades.csv", frame_text(grades.drop(columns=["response", "program"], errors="ignore"))),
                     (folder / "samples.jsonl", sample_log(task, data.records, prompts, frame, grades))])
        prompts_done = complete_prompts(frame, config.schedules, config.samples)
        accuracy = accuracy_summary(grades, config.schedules, prompts_done, config.temperature, config.resamples,
                                    config.seed, config.level, config.order)
    return {"task": task.name, "summary": summary, "accuracy": None if accuracy is None else _clean(accuracy),
            "data": {**data.identity(), "read": data.read, "note": data.note}, "chat": chat[1],
            "graded_in": (plan.sandbox.name if plan.sandbox else None) if task.runs_code else None}


def print_paths(out: Path, tasks) -> None:
    print("\n".join(f"wrote {out / t.name}/" for t in tasks) + f"\nwrote {out / 'paper.md'}\nwrote "
          f"{out / 'report.html'}", file=sys.stderr)
