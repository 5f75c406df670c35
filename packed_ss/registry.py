"""The one place that picks a schedule for a model: the left-to-right schedules
(:data:`packed_ss.schedules.REGISTRY`) or, for an any-order model, their any-order versions
(:data:`packed_ss.any_order.ORDER_REGISTRY`). Neither package imports the other."""

from __future__ import annotations

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.schedules import REGISTRY, Schedule


def get_schedule(name: str, model=None) -> Schedule:
    """The schedule registered under ``name``; for an any-order ``model`` (``model.any_order``), the
    any-order schedule of that name (:data:`packed_ss.any_order.ORDER_REGISTRY`).

    Raises: ValueError naming the known schedules (those the model supports).
    """
    if getattr(model, "any_order", False):
        if name not in ORDER_REGISTRY:
            raise ValueError(f"schedule {name!r} does not run on an any-order model; choose one of "
                             f"{', '.join(ORDER_REGISTRY)}")
        return ORDER_REGISTRY[name]
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(REGISTRY)}") from None
