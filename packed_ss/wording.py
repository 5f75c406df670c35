"""Counts in words for messages and pages: ``counted(1, "token")`` is "1 token", ``counted(3, "token")`` "3 tokens"."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` in the number it needs ("1 prompt", "2 prompts", "1 run per lane"); ``plural`` where adding
    an s is wrong. Only the first word is inflected ("run per lane" -> "runs per lane")."""
    if n == 1:
        return f"{n} {noun}"
    if plural is None:
        first, _, rest = noun.partition(" ")
        plural = f"{first}s" + (f" {rest}" if rest else "")
    return f"{n:,} {plural}" if isinstance(n, int) else f"{n} {plural}"
