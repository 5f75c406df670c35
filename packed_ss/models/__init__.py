"""Dual-mode models behind one adapter (:class:`DualModeModel`), one model family per file."""

from packed_ss.models.adapter import (DTYPES, CallOutput, DualModeModel, ModelLoadError, device_dtype_problem,
                                      hub_unreachable)

__all__ = ["DTYPES", "CallOutput", "DualModeModel", "ModelLoadError", "device_dtype_problem", "hub_unreachable"]
