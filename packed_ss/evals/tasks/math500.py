"""MATH-500 (Lightman et al., 2023): 500 competition problems; graded by answer equivalence (Section 4.1).

- Data: ``HuggingFaceH4/MATH-500`` (test split, pinned revision; or ``--data``): ``problem``, ``answer``.
- Prompt: the problem, then :data:`~packed_ss.evals.maths.BOXED` (E.3); output cap 1,024 tokens (E.2).
- Stops: none beyond the model's end markers.
- Extraction and grader: the response's last ``\\boxed{}`` (else its last expression) against ``answer`` with
  math-verify (:func:`~packed_ss.evals.maths.grade_math`).
- Numbers: digits split by a space or a LaTeX space are one number where they group by three (``1\\,000``,
  ``1 000``), and no number where they do not (``1\\,0000``), before math-verify reads them
  (:func:`~packed_ss.evals.maths.numbers_as_written`; math-verify alone reads ``1\\,000`` as 1 * 0).
- Metric: accuracy (:mod:`packed_ss.evals.accuracy`).
"""

from __future__ import annotations

from packed_ss.evals.maths import BOXED, grade_math
from packed_ss.evals.task import Task
from packed_ss.sandbox import Sandbox, Verdict


def prompt(record: dict) -> str:
    return f"{record['problem'].strip()}\n{BOXED}\n"


def grade(record: dict, response: str, sandbox: Sandbox | None = None) -> Verdict:
    """math-verify's equivalence of the response's final answer and the record's ``answer``."""
    return grade_math(record["answer"], response)


TASK = Task("math500", "HuggingFaceH4/MATH-500", None, "test", 500, 1024, prompt, grade,
            fields=(("problem", str), ("answer", str)), target=lambda r: r["answer"],
            revision="6e4ed1a2a79af7d8630a6b768ec859cb5af4d3be")
