"""packed-ss: self-speculative decoding with diffusion drafting (Linear-SS, Quadratic-SS, Packed-SS).

The engine has no UI imports. Entry points: :func:`packed_ss.engine.decode` (one record per
iteration) and :func:`packed_ss.engine.generate` (run to completion).
"""

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, generate

__all__ = ["DecodeConfig", "decode", "generate"]
