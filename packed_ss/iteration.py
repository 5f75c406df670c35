"""What every decoding session shares, left-to-right or any-order: one call's logits with their argmax
(:class:`CallLogits`), the record that closes an iteration (:func:`close_iteration`) and the prompt error.

Shape legend: V vocabulary, R rows.
"""

from __future__ import annotations

import operator
import time
from dataclasses import dataclass

import numpy as np
import torch

from packed_ss.config import DecodeConfig
from packed_ss.records import CallRecord, IterationRecord
from packed_ss.sampling import warp


@dataclass(frozen=True)
class CallLogits:
    """Logits of some rows of one call with each row's argmax, computed once per call (no second pass
    over the vocabulary for the verifier's v and the drafter's proposals).

    Attributes: logits (R, V) float with never-emit ids at -inf; top (R,) argmax token id of each row
    (ties: lowest id); probs (R, V) float64 NumPy array of the warped distributions p or q (T > 0 only,
    warped once for the whole call; None when greedy). Slicing (``rows[a:b]``) slices all three.
    """

    logits: torch.Tensor
    top: tuple[int, ...]
    probs: np.ndarray | None = None

    @staticmethod
    def of(logits: torch.Tensor, never: torch.Tensor) -> "CallLogits":
        """Set the ``never`` ids (K,) of this call's own (R, V) logits to -inf in place and wrap them with
        their argmax. On a CPU both run in NumPy over the same memory (a few microseconds for 12 x 4,096
        floats; torch's argmax takes 50-90 us there); both libraries return the first maximal id."""
        if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
            values = logits.detach().numpy()
            values[:, never.numpy()] = float("-inf")
            return CallLogits(logits, tuple(values.argmax(-1).tolist()))
        logits.index_fill_(-1, never.to(logits.device), float("-inf"))
        return CallLogits(logits, tuple(logits.argmax(-1).tolist()))

    def __getitem__(self, rows: slice) -> "CallLogits":
        if not isinstance(rows, slice):
            raise TypeError("CallLogits takes a slice of rows")
        return CallLogits(self.logits[rows], self.top[rows], None if self.probs is None else self.probs[rows])

    def warped(self, config: DecodeConfig) -> "CallLogits":
        """These rows with ``probs`` set from ``config``'s temperature, top-k and top-p (T > 0)."""
        if config.greedy:
            return self
        probs = warp(self.logits, config.temperature, config.top_k, config.top_p).cpu().numpy()
        return CallLogits(self.logits, self.top, probs)

    def __len__(self) -> int:
        return len(self.top)


def close_iteration(index: int, schedule: str, calls: list[CallRecord], started: float, stop_reason: str | None,
                    **fields) -> IterationRecord:
    """The record of an iteration that began at ``started`` (``time.perf_counter()``): its wall time split
    into model time (the calls') and non-model time, milliseconds, the calls' CUDA graph recording left out
    (``recorded_ms``); ``fields`` fill the rest."""
    recorded_ms = sum(c.recorded_ms for c in calls)
    wall_ms = (time.perf_counter() - started) * 1000 - recorded_ms
    model_ms = sum(c.model_ms for c in calls)
    defaults = dict(old_draft=(), verifier_tokens=(), verifier_probs=(), accept_probs=(), proposals=(),
                    proposal_start=0, kept=(), h=0, appended=(), appended_sources=())
    defaults.update(fields)
    return IterationRecord(index=index, schedule=schedule, calls=tuple(calls), model_ms=model_ms,
                           other_ms=max(0.0, wall_ms - model_ms), stop_reason=stop_reason, recorded_ms=recorded_ms,
                           **defaults)


class PromptError(ValueError):
    """The prompt cannot be decoded (empty, or too long for the model's positions)."""


def checked_inputs(prompt_ids, config, vocab_size: int | None) -> list[int]:
    """The prompt as a list of token ids, after checking what the Python API was given.

    Raises: TypeError for a config that is not a :class:`DecodeConfig` or a prompt that is text or holds
    anything but integers; PromptError (a ValueError) for an id outside ``[0, vocab_size)``.
    """
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    if isinstance(prompt_ids, (str, bytes)) or not hasattr(prompt_ids, "__iter__"):
        raise TypeError(f"prompt_ids must be a sequence of token ids (model.encode(text) gives one), got "
                        f"{type(prompt_ids).__name__}")
    ids = []
    for token in prompt_ids:
        try:
            ids.append(operator.index(token))
        except TypeError:
            raise TypeError(f"prompt_ids must hold integer token ids, got {type(token).__name__} {token!r:.40}") from None
    if vocab_size is not None:
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise PromptError(f"token id {bad} is outside the model's vocabulary (0 to {vocab_size - 1})")
    return ids
