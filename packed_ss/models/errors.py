"""The models package's error and its one-line message helper (imported by every family file)."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model folder or hub id cannot be loaded as a dual-mode model."""


def some(names, shown: int = 3) -> str:
    """Up to ``shown`` of ``names`` (sorted), then how many more: for one-line load errors."""
    names = sorted(names)
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


NAME_SHOWN = 60  # characters of a model name quoted in a message (a longer one is cut with an ellipsis)


def quoted(name: str) -> str:
    """``name`` quoted for a one-line message, cut to :data:`NAME_SHOWN` characters."""
    return repr(name if len(name) <= NAME_SHOWN else name[:NAME_SHOWN] + "…")


def local_folder(name: str, what: str = "model") -> "Path | None":
    """The local folder a model name names, or None for a hub id (a name that is no folder here).

    Every loader and entry point asks this one question, so a name no file system can hold (a NUL byte, a part
    over 255 bytes, a lone surrogate) gets the same one-line answer everywhere, never an OSError.
    Raises: ModelLoadError for such a name, and for a folder-like name (``./``, ``/``, ``~`` or an existing path)
        without config.json (``what`` names it in the message: "model", "the SetDLM base model").
    """
    from pathlib import Path

    try:
        local = Path(name).expanduser()
        exists = local.exists()
        folder_like = name.startswith((".", "/", "~")) or exists
        if folder_like and not (local / "config.json").is_file():
            raise ModelLoadError(f"{what} folder {quoted(name)} does not exist or has no config.json")
    except (OSError, ValueError, UnicodeError) as error:
        if isinstance(error, ModelLoadError):
            raise
        reason = getattr(error, "strerror", None) or str(error).splitlines()[0]
        raise ModelLoadError(f"{what} {quoted(name)} is no folder or hub id this machine can open ({reason})") from None
    return local if exists else None
