"""Kernel bounds on one sandboxed program: a control group of its own with a task limit and a memory limit.

The host's watchdog (:func:`packed_ss.sandbox.runner._feed_and_wait`) looks at the program's processes every 20 ms
and cannot see everything they hold: System V shared memory belongs to no process (6 programs each detaching
2 x 256 MiB took 3,090 MiB of the host against a 2,048 MiB limit), threads are not processes (3,000 threads
passed) and a fork bomb outruns the polling (631-709 processes against a limit of 32). A control group is counted
by the kernel at each allocation and each ``clone``: ``pids.max`` refuses the 33rd task (threads included) and
``memory.limit_in_bytes`` / ``memory.max`` charges every page the group touches, SysV segments, tmpfs files and
memfds included, and kills inside the group past it. The program's SysV segments live in its own IPC namespace
(bubblewrap's ``--unshare-all``), which the kernel tears down with its last process.

A group is made under the server's own groups of the ``pids`` and ``memory`` controllers (cgroup v1 hierarchies or
the unified v2 one), when they are writable here (a container run as root, a delegated systemd scope). Where they
are not, :func:`kernel_bounds` says why and the watchdog is the outer bound, as before (the page and the CLI name
the sandbox in force: :attr:`packed_ss.sandbox.runner.Sandbox.name`). Every program's group sits in one group of the
process, which bounds the programs graded at once together (the harness grades one per core): half the host's
memory, 64 tasks per core.
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "packed-ss-grade"  # the process's group: PREFIX-<pid>; each program's inside it: PREFIX-<pid>-<count>
TOTAL_TASKS_PER_CORE = 64  # tasks of all programs graded at once, per core (each program has at most 32)
COUNTER = itertools.count()


@dataclass(frozen=True)
class Hierarchy:
    """Where the server's own group of one controller lives.

    Attributes:
        controller: ``pids`` or ``memory``.
        folder: the server's group in that controller's hierarchy (new groups are made inside it).
        unified: cgroup v2 (file names ``pids.max``, ``memory.max``) rather than v1 (``memory.limit_in_bytes``).
    """

    controller: str
    folder: Path
    unified: bool


def _own_groups(text: str) -> dict[str, str]:
    """``{controller or "": path}`` from ``/proc/self/cgroup`` text (``""``: the unified v2 hierarchy)."""
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(",") if parts[1] else [""]:
            found[name] = parts[2]
    return found


def _mounts(text: str) -> list[tuple[str, str, set[str]]]:
    """``(mount point, type, options)`` of the cgroup file systems in ``/proc/mounts`` text."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            found.append((fields[1], fields[2], set(fields[3].split(","))))
    return found


def hierarchies(groups_text: str, mounts_text: str) -> dict[str, Hierarchy]:
    """The server's ``pids`` and ``memory`` groups (whichever exist), from ``/proc/self/cgroup`` and ``/proc/mounts``
    texts: a v1 hierarchy that has the controller, else the v2 one whose ``cgroup.controllers`` lists it."""
    own = _own_groups(groups_text)
    found: dict[str, Hierarchy] = {}
    for point, kind, options in _mounts(mounts_text):
        for controller in ("pids", "memory"):
            if controller in found:
                continue
            if kind == "cgroup" and controller in options and controller in own:
                found[controller] = Hierarchy(controller, Path(point) / own[controller].lstrip("/"), False)
            elif kind == "cgroup2" and "" in own:
                folder = Path(point) / own[""].lstrip("/")
                try:
                    listed = (folder / "cgroup.controllers").read_text().split()
                except OSError:
                    continue
                if controller in listed:
                    found[controller] = Hierarchy(controller, folder, True)
    return found


@dataclass(frozen=True)
class KernelBounds:
    """The kernel's limits on each program: where its groups are made and how much they allow.

    Attributes:
        pids: the ``pids`` hierarchy. memory: the ``memory`` hierarchy.
    """

    pids: Hierarchy
    memory: Hierarchy

    def group(self, tasks: int, memory_mb: int) -> "Group":
        """A new group (one per hierarchy) allowing ``tasks`` tasks (processes and threads) and ``memory_mb`` MiB.

        Raises: OSError when a group cannot be made or limited (the caller then grades without it).
        """
        name = f"{PREFIX}-{os.getpid()}-{next(COUNTER)}"
        made: list[Path] = []
        try:
            for hierarchy in (self.pids, self.memory):
                folder = hierarchy.folder / name
                if folder not in made:
                    folder.mkdir()
                    made.append(folder)
            (self.pids.folder / name / "pids.max").write_text(str(tasks))
            limit = str(memory_mb << 20)
            if self.memory.unified:
                (self.memory.folder / name / "memory.max").write_text(limit)
                swap = self.memory.folder / name / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
            else:
                (self.memory.folder / name / "memory.limit_in_bytes").write_text(limit)
                both = self.memory.folder / name / "memory.memsw.limit_in_bytes"
                if both.exists():
                    try:
                        both.write_text(limit)  # memory and swap together (only where swap accounting is on)
                    except OSError:
                        pass
        except OSError:
            for folder in reversed(made):
                _remove(folder)
            raise
        return Group(tuple(made), self.memory.folder / name, self.memory.unified, self.pids.folder / name)


