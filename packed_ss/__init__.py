"""packed-ss: self-speculative decoding with diffusion drafting (Linear-SS, Quadratic-SS, Packed-SS).

The engine has no UI imports. Entry points: :func:`packed_ss.engine.decode` (one record per
iteration) and :func:`packed_ss.engine.generate` (run to completion).

Imported before torch, it first bounds how long OpenMP's waiting threads spin (:func:`packed_ss.threads.bounded_spin`:
OpenMP reads the setting once, when torch loads it; after that nothing is changed).
"""

import sys

from packed_ss import threads as _threads  # imports no torch

if "torch" not in sys.modules:
    _threads.bounded_spin()

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, generate

__all__ = ["DecodeConfig", "decode", "generate"]
