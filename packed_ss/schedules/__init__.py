"""Schedule registry: one schedule per file, found by name."""

from __future__ import annotations

from packed_ss.schedules.ar import AR
from packed_ss.schedules.base import PromptError, Schedule, Session
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


def get_schedule(name: str, model=None) -> Schedule:
    """The schedule registered under ``name``; for an any-order ``model`` (``model.any_order``), the
    any-order schedule of that name (:data:`packed_ss.any_order.ORDER_REGISTRY`).

    Raises: ValueError naming the known schedules (those the model supports).
    """
    if getattr(model, "any_order", False):
        from packed_ss.any_order import ORDER_REGISTRY

        if name not in ORDER_REGISTRY:
            raise ValueError(f"schedule {name!r} does not run on an any-order model; choose one of "
                             f"{', '.join(ORDER_REGISTRY)}")
        return ORDER_REGISTRY[name]
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(REGISTRY)}") from None


__all__ = ["LOSSLESS", "REGISTRY", "SPECULATIVE", "PromptError", "Schedule", "Session", "get_schedule"]
