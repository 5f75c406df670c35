"""MBPP (Austin et al., 2021), as evalplus/mbppplus gives it: write a Python function from a one-line task; graded
by the problem's original base tests (Section 4.1).

- Data: 378 records of ``evalplus/mbppplus`` (test split; or ``--data``): ``prompt``, ``test_list``, and
  ``test_imports`` and ``code`` (the reference solution) where the record has them.
- Prompt: the task, then its base tests, which the solution must pass (visible, E.3), asking for one code
  block; output cap 512 tokens (E.2); 7 samples per prompt at T > 0 (E.4).
- Stops: none beyond the model's end markers.
- Extraction: the response's first Python code block (the first that defines a function the reference solution
  defines; evalplus reads the longest run of code in the whole response instead), or the raw response when it has
  none; then evalplus's sanitiser (:mod:`packed_ss.evals.sanitize`) when what it keeps still defines a function
  asked for. The sanitiser keeps every import, each class, each function that returns something and each
  assignment, the first definition of a name winning, pruned to what the record's ``entry_point`` reaches where it
  has one; usage examples, prints, top-level asserts and ``if __name__`` blocks go, and so do a decorated function
  and a function that never returns (a ``yield``-only helper): an answer that relies on one fails, as under
  evalplus, where a one-process ``exec`` passes it. The record's ``test_imports`` run before the answer's code.
- Grader: ``test_list`` (after ``test_imports``) in :mod:`packed_ss.sandbox`, apart from the response; the
  functions the reference solution defines are the ones tested, builtin names included (``sum``). A name the tests
  read but neither import nor ask for (Mbpp/596's ``sys``) is never the response's: the tests get it from the
  reference solution's own import (evalplus checks a response against the reference's outputs), else meet a
  ``NameError``.
- Metric: pass@k (:mod:`packed_ss.evals.accuracy`).
"""

from __future__ import annotations

import ast

from packed_ss.evals.code import extract_code
from packed_ss.evals.sanitize import defines_name, sanitize
from packed_ss.evals.task import Task
from packed_ss.sandbox import (TIMEOUT_S, UNPARSABLE, Sandbox, Verdict, free_names, run_program, statement_names,
                               top_level_names)


def prompt(record: dict) -> str:
    """MBPP: the task, then its original base tests, which the solution must pass (visible, E.3)."""
    tests = "\n".join(record["test_list"])
    return (f"{record['prompt'].strip()}\nYour solution must pass these tests:\n```python\n{tests}\n```\n"
            f"Write the solution as one Python code block.\n")


def check(record: dict) -> str | None:
    if not record["test_list"]:
        return "an empty 'test_list' (every answer would pass)"
    imports = record.get("test_imports", [])
    if imports is not None and (not isinstance(imports, list) or not all(isinstance(i, str) for i in imports)):
        return "'test_imports' that is not a list of text"
    return None


def solution(record: dict, response: str) -> str:
    """The code an MBPP response stands for (the module docstring says how)."""
    entry = sorted(top_level_names(record.get("code") or ""))  # the block that defines what the task asks for
    code = extract_code(response, entry)[0]
    named = record.get("entry_point") if isinstance(record.get("entry_point"), str) else None
    sanitized = sanitize(code, named)
    if any(defines_name(sanitized, name) for name in ([named] if named else entry)):
        code = sanitized
    return f"{imports(record)}\n{code}\n"


def imports(record: dict) -> str:
    return "\n".join(record.get("test_imports") or [])


def tests(record: dict) -> str:
    """The problem's original base tests, one assert a line (evalplus/mbppplus' ``test_list``)."""
    return "\n".join(record.get("test_list") or []) + "\n"


def judged(record: dict) -> tuple[str, tuple[str, ...]]:
    """What the judge runs before the tests and the names the tests take from the response.

    Returns: (context, names). The context is ``test_imports`` and, for a name the tests read that the reference
    solution imports (Mbpp/596's tests use ``sys`` and import nothing), the reference's import statement. The names
    are those the reference solution defines (functions, classes, assignments; builtin names included, ``sum``) that
    the tests read; any other name the tests read stays unbound in the judge (a ``NameError``): a response's
    ``class sys`` with a ``getsizeof`` of its own never reaches the tests. A record without a reference solution
    that parses: every name the tests read and do not bind is the response's.
    """
    asserts, context, code = tests(record), imports(record), record.get("code") or ""
    try:
        body = ast.parse(code).body if code.strip() else None
    except UNPARSABLE:
        body = None
    if body is None:
        return context, free_names(asserts, context, top_level_names(code))
    imported = [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))]
    defined = {name for node in body if node not in imported for name in statement_names(node)}
    read = set(free_names(asserts, context, defined))
    borrowed = [ast.get_source_segment(code, node) or "" for node in imported if read & set(statement_names(node))]
    context = "\n".join([context, *borrowed]).strip("\n")
    return context, tuple(name for name in free_names(asserts, context, defined) if name in defined)


def grade(record: dict, response: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one cleaned MBPP response (evalplus/mbppplus' record: test_list, test_imports, code); the module
    docstring says what the tests take from it."""
    context, names = judged(record)
    return run_program(solution(record, response), tests(record), sandbox, context=context, names=names,
                       timeout_s=timeout_s)


TASK = Task("mbpp", "evalplus/mbppplus", None, "test", 378, 512, prompt, grade,
            fields=(("prompt", str), ("test_list", list)), target=lambda r: "\n".join(r["test_list"]),
            extract=lambda r, response: {"program": solution(r, response)}, check=check, samples_sampled=7,
            runs_code=True)