@dataclass(frozen=True)
class Group:
    """One program's groups (see :class:`KernelBounds`)."""

    folders: tuple[Path, ...]
    memory_folder: Path
    unified: bool
    pids_folder: Path

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the groups (so every task the program makes is born
        inside them); the shell exits 97 without running ``argv`` when it cannot join."""
        joins = " && ".join(f"echo $$ > {shlex.quote(str(folder / 'cgroup.procs'))}" for folder in self.folders)
        return ["/bin/sh", "-c", f"{{ {joins}; }} 2>/dev/null || exit {JOIN_FAILED}; exec \"$@\"", "packed-ss-sandbox",
                *argv]

    def over(self) -> str:
        """Which kernel limit the program met, in a few words, or "" (read before :meth:`close`)."""
        reasons = []
        if _count(self.pids_folder / "pids.events", "max") > 0:
            reasons.append("its task limit (processes and threads; a new one was refused)")
        if self.unified:
            killed = _count(self.memory_folder / "memory.events", "oom_kill")
        else:
            killed = _count(self.memory_folder / "memory.oom_control", "oom_kill")
        if killed > 0:
            reasons.append("its memory limit (a process was killed)")
        return " and ".join(reasons)

    def close(self) -> None:
        """Kill whatever is left in the groups and remove them."""
        for folder in self.folders:
            for _ in range(50):
                pids = _tasks(folder)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                time.sleep(0.01)
            _remove(folder)


JOIN_FAILED = 97  # the wrapper's exit status when it could not join its groups


def _count(path: Path, key: str) -> int:
    """The number after ``key`` in a ``key value`` lines file (0 when absent or unreadable)."""
    try:
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == key:
                return int(parts[1])
    except (OSError, ValueError):
        pass
    return 0


def _tasks(folder: Path) -> list[int]:
    try:
        return [int(pid) for pid in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _remove(folder: Path) -> None:
    for _ in range(50):
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # the last tasks are still leaving


def kernel_bounds() -> tuple[KernelBounds | None, str]:
    """The kernel bounds this machine allows, or None and why not (one line).

    A trial group is made and removed, so that a read-only or undelegated hierarchy is found here, not at the first
    program."""
    try:
        groups_text = Path("/proc/self/cgroup").read_text()
        mounts_text = Path("/proc/mounts").read_text()
    except OSError as error:
        return None, f"control groups cannot be read here ({error.strerror})"
    found = hierarchies(groups_text, mounts_text)
    missing = [c for c in ("pids", "memory") if c not in found]
    if missing:
        return None, f"no {' or '.join(missing)} control group controller here"
    try:
        bounds = _shared_parent(KernelBounds(found["pids"], found["memory"]))
        bounds.group(1, 1).close()
    except OSError as error:
        return None, f"control groups are not writable here ({error.strerror or error})"
    return bounds, ""


def host_memory_mb() -> int:
    """The host's memory in MiB (``MemTotal`` of /proc/meminfo; 0 when it cannot be read)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            return next(int(line.split()[1]) >> 10 for line in handle if line.startswith("MemTotal:"))
    except (OSError, ValueError, StopIteration):
        return 0


def _shared_parent(bounds: KernelBounds) -> KernelBounds:
    """One group per process holding every program's group, so that programs graded at once (one per core) are
    bounded together too: :data:`TOTAL_TASKS_PER_CORE` tasks per core and half the host's memory. Removed when the
    process exits (once empty). Raises: OSError where it cannot be made."""
    import atexit

    name = f"{PREFIX}-{os.getpid()}"
    made = []
    for hierarchy in (bounds.pids, bounds.memory):
        folder = hierarchy.folder / name
        if folder not in made:
            folder.mkdir(exist_ok=True)
            made.append(folder)
            if hierarchy.unified:  # v2: the controllers reach the programs' groups only where the parent passes them
                (folder / "cgroup.subtree_control").write_text("+pids +memory")
    (bounds.pids.folder / name / "pids.max").write_text(str(TOTAL_TASKS_PER_CORE * (os.cpu_count() or 1)))
    total = max(1, host_memory_mb() // 2) << 20
    limit = "memory.max" if bounds.memory.unified else "memory.limit_in_bytes"
    (bounds.memory.folder / name / limit).write_text(str(total))
    atexit.register(lambda: [_remove(folder) for folder in reversed(made)])
    return KernelBounds(Hierarchy("pids", bounds.pids.folder / name, bounds.pids.unified),
                        Hierarchy("memory", bounds.memory.folder / name, bounds.memory.unified))
