"""Tests that rely on running in the solution's process (issue 56, item 4): 13 of 25 correct solution/test pairs
failed in the judge/solver split. Graded right now: an argument mutated in place by keyword or inside a tuple,
``f() is f()``, a numpy array of numbers or text. Detected and said: a class of the solution used as a type
(``isinstance``, ``except``), and more calls than can cross between the two processes in the time limit, give the
verdict "ungradable" with the reason, not a silent fail; so does a failed assertion after the solution held on to an
argument it was given (what it changes there later stays in its process)."""

import pytest

from packed_ss.sandbox import SandboxMissing, find_sandbox, run_program

try:
    SANDBOX = find_sandbox()
except SandboxMissing:
    SANDBOX = None
pytestmark = pytest.mark.skipif(SANDBOX is None, reason="no sandbox here (CI installs bubblewrap)")

GRADED_RIGHT = {
    "argument mutated, by position": ("def f(a):\n    a.append(1)\n", "x = []\nf(x)\nassert x == [1]\n"),
    "argument mutated, by keyword": ("def f(a):\n    a.append(1)\n", "x = []\nf(a=x)\nassert x == [1]\n"),
    "argument mutated, inside a tuple": ("def f(t):\n    t[0].append(1)\n", "x = []\nf((x,))\nassert x == [1]\n"),
    "one object, one identity": ("_o = object()\ndef f():\n    return _o\n", "assert f() is f()\nassert f() is not None\n"),
    "a numpy result": ("import numpy as np\ndef f():\n    return np.arange(3) * 1.5\n",
                       "import numpy as np\nassert (f() == np.arange(3) * 1.5).all() and f().dtype == np.float64\n"),
}


@pytest.mark.parametrize("case", GRADED_RIGHT, ids=list(GRADED_RIGHT))
def test_one_process_forms_are_graded_right(case):
    solution, tests = GRADED_RIGHT[case]
    assert run_program(solution, tests, SANDBOX).status == "passed"
    wrong = solution.replace("append(1)", "append(2)").replace("return _o", "return object()").replace("1.5", "2.5")
    assert run_program(wrong, tests, SANDBOX).status == "failed"  # the tests still decide


UNGRADABLE = {
    "the solution's class in isinstance": ("class P:\n    pass\ndef f():\n    return P()\n",
                                           "assert isinstance(f(), P)\n", "as a type"),
    "the solution's exception in except": ("class E(Exception):\n    pass\ndef f():\n    raise E('x')\n",
                                           "try:\n    f()\nexcept E:\n    pass\n", "as a type"),
    "an argument kept and changed later": ("S = []\ndef keep(a):\n    S.append(a)\ndef bump():\n    S[0].append(2)\n",
                                           "x = []\nkeep(x)\nbump()\nassert x == [2]\n", "holds on to an argument"),
    "10 million calls": ("def f(x):\n    return x\n", "for i in range(10_000_000):\n    assert f(i) == i\n", "calls into"),
}


@pytest.mark.parametrize("case", UNGRADABLE, ids=list(UNGRADABLE))
def test_forms_that_need_one_process_are_called_ungradable(case):
    solution, tests, why = UNGRADABLE[case]
    verdict = run_program(solution, tests, SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "ungradable") and why in verdict.detail, verdict
    assert "ungradable in isolation" in verdict.detail


def test_a_solution_too_slow_for_its_calls_still_times_out():
    """The many-calls rule looks at CPU time, not at a clock: a solution that computes for each call takes the
    solver's CPU far past the judge's, and its verdict stays "timeout"."""
    slow = "def f(x):\n    t = 0\n    for i in range(200_000):\n        t += i\n    return x\n"
    verdict = run_program(slow, "for i in range(100_000):\n    assert f(i) == i\n", SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "timeout"), verdict


def test_holding_an_argument_is_no_failure_when_the_tests_pass():
    """A solution that keeps (a memo of) its argument is graded by its tests as before: the mark only explains a
    failed assertion."""
    keeper = "SEEN = []\ndef total(a):\n    SEEN.append(a)\n    return sum(a)\n"
    assert run_program(keeper, "assert total([1, 2]) == 3\n", SANDBOX).status == "passed"
    assert run_program(keeper, "assert total([1, 2]) == 4\n", SANDBOX).status == "ungradable"
    plain = "def total(a):\n    return sum(a)\n"
    assert run_program(plain, "assert total([1, 2]) == 4\n", SANDBOX).status == "failed"
