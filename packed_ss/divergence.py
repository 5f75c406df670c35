"""Where a greedy speculative output leaves AR's, and whether that is a near-tie or a bug.

Greedy Linear-, Quadratic- and Packed-SS reproduce AR exactly in exact arithmetic (paper Theorem 3.3 at
T = 0). In bfloat16 a verifier row computed inside a call of 2B rows need not round like AR's one-row
call, so where AR's two best logits are nearly equal the argmax may flip and the outputs part. That is
a near-tie, not an engine fault. A difference where AR's top-1 leads its top-2 by more than the
threshold of the dtype is reported as a bug.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Largest top-1 minus top-2 logit gap (in logits) that rounding of the dtype can plausibly flip. bfloat16
# keeps 8 significant bits: at logits of 16-32 one step is 0.125, so 0.5 is four steps; float16 keeps 11
# bits (0.0156 per step there); float32 differences between kernels stay far below 1e-3.
NEAR_TIE_LOGITS = {torch.bfloat16: 0.5, torch.float16: 0.1, torch.float32: 1e-3, torch.float64: 1e-9}


@dataclass(frozen=True)
class Divergence:
    """The first token where an output differs from AR's.

    Attributes:
        index: 0-based index into the generated tokens.
        ar_token, other_token: the two tokens there (None past the end of a shorter output).
        margin: AR's top-1 minus top-2 logit at that position, in logits (never-emit ids excluded).
        threshold: near-tie threshold of ``dtype`` in logits (NEAR_TIE_LOGITS).
        dtype: the model's dtype name.
    """

    index: int
    ar_token: int | None
    other_token: int | None
    margin: float
    threshold: float
    dtype: str

    @property
    def near_tie(self) -> bool:
        return self.margin <= self.threshold

    def verdict(self) -> str:
        """One line for people: the token, the margin, and near-tie or bug."""
        kind = (f"a near-tie (margin <= {self.threshold:g} in {self.dtype}), not a bug" if self.near_tie
                else f"not a near-tie (threshold {self.threshold:g} in {self.dtype}): an engine bug, please report it")
        return f"first difference at token {self.index}: AR's top-2 logit margin there is {self.margin:.4g}, {kind}"

    def as_dict(self) -> dict:
        return {"index": self.index, "ar_token": self.ar_token, "other_token": self.other_token,
                "margin_logits": self.margin, "threshold_logits": self.threshold, "dtype": self.dtype,
                "near_tie": self.near_tie}


def first_difference(reference: Sequence[int], other: Sequence[int]) -> int | None:
    """Index of the first differing token (a length difference counts), or None when equal."""
    for i, (a, b) in enumerate(zip(reference, other)):
        if a != b:
            return i
    return None if len(reference) == len(other) else min(len(reference), len(other))


@torch.no_grad()
def divergence(model, prompt_ids: Sequence[int], reference: Sequence[int], other: Sequence[int]) -> Divergence | None:
    """Where ``other`` leaves AR's ``reference`` output for ``prompt_ids``, with AR's top-2 margin there.

    One no-cache causal forward of ``model.model`` (a :class:`~packed_ss.models.DualModeModel`) over the
    prompt and AR's tokens before the difference. Returns None when the outputs are equal.
    """
    index = first_difference(reference, other)
    if index is None:
        return None
    ids = torch.tensor([list(prompt_ids) + list(reference[:index])], device=model.device)
    logits = model.model(input_ids=ids, logits_to_keep=1).logits[0, -1].double()
    never = torch.tensor(sorted(set(model.never_emit_ids)), dtype=torch.long, device=logits.device)
    top = logits.index_fill(0, never, float("-inf")).topk(2).values
    dtype = next(model.model.parameters()).dtype
    return Divergence(index=index, ar_token=reference[index] if index < len(reference) else None,
                      other_token=other[index] if index < len(other) else None, margin=float(top[0] - top[1]),
                      threshold=NEAR_TIE_LOGITS.get(dtype, 1e-3), dtype=str(dtype).removeprefix("torch."))
