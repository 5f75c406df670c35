"""GSM8K (Cobbe et al., 2021): 1,319 grade-school word problems; graded by answer equivalence, with
lm-eval-harness's two numbers beside it (Section 4.1).

- Data: ``openai/gsm8k``, ``main`` (test split, pinned revision; or ``--data``): ``question``, ``answer`` (the
  worked solution ending in ``#### <final answer>``).
- Prompt: the question, then :data:`~packed_ss.evals.maths.BOXED` (E.3); output cap 1,024 tokens (E.2).
- Stops: none beyond the model's end markers.
- Grader: the response's last ``\\boxed{}`` (else its last expression) against the final answer with
  math-verify (:func:`~packed_ss.evals.maths.grade_math`).
- Numbers: digits split by a space or a LaTeX space are one number where they group by three (``1\\,000``,
  ``1 000``), and no number where they do not (``1\\,0000``), before math-verify reads them
  (:func:`~packed_ss.evals.maths.numbers_as_written`; math-verify alone reads ``1\\,000`` as 1 * 0).
- Extraction for the log and the field's table: lm-eval-harness's ``gsm8k`` task (version 3.0), its
  ``strict-match`` and ``flexible-extract`` filters (the same regular expressions and selected match) and its
  ``exact_match`` normalisation, so a reproduced table can be set beside the field's.
- Metrics: accuracy, and the accuracy of ``strict_match`` and ``flexible_match`` (:mod:`packed_ss.evals.accuracy`).
"""

from __future__ import annotations

import re

from packed_ss.evals.maths import BOXED, grade_math
from packed_ss.evals.task import Task
from packed_ss.sandbox import Sandbox, Verdict

# lm-eval-harness, lm_eval/tasks/gsm8k/gsm8k.yaml (version 3.0): the two filters and exact_match's settings.
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # the last match is kept (group_select -1)
IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")  # regexes_to_ignore, applied in order, then lower case
UP_TO_MARK = r"(?s).*#### "  # one of them, backtracking from every position where no mark follows (quadratic)
INVALID = "[invalid]"  # lm-eval's fallback when a filter finds nothing


def gold(answer: str) -> str:
    """GSM8K's final answer: the text after ``####`` without thousands separators."""
    return answer.split("####")[-1].strip().replace(",", "")


def _select(pattern: re.Pattern, text: str, group_select: int) -> str:
    """lm-eval's ``regex`` filter: the selected match, the first non-empty group of it, stripped."""
    found = pattern.findall(text)
    if not found:
        return INVALID
    match = found[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), INVALID)
    return match.strip()


def strict_extract(response: str) -> str:
    """lm-eval's ``strict-match`` extraction: the number after the first ``#### ``."""
    return _select(STRICT, response, 0)


def flexible_extract(response: str) -> str:
    """lm-eval's ``flexible-extract`` extraction: the last number-like run of the response."""
    return _select(FLEXIBLE, response, -1)


def _normalised(text: str) -> str:
    """``text`` with :data:`IGNORE` removed in order, lower case. The pattern up to the last ``#### `` is removed
    by splitting there, which gives what the regular expression gives in linear time (it took 21 s on 300,000
    digits and did not end on 2 million)."""
    for pattern in IGNORE:
        text = text.rsplit("#### ", 1)[-1] if pattern == UP_TO_MARK else re.sub(pattern, "", text)
    return text.lower()


def exact_match(extracted: str, answer: str) -> bool:
    """lm-eval's ``exact_match`` of an extraction against the record's whole ``answer`` (ignored regexes
    removed from both, case ignored)."""
    return _normalised(extracted) == _normalised(answer)


def prompt(record: dict) -> str:
    return f"{record['question'].strip()}\n{BOXED}\n"


def check(record: dict) -> str | None:
    return None if "####" in record["answer"] else "an 'answer' without GSM8K's '#### <final answer>'"


def extract(record: dict, response: str) -> dict:
    """lm-eval-harness's two GSM8K numbers beside math-verify's."""
    strict, flexible = strict_extract(response), flexible_extract(response)
    return {"strict": strict, "strict_match": exact_match(strict, record["answer"]),
            "flexible": flexible, "flexible_match": exact_match(flexible, record["answer"])}


def grade(record: dict, response: str, sandbox: Sandbox | None = None) -> Verdict:
    """math-verify's equivalence of the response's final answer and the record's final answer (:func:`gold`)."""
    return grade_math(gold(record["answer"]), response)


TASK = Task("gsm8k", "openai/gsm8k", "main", "test", 1319, 1024, prompt, grade,
            fields=(("question", str), ("answer", str)), target=lambda r: gold(r["answer"]), extract=extract,
            check=check, revision="740312add88f781978c0658806c59bc2815b9866")
