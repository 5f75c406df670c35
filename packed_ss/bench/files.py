"""Result folders where nothing measured is lost: a folder that already holds results is refused unless the run
goes on with them (``--resume``) or sets them aside (``--overwrite`` moves them into ``replaced-<time>/`` inside
the folder, never deletes them), and every report is written to a temporary file and renamed over its name, so
an interruption leaves the old file or the new one, never half of one."""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path

from packed_ss.bench.plan import BenchError

PROBE = ".write-check-"  # prefix of the probe files (one per process of a launch)
LOCK = ".run-lock"  # the file a run holds locked (flock) while it uses the folder
ASIDE = "replaced-"  # prefix of the folders that --overwrite moves earlier results into


def check_out_folder(out_dir, keep: bool = False, overwrite: bool = False, resumable: bool = False) -> None:
    """Create ``out_dir`` and check that files can be written in it, before anything is measured.

    Args:
        out_dir: the ``--out`` value.
        keep: the run goes on with what the folder holds (``--resume``).
        overwrite: earlier results may be set aside (:func:`set_aside`).
        resumable: the command has ``--resume`` (the refusal names it).
    Raises: BenchError naming the folder and the reason: empty, a file in the way, no permission, or earlier
        results there without ``keep`` or ``overwrite``.
    """
    if not isinstance(out_dir, (str, os.PathLike)) or not str(out_dir).strip():
        raise BenchError("--out is empty; give a folder for the results")
    out = Path(out_dir)
    try:
        if out.exists() and not out.is_dir():
            raise BenchError(f"--out {str(out_dir)!r} is a file; give a folder")
        out.mkdir(parents=True, exist_ok=True)
        held = sorted(p.name for p in out.iterdir() if not p.name.startswith(PROBE) and p.name != LOCK)
        # a name of its own: the processes of one launch probe the same folder at once
        with tempfile.NamedTemporaryFile(dir=out, prefix=PROBE):
            pass
    except OSError as error:
        raise BenchError(f"cannot write to --out {str(out_dir)!r}: {error.strerror or error}") from None
    if held and not keep and not overwrite:
        shown = ", ".join(held[:4]) + (f" and {len(held) - 4} more" if len(held) > 4 else "")
        raise BenchError(f"--out {str(out_dir)!r} already holds results ({shown}); give another folder, or "
                         f"--overwrite to move them into {ASIDE}<time>/ there"
                         + (", or --resume to go on with them" if resumable else ""))


class OutLock:
    """One run per result folder: the first process of a launch (``RANK`` 0 or unset) holds ``out/.run-lock``
    locked (``flock``) from before the folder is checked until the run ends; a second run into the same folder is
    refused in one line. The lock goes with the process, however it ends.

    Raises (on creation): BenchError when another run holds the folder, or it cannot be created."""

    def __init__(self, out_dir):
        import fcntl

        self.handle = None
        self.folder, self.created = None, False
        if os.environ.get("RANK", "0") != "0" or not isinstance(out_dir, (str, os.PathLike)) or \
                not str(out_dir).strip():
            return  # another process of this launch (rank 0 holds it), or no folder (check_out_folder says so)
        out = Path(out_dir)
        try:
            created = not out.exists()
            out.mkdir(parents=True, exist_ok=True)
            handle = open(out / LOCK, "a+", encoding="utf-8")
        except OSError:
            return  # check_out_folder names the reason (a file in the way, no permission...)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().strip()[:40] or "another process"
            handle.close()
            raise BenchError(f"--out {str(out_dir)!r} is in use by another run ({holder}): wait for it to end, or "
                             f"give another folder") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}")
        handle.flush()
        self.handle = handle
        self.folder, self.created = out, created

    def release(self) -> None:
        """Free the folder: the lock file is removed (while still held, so no other run can lock the old one), and
        the folder too when this lock created it and nothing was written into it (a refused run leaves nothing)."""
        if self.handle is None:
            return
        try:
            (self.folder / LOCK).unlink(missing_ok=True)
        except OSError:
            pass
        self.handle.close()
        self.handle = None
        if self.created:
            try:
                self.folder.rmdir()  # only when empty
            except OSError:
                pass


def set_aside(out: Path) -> Path | None:
    """Move everything in ``out`` (probe files excepted) into a new ``out/replaced-<UTC time>/``.

    Returns: that folder, or None when there was nothing to move.
    """
    held = [p for p in out.iterdir() if not p.name.startswith(PROBE) and p.name != LOCK] if out.is_dir() else []
    if not held:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    aside = out / f"{ASIDE}{stamp}"
    aside.mkdir()
    for path in held:
        path.rename(aside / path.name)
    return aside


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename (:func:`write_texts`)."""
    write_texts([(path, text)])


def write_texts(items) -> None:
    """Write each ``(path, text)`` of ``items`` through a temporary file in its folder, and rename them over their
    names only once every one is written: a full disk or a file-size limit leaves the old set whole, and no
    temporary file behind.

    Raises: OSError (ENOSPC, EFBIG...) after removing every temporary file."""
    temporaries = []
    try:
        for path, text in items:
            handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.",
                                                 delete=False)
            temporaries.append((Path(handle.name), path))
            with handle:
                handle.write(text)
        for temporary, path in temporaries:
            os.replace(temporary, path)
    except BaseException:
        for temporary, _ in temporaries:
            temporary.unlink(missing_ok=True)
        raise


def frame_text(frame) -> str:
    """A DataFrame as CSV text (no index)."""
    return frame.to_csv(index=False)
