"""Grading the paper's mathematics tasks (Appendix E.3): answer equivalence with ``math-verify`` (the paper's
boxed-answer match), and for GSM8K also lm-eval-harness's two numbers, ``strict-match`` and
``flexible-extract`` (its ``gsm8k`` task: the same regular expressions, the first match kept, and its
exact-match normalisation), so that a reproduced table can be set beside the field's.

Shape legend: none (strings in, :class:`~packed_ss.bench.sandbox.Verdict` or strings out).
"""

from __future__ import annotations

import re

from packed_ss.bench.sandbox import Verdict

# lm-eval-harness, lm_eval/tasks/gsm8k/gsm8k.yaml (version 3.0): the two filters and exact_match's settings.
GSM8K_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
GSM8K_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # the last match is kept (group_select -1)
GSM8K_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")  # regexes_to_ignore, applied in order, then lower case
INVALID = "[invalid]"  # lm-eval's fallback when a filter finds nothing


def gsm8k_gold(answer: str) -> str:
    """GSM8K's final answer: the text after ``####`` without thousands separators."""
    return answer.split("####")[-1].strip().replace(",", "")


def math_gold(gold: str) -> str:
    """A gold answer as math-verify parses it: inside ``\\boxed{}`` unless it already has one (a gold written
    with ``\\$``, such as MATH-500's ``\\$32,\\!348``, is otherwise read as a delimiter and parses to nothing)."""
    return gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"


def last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` (or ``\\fbox{...}``) of ``text`` with its braces balanced, or None."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for position in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[position], 0)
        if depth == 0:
            return f"\\boxed{{{text[start:position]}}}"
    return None  # cut short before its closing brace


def grade_math(gold: str, response: str) -> Verdict:
    """Whether the response's final answer (its last ``\\boxed{}``, else its last expression) equals ``gold``
    (math-verify: LaTeX and numbers, equal in value or form). A response that boxes several answers is judged
    by its last one, not by the set of them.

    Args:
        gold: the record's answer (MATH-500 ``answer``; GSM8K: :func:`gsm8k_gold`).
        response: the cleaned response.
    """
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeout warnings print the whole response
    expected = parse(math_gold(gold))
    if not expected:
        return Verdict(False, "no gold", f"math-verify cannot parse the gold {gold!r}")
    found = parse(last_boxed(response) or response)
    if not found:
        return Verdict(False, "no answer", f"gold {gold!r}")
    same = bool(verify(expected, found))
    return Verdict(same, "equal" if same else "unequal", f"gold {gold!r}, answer {str(found[-1])!r}")


def _select(pattern: re.Pattern, text: str, group_select: int) -> str:
    """lm-eval's ``regex`` filter: the selected match, the first non-empty group of it, stripped."""
    found = pattern.findall(text)
    if not found:
        return INVALID
    match = found[group_select]
    if isinstance(match, tuple):
        match = next((m for m in match if m), INVALID)
    return match.strip()


def gsm8k_strict(response: str) -> str:
    """lm-eval's ``strict-match`` extraction: the number after the first ``#### ``."""
    return _select(GSM8K_STRICT, response, 0)


def gsm8k_flexible(response: str) -> str:
    """lm-eval's ``flexible-extract`` extraction: the last number-like run of the response."""
    return _select(GSM8K_FLEXIBLE, response, -1)


def _normalised(text: str) -> str:
    for pattern in GSM8K_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


def gsm8k_exact_match(extracted: str, answer: str) -> bool:
    """lm-eval's ``exact_match`` of an extraction against the record's whole ``answer`` (ignored regexes
    removed from both, case ignored)."""
    return _normalised(extracted) == _normalised(answer)
