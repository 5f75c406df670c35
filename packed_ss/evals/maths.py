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


# A digit-group separator as people write numbers in LaTeX or text: a thin space (\, or U+2009, U+202F), a negative
# thin space \!, a medium space \; or \:, a control space "\ ", a braced comma {,}, a tie ~, a plain or a
# non-breaking space (U+00A0). math-verify reads "1\,000" and "1 000" as the product 1*0 = 0.
SEPARATOR = r"(?:\\[,!;:]|\\ |\{,\}|[ ~\u00a0\u2009\u202f])"
# A number whose digits such separators split: its whole part and its decimals (never a run that starts after a
# point or a digit). Each separator is one of a fixed set of texts that no digit starts, so a match is linear.
GROUPED = re.compile(rf"(?<![\d.])(\d+(?:{SEPARATOR}\d+)*)(?:\.(\d+(?:{SEPARATOR}\d+)*))?")
SPLIT = re.compile(SEPARATOR)


def _grouped_by_three(whole: list[str], decimals: list[str]) -> bool:
    """Whether digit groups are grouped as numbers are: the whole part's first group of one to three digits and the
    others of three; the decimals' groups of three but the last (one to three). One group is any length."""
    return (len(whole) == 1 or (1 <= len(whole[0]) <= 3 and all(len(g) == 3 for g in whole[1:]))) and (
        len(decimals) <= 1 or (all(len(g) == 3 for g in decimals[:-1]) and 1 <= len(decimals[-1]) <= 3))


def _read_number(match: re.Match) -> str:
    whole, decimals = match.group(1), match.group(2) or ""
    whole_groups, decimal_groups = SPLIT.split(whole), SPLIT.split(decimals) if decimals else []
    if len(whole_groups) == 1 and len(decimal_groups) <= 1:
        return match.group(0)  # no separator: as written
    if _grouped_by_three(whole_groups, decimal_groups):
        return "".join(whole_groups) + ("." + "".join(decimal_groups) if decimals else "")
    if "{,}" in match.group(0):
        return match.group(0)  # a decimal comma ("3{,}14"), not a misgrouped number
    return "\\text{" + SPLIT.sub("\\\\,", match.group(0)) + "}"  # no number: math-verify reads it as text


def numbers_as_written(text: str) -> str:
    """``text`` with each number that digit-group separators (:data:`SEPARATOR`) split read as people write numbers,
    in linear time: where its digits group by three ("1\\,000", "1 000", "3.141\\,59") the separators go ("1000");
    where they do not ("1\\,0000", "10\\,00") it becomes ``\\text{...}``, which math-verify reads as text, equal to
    no number (it read the product 1*0 = 0). A braced comma that does not group by three is a decimal comma and stays
    ("3{,}14")."""
    return GROUPED.sub(_read_number, text)


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
