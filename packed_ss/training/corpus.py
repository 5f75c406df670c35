"""Training corpus for the embedded model: the Python standard library of the running interpreter.

Nothing is downloaded. Files are found through ``sysconfig``, deduplicated by content, and split into
train and held-out sets by file (a stable hash of the relative path decides). Files that contain the
signature line of any HumanEval problem are dropped, so the evaluation prompts cannot leak into training.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from packed_ss.bench.plan import humaneval_prompts

HELD_OUT_PERCENT = 2  # share of files (by path hash) kept out of training


@dataclass(frozen=True)
class CorpusFile:
    """One source file: ``path`` relative to the stdlib root, ``text`` its content."""

    path: str
    text: str


def _signature_lines(problems: list[dict]) -> list[str]:
    """The ``def name(...)`` line of each problem's entry point, used as a leak detector."""
    lines = []
    for problem in problems:
        entry = problem.get("entry_point", "")
        for line in problem["prompt"].splitlines():
            if line.strip().startswith(f"def {entry}("):
                lines.append(line.strip())
    return lines


def _is_held_out(relative_path: str) -> bool:
    digest = hashlib.sha256(relative_path.encode()).digest()
    return digest[0] * 100 // 256 < HELD_OUT_PERCENT


def load_corpus(root: str | None = None) -> tuple[list[CorpusFile], list[CorpusFile]]:
    """Read, deduplicate and split the stdlib sources.

    Args:
        root: folder to read ``*.py`` files from; defaults to ``sysconfig.get_paths()["stdlib"]``.
    Returns:
        ``(train, held_out)`` lists of :class:`CorpusFile`, sorted by path.
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    leak_lines = _signature_lines(humaneval_prompts())
    seen: set[str] = set()
    train: list[CorpusFile] = []
    held_out: list[CorpusFile] = []
    for path in sorted(base.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha256(text.encode()).hexdigest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        if any(line in text for line in leak_lines):
            continue
        relative = str(path.relative_to(base))
        (held_out if _is_held_out(relative) else train).append(CorpusFile(relative, text))
    return train, held_out
