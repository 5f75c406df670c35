"""Schedule registry: one schedule per file, found by name."""

from __future__ import annotations

from packed_ss.iteration import PromptError
from packed_ss.schedules.ar import AR
from packed_ss.schedules.base import Schedule, Session
from packed_ss.schedules.diffusion import Diffusion
from packed_ss.schedules.linear import LinearSS
from packed_ss.schedules.lookup import PromptLookup
from packed_ss.schedules.packed import PackedSS
from packed_ss.schedules.packed_mixed import PackedMixed
from packed_ss.schedules.partial import PartialSS
from packed_ss.schedules.quadratic import QuadraticSS

REGISTRY: dict[str, Schedule] = {s.name: s for s in (AR(), LinearSS(), QuadraticSS(), PackedSS(), Diffusion(),
                                                      PromptLookup(), PackedMixed(), PartialSS())}
SPECULATIVE = ("linear", "quadratic", "packed")  # the self-speculative schedules (the model drafts)
LOSSLESS = SPECULATIVE + ("lookup", "packed-mixed", "partial")  # every schedule whose output must equal AR's (greedy) / follow it (T > 0)


__all__ = ["LOSSLESS", "REGISTRY", "SPECULATIVE", "PromptError", "Schedule", "Session"]
