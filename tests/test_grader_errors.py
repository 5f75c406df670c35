"""One answer never stops a task (issue 36, item 3): a fenced answer holding about 5,000 '-' characters made
ast.parse raise RecursionError in the grader (only SyntaxError was caught), and the run exited at 10 of 12 graded
with the reports on disk left as the earlier ones."""

from __future__ import annotations

import pandas as pd

from packed_ss.evals.code import prompt_context
from packed_ss.evals.harness import grade
from packed_ss.evals.task import load_records
from packed_ss.evals.tasks import TASKS, humaneval, mbpp
from packed_ss.sandbox import Verdict, find_sandbox, top_level_names

DEEP = "```python\ndef f():\n    return " + "-" * 5000 + "1\n```"


def test_a_deeply_nested_answer_is_graded_not_raised():
    assert top_level_names(DEEP.split("\n", 1)[1]) >= {"f"}  # the regex guess where the parser gives up
    record = load_records(TASKS["humaneval"])[0]
    assert prompt_context(record["prompt"], DEEP, record["entry_point"]) is not None
    verdict = humaneval.grade(record, DEEP, find_sandbox(unsafe=True))
    assert not verdict.correct and verdict.status in ("failed", "forbidden", "timeout"), verdict


def test_a_grader_error_on_one_answer_is_its_verdict_and_the_rest_are_graded():
    class Crashing:  # a task whose grader fails on one answer
        runs_code = False

        def grade(self, record, response, sandbox):
            if response == "bad":
                raise RecursionError("maximum recursion depth exceeded during ast construction")
            return Verdict(response == record["answer"], "equal" if response == record["answer"] else "unequal")

        def extract(self, record, response):
            if response == "bad":
                raise ValueError("cannot read it")
            return {"read": response}

    records = [{"answer": "1"}, {"answer": "2"}, {"answer": "3"}]
    frame = pd.DataFrame({"prompt_index": [0, 1, 2], "prompt_id": ["a", "b", "c"], "schedule": ["ar"] * 3,
                          "sample": [0] * 3, "seed": [0] * 3, "output": ["1", "bad", "4"]})
    grades = grade(Crashing(), records, frame, lambda done, total: None, None, markers=())
    assert list(grades["correct"]) == [True, False, False]
    assert list(grades["status"]) == ["equal", "failed", "unequal"]
    assert grades["detail"][1].startswith("grader error (RecursionError: maximum recursion depth")


def test_an_mbpp_function_named_like_a_builtin_is_the_one_tested():
    """``def sum(x): return -1`` passed an MBPP record whose function is ``sum``: the judge took builtin names as
    bound and tested Python's own ``sum`` (issue 36, item 4: a false pass)."""

    record = {"test_list": ["assert sum([1, 2, 3]) == 6", "assert sum([]) == 0"], "test_imports": [],
              "code": "def sum(x):\n    pass\n"}  # the record's own solution: names the function asked for
    sandbox = find_sandbox(unsafe=True)
    wrong = mbpp.grade(record, "```python\ndef sum(x):\n    return -1\n```", sandbox)
    assert not wrong.correct, wrong
    right = mbpp.grade(record, "```python\ndef sum(x):\n    total = 0\n    for v in x:\n        total += v\n"
                               "    return total\n```", sandbox)
    assert right.correct, right
