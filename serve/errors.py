"""The serving layer's errors and the one line a visitor sees for any failure (no traceback, ever)."""

from __future__ import annotations

import sys


class UserError(ValueError):
    """Bad input from the page or the API; its message is shown as is (no traceback)."""


class ClientGone(Exception):
    """The client that asked for this work disconnected; the work was stopped."""


def one_line(error: Exception) -> str:
    """One line for the page or the API: a ValueError's (or ClientGone's) own message, else the kind of failure;
    at most 500 characters."""
    if isinstance(error, (ValueError, ClientGone)):
        text = str(error)
    else:
        text = f"unexpected error ({type(error).__name__}): {error}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first if len(first) <= 500 else first[:499] + "…"


def refused(error: Exception, where: str) -> str:
    """:func:`one_line` of ``error``, also printed as one line to the server log (stderr): "refused /where: ..."
    (never a traceback: a refusal is no server fault)."""
    line = one_line(error)
    print(f"refused /{where}: {line}", file=sys.stderr, flush=True)
    return line
