"""Dual-mode models behind one adapter (:class:`DualModeModel`), one model family per file."""

from packed_ss.models.adapter import DTYPES, CallOutput, DualModeModel, device_dtype_problem, hub_unreachable
from packed_ss.models.errors import ModelLoadError

__all__ = ["DTYPES", "CallOutput", "DualModeModel", "ModelLoadError", "device_dtype_problem", "hub_unreachable"]
