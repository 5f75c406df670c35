"""Any-order decoding (paper Appendix C and D.2): schedules for a model that predicts the token at a
mask's own position given tokens earlier in a generation order (a SetDLM-style model).

When a model's config says ``any_order: true``, the engine runs the schedule names ``ar``, ``linear``,
``quadratic``, ``packed`` and ``diffusion`` (its native parallel decoding, unverified) from
:data:`ORDER_REGISTRY` instead of the left-to-right ones, with the order policy of ``DecodeConfig.order``
(``ltr`` or ``confidence``).
"""

from __future__ import annotations

from packed_ss.any_order.ar import OrderAR
from packed_ss.any_order.diffusion import OrderDiffusion
from packed_ss.any_order.linear import OrderLinearSS
from packed_ss.any_order.packed import OrderPackedSS
from packed_ss.any_order.quadratic import OrderQuadraticSS
from packed_ss.any_order.session import CONFIDENCE, LTR, OrderSession
from packed_ss.config import ORDERS

ORDER_REGISTRY = {s.name: s for s in (OrderAR(), OrderLinearSS(), OrderQuadraticSS(), OrderPackedSS(),
                                       OrderDiffusion())}

__all__ = ["CONFIDENCE", "LTR", "ORDERS", "ORDER_REGISTRY", "OrderSession"]
