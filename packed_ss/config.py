"""Decoding configuration shared by every schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from packed_ss.inputs import shown

ORDERS = ("ltr", "confidence")  # any-order verification policies (Appendix C, E.6)
# Seeds that give distinct runs: torch's CPU generator (mt19937) keeps the low 32 bits of a seed, so 2^32 would
# repeat 0 and -1 would repeat 2^32 - 1; anything outside this range is refused rather than silently aliased.
SEED_RANGE = (0, 2**32 - 1)
MAX_BLOCK_SIZE = 64  # Quadratic-SS evaluates B(B+1) rows; beyond this a call gets impractically large
MAX_TEMPERATURE = 100.0  # far past any use (T = 100 is already close to uniform sampling); bounds what a request sends
MAX_TOP_K = 2**31 - 1  # larger than any vocabulary; a larger k means the same as this one, and breaks JSON replies


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one decoding run.

    Attributes:
        block_size: B, rows per half of a packed call; the speculative width is W = B - 1 (App. D.1).
        temperature: T; 0 is greedy decoding (Algorithm 1), T > 0 rejection sampling (Algorithm 2).
        top_k: keep the k most likely tokens of p and q alike (0 = off).
        top_p: nucleus threshold applied to p and q alike (1.0 = off).
        max_new_tokens: L, output length limit in tokens (Algorithm 1 line 2), never exceeded.
        seed: seed of the run's ``torch.Generator``; the same seed gives the same run.
        stop_strings: texts that end the run once all their tokens are accepted (Appendix E.2).
        confidence_threshold: native diffusion only: commit predictions at least this probable.
        drafter_lora: apply the model's drafter adapter to proposal rows (Appendix F.2); the model must
            have been loaded with one.
        drafter_width: Packed-SS + n-gram only: masks in each call's diffusion half (min(this, W)); its
            n-gram drafts still reach W tokens. 3 measured fastest on this project's CPU (docs/speed.md).
        branches: Partial-branch SS only: Quadratic-SS branches per call (capped at |D| + 1); -1 picks k
            per call from the model's fitted call cost on this machine.
        order: any-order models only (paper Appendix C): the verification order policy, ``"ltr"``
            (textual) or ``"confidence"`` (decreasing confidence of each position's draft token, E.6).
    Raises:
        ValueError: from ``__post_init__`` for any value out of range, with the allowed range.
    """

    block_size: int = 8
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 128
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    confidence_threshold: float = 0.9
    drafter_lora: bool = False
    drafter_width: int = 3
    branches: int = -1
    order: str = "ltr"

    def __post_init__(self):
        if not isinstance(self.block_size, int) or not 2 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block size must be an integer in [2, {MAX_BLOCK_SIZE}], got {shown(self.block_size)}")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= MAX_TEMPERATURE):  # NaN and inf too
            raise ValueError(f"temperature must be a finite number from 0 to {MAX_TEMPERATURE:g}, got "
                             f"{shown(self.temperature)}")
        if not isinstance(self.top_k, int) or not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top-k must be an integer from 0 (off) to {MAX_TOP_K}, got {shown(self.top_k)}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top-p must be in (0, 1], got {shown(self.top_p)}")
        if not isinstance(self.seed, int) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ValueError(f"seed must be an integer from {SEED_RANGE[0]} to {SEED_RANGE[1]} (torch's generator keeps "
                             f"32 bits of a seed: a larger one would repeat a smaller one's run), got {shown(self.seed)}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"the new-token limit must be an integer >= 1, got {shown(self.max_new_tokens)}")
        if isinstance(self.stop_strings, str) or not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(f"stop strings must be a tuple of non-empty texts, got {shown(self.stop_strings)}")
        if not isinstance(self.drafter_lora, bool):
            raise ValueError(f"drafter_lora must be true or false, got {shown(self.drafter_lora)}")
        if not isinstance(self.drafter_width, int) or not 1 <= self.drafter_width <= MAX_BLOCK_SIZE:
            raise ValueError(f"drafter width must be an integer in [1, {MAX_BLOCK_SIZE}], got {shown(self.drafter_width)}")
        if not isinstance(self.branches, int) or not -1 <= self.branches <= MAX_BLOCK_SIZE:
            raise ValueError(f"branches must be -1 (auto) or an integer in [0, {MAX_BLOCK_SIZE}], got {shown(self.branches)}")
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {shown(self.order)}")
        if not 0 < self.confidence_threshold <= 1:
            raise ValueError(f"confidence threshold must be in (0, 1], got {shown(self.confidence_threshold)}")

    @property
    def width(self) -> int:
        """W = B - 1, draft tokens per iteration."""
        return self.block_size - 1

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
