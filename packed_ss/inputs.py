"""Checks of user text shared by every front end (app, API, CLI, benchmark): one rule everywhere.

A prompt is any non-empty text that is valid Unicode (whitespace-only prompts are allowed: code often
starts with indentation). Values echoed back in error messages are shortened by :func:`shown`, so a
huge number or string never floods a message.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

SHOWN_CHARS = 40  # longest echo of a user value inside an error message
PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Where pip puts the checkout's assets/ (pyproject.toml maps assets/model into the package as packed_ss/assets/model).
INSTALLED_ASSETS = Path(__file__).resolve().parent / "assets"


def embedded_model() -> Path:
    """The embedded model's folder: the copy an install carries (``packed_ss/assets/model``), else the checkout's
    ``assets/model``; the checkout's path when neither holds a ``config.json`` (the loader then names what is
    missing)."""
    for folder in (INSTALLED_ASSETS / "model", PROJECT_ROOT / "assets" / "model"):
        if (folder / "config.json").is_file():
            return folder
    return PROJECT_ROOT / "assets" / "model"


class PromptTextError(ValueError):
    """The prompt is not usable text (not a string, empty, or not valid Unicode)."""


def shown(value, limit: int = SHOWN_CHARS) -> str:
    """A short printable form of ``value`` for an error message (at most about ``limit`` characters).

    Huge integers are written in scientific form with their digit count (any size: no float conversion, no
    decimal string of more digits than Python writes); long strings are cut with an ellipsis and their length.
    Never raises.
    """
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int) and abs(value) >= 10**15:
        return big_integer(value)
    try:
        text = repr(value)
    except ValueError:  # e.g. an object holding an integer too long to write
        return f"a {type(value).__name__} too large to show"
    if len(text) <= limit:
        return text
    size = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return text[: limit - 1] + "…" + size


def big_integer(value: int) -> str:
    """``value`` (an int of 16 digits or more) as its first digits in scientific form and its digit count, e.g.
    ``1e+30 (a 31-digit number)``; past the digits Python writes as text (4,300), the count is approximate."""
    size = abs(value)
    sign = "-" if value < 0 else ""
    if size.bit_length() < 14_000:  # about 4,200 digits: str() writes them
        digits = str(size)
        mantissa = f"{digits[0]}.{digits[1:3]}".rstrip("0").rstrip(".")
        return f"{sign}{mantissa}e+{len(digits) - 1} (a {len(digits):,}-digit number)"
    about = int(size.bit_length() * 0.30102999566398) + 1
    return f"{sign}a number of about {about:,} digits"


def check_prompt(text, what: str = "the prompt") -> str:
    """Return ``text`` if it is a usable prompt.

    Raises:
        PromptTextError: not a string, empty, or holding a lone surrogate (invalid UTF-8 bytes on a
            command line arrive as such, as do unpaired ``\\ud800``-style escapes in JSON).
    """
    if text is None or text == "":
        raise PromptTextError(f"{what} is empty: give some text (a prompt of spaces or newlines alone is taken too)")
    if not isinstance(text, str):
        raise PromptTextError(f"{what} must be text, got {type(text).__name__} {shown(text)}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = text[error.start]
        raise PromptTextError(f"{what} is not valid Unicode text: character {error.start} is the unpaired "
                              f"surrogate U+{ord(bad):04X} (bytes that are not UTF-8, or a lone \\u escape)") from None
    return text


def read_prompt_file(path: str | Path) -> str:
    """The text of a prompt file (UTF-8), checked with :func:`check_prompt`.

    Raises:
        PromptTextError: the file cannot be read, is not a regular file (a FIFO, a device), is not UTF-8 text,
            or is empty; the message names it.
    """
    try:
        if Path(path).exists() and not Path(path).is_file():  # a FIFO or a device would block the read
            raise PromptTextError(f"prompt file {str(path)!r} is not a regular file")
        data = Path(path).read_bytes()
    except OSError as error:
        raise PromptTextError(f"cannot read prompt file {str(path)!r}: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PromptTextError(f"prompt file {str(path)!r} is not UTF-8 text (byte 0x{data[error.start]:02x} "
                              f"at offset {error.start}); save it as UTF-8") from None
    return check_prompt(text, f"prompt file {str(path)!r}")


MAX_THREADS_PER_CORE = 4  # torch threads allowed per CPU core (more only slows down; far more crashes torch)


def threads_problem(threads: int | None) -> str | None:
    """A one-line message when ``--threads`` cannot work here (below 1, or more than
    :data:`MAX_THREADS_PER_CORE` per core of this machine), else None."""
    if threads is None:
        return None
    limit = MAX_THREADS_PER_CORE * (os.cpu_count() or 1)
    if not 1 <= threads <= limit:
        return f"--threads must be from 1 to {limit} on this machine ({os.cpu_count()} cores), got {threads}"
    return None


def model_name(name: str | Path) -> str:
    """How reports and pages name a model: a folder inside the project relative to it (``assets/model``), the
    installed copy of the embedded model as ``assets/model`` too, anything else (a hub id, a folder elsewhere) as
    given, so no report holds this machine's paths."""
    for root, prefix in ((INSTALLED_ASSETS, Path("assets")), (PROJECT_ROOT, Path())):
        try:
            return str(prefix / Path(name).resolve().relative_to(root))
        except (ValueError, OSError):
            continue
    return str(name)


FULL_HASH_LIMIT = 256 * 2**20  # bytes of weights hashed in full; larger checkpoints hash their headers


def model_fingerprint(name: str | Path) -> str:
    """A short content hash of a local model folder for reports (so two reports of "assets/model" can be
    told apart): sha256 of config.json and every safetensors file, in full up to 256 MiB of weights,
    else of each file's size and header (tensor names, shapes, offsets), marked "headers". A hub id
    (no local folder) gives "" (its revision names its content)."""
    try:
        folder = Path(name).expanduser()
        if not (folder / "config.json").is_file():
            return ""
    except (OSError, ValueError):  # no name a folder can have (too long, a NUL byte): a hub id, or refused later
        return ""
    files = [folder / "config.json", *sorted(folder.glob("*.safetensors"))]
    full = sum(f.stat().st_size for f in files) <= FULL_HASH_LIMIT
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode())
        with f.open("rb") as stream:
            if full or f.suffix != ".safetensors":
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
            else:  # safetensors: 8-byte little-endian header length, then the JSON header
                size = int.from_bytes(stream.read(8), "little")
                digest.update(str(f.stat().st_size).encode() + stream.read(min(size, 100 * 2**20)))
    return digest.hexdigest()[:12] + ("" if full else " (headers)")


def positions_problem(model: str | Path, max_new_tokens: int, block_size: int) -> str | None:
    """Why a run of ``max_new_tokens`` at ``block_size`` cannot fit ``model``'s positions even with a one-token
    prompt, read from a local folder's ``config.json`` before anything is loaded (``max_position_embeddings``, also
    under ``text_config``); None when it fits, or when the limit cannot be read without loading (a hub id, no such
    field). The engine checks the real prompt once the model is loaded (:class:`packed_ss.schedules.base.Session`)."""
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return None
    if not isinstance(config, dict):
        return None
    limit = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    needed = 1 + max_new_tokens + 2 * block_size
    if needed <= limit:
        return None
    return (f"{max_new_tokens:,} new tokens + 2 blocks of {block_size} exceed the model's {limit:,} positions even "
            f"with a one-token prompt: lower --max-new-tokens to at most {max(0, limit - 1 - 2 * block_size):,}")
