"""What the mathematics tasks share (Appendix E.3): the instruction to box the final answer, and answer
equivalence with ``math-verify`` (the paper's boxed-answer match). The tasks that use it are
:mod:`packed_ss.evals.tasks.math500` and :mod:`packed_ss.evals.tasks.gsm8k`.

Shape legend: none (strings in, :class:`~packed_ss.sandbox.Verdict` out).
"""

from __future__ import annotations

import re

from packed_ss.inputs import shown
from packed_ss.sandbox import Verdict

BOXED = "Reason step by step, then give the final answer inside \\boxed{}."  # appended to every problem (E.3)


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


# A digit group separator between digits as people write numbers in LaTeX or text: a thin space (\, or U+2009,
# U+202F), a negative thin space \!, a medium space \;, a control space "\ ", a braced comma {,}; only before a
# group of exactly three digits, so "3{,}14" (a decimal comma) is left alone. math-verify read \boxed{1\,000} as 0.
SEPARATOR = re.compile(r"(?<=\d)(?:\\[,!;]|\\ |\{,\}|[\u2009\u202f])(?=\d{3}(?!\d))")


def numbers_as_written(text: str) -> str:
    """``text`` with the digit-group separators of :data:`SEPARATOR` removed ("1\\,000" -> "1000"), in linear
    time."""
    return SEPARATOR.sub("", text)


def grade_math(gold: str, response: str) -> Verdict:
    """Whether the response's final answer (its last ``\\boxed{}``, else its last expression) equals ``gold``
    (math-verify: LaTeX and numbers, equal in value or form). A response that boxes several answers is judged
    by its last one, not by the set of them.

    Args:
        gold: the record's answer (MATH-500 ``answer``; GSM8K: :func:`packed_ss.evals.tasks.gsm8k.gold`).
        response: the cleaned response.
    """
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeout warnings print the whole response
    expected = parse(math_gold(numbers_as_written(gold)))
    if not expected:
        return Verdict(False, "no gold", f"math-verify cannot parse the gold {shown(gold)}")
    found = parse(numbers_as_written(last_boxed(response) or response))
    if not found:
        return Verdict(False, "no answer", f"gold {shown(gold)}")
    same = bool(verify(expected, found))
    return Verdict(same, "equal" if same else "unequal", f"gold {shown(gold)}, answer {shown(str(found[-1]))}")
