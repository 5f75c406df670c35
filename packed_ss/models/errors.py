"""The models package's error and its one-line message helper (imported by every family file)."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model folder or hub id cannot be loaded as a dual-mode model."""


def some(names, shown: int = 3) -> str:
    """Up to ``shown`` of ``names`` (sorted), then how many more: for one-line load errors."""
    names = sorted(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
