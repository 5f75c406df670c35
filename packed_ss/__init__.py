"""packed-ss: self-speculative decoding with diffusion drafting (Linear-SS, Quadratic-SS, Packed-SS).

The engine has no UI imports. Entry points: :func:`packed_ss.engine.decode` (one record per
iteration), :func:`packed_ss.engine.generate` (run to completion) and :func:`custom_generate`, the schedules behind
transformers' ``model.generate(..., custom_generate=packed_ss.custom_generate)`` (:mod:`packed_ss.hf_generate`,
imported on first use: it imports transformers' generation code).

Imported before torch, it first bounds how long OpenMP's waiting threads spin (:func:`packed_ss.threads.bounded_spin`:
OpenMP reads the setting once, when torch loads it; after that nothing is changed).
"""

import sys

from packed_ss import threads as _threads  # imports no torch

if "torch" not in sys.modules:
    _threads.bounded_spin()

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, generate

__all__ = ["DecodeConfig", "custom_generate", "decode", "generate"]


def __getattr__(name: str):
    # PEP 562: packed_ss.custom_generate imports transformers only when first asked for
    if name == "custom_generate":
        from packed_ss.hf_generate import custom_generate

        return custom_generate
    raise AttributeError(f"module 'packed_ss' has no attribute {name!r}")
