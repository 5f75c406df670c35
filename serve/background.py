"""Long one-off work (compiling a model's call shapes) away from the compute gate (:class:`Background`).

Compiling the probe's shapes took 172-208 s on a 2-core CPU; done at the gate it kept every other request waiting
that long. Here it runs in one thread of its own at a lower CPU priority (nice +10), one torch thread, one job at
a time: the gate's turns (and the short requests behind them) keep going meanwhile and take the CPU first. The
request that asked waits for the job only until its own time limit; the job goes on, and a later request
finds it done.

A job's progress is measured, not guessed (:meth:`Background.progress`): the CPU seconds its thread (and the
compiler processes it waited for) has had against the wall seconds since it began, and what the last finished job of
the same key needed on this machine (recorded in a small JSON file when one finishes). On a busy machine the
low-priority thread may get a small share of a core (16-24 s of CPU in 32 minutes once, on 2 busy cores):
:func:`progress_note` says so in one line instead of promising a time.
"""

from __future__ import annotations

import getpass
import json
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

NICE = 10  # added to the background thread's CPU niceness (Linux: lower priority than every request's thread)
POLL_S = 0.25  # how often a waiting request looks at its job, its client and its time limit
STARVED = 0.25  # a job that got less than this share of one core since it began is starved (said in one line)
STARVED_AFTER_S = 20.0  # wall seconds a job runs before its share of the CPU is judged (its start is noisy)


@dataclass(frozen=True)
class JobProgress:
    """How far a background job has got, measured.

    Attributes:
        wall_s: seconds since it began (or was queued, while it waits for the thread).
        cpu_s: CPU seconds it has had: its thread's CPU clock plus the compiler processes it has waited for (None
            where this system has no per-thread CPU clock).
        needed_cpu_s: CPU seconds the last finished job of the same key took on this machine (None: none recorded).
        done: whether it has ended.
    """

    wall_s: float
    cpu_s: float | None
    needed_cpu_s: float | None
    done: bool = False


def starved(progress: JobProgress) -> bool:
    """Whether the machine starves the job: after :data:`STARVED_AFTER_S` wall seconds it has had less than
    :data:`STARVED` of one core."""
    return (progress.cpu_s is not None and progress.wall_s >= STARVED_AFTER_S
            and progress.cpu_s < STARVED * progress.wall_s)


def progress_note(progress: JobProgress, what: str = "compiling") -> str:
    """One sentence on a job still running: its CPU seconds against its wall seconds, against what the last one
    needed here (with the wall time left at the CPU share it has had, where both are measured), and one line of
    warning when the machine starves it. Never a promised time."""
    text = f"still {what} in the background: {progress.wall_s:.0f} s so far"
    if progress.cpu_s is None:
        return text + " (its CPU time cannot be measured on this system)"
    text += f", {progress.cpu_s:.0f} s of CPU time in them"
    need = progress.needed_cpu_s
    if need is None:
        text += "; no earlier one has finished on this machine to say how much it needs"
    elif progress.cpu_s >= need:
        text += f"; the last one here needed {need:.0f} s of CPU, this one is past that"
    else:
        text += f" of the {need:.0f} s the last one here needed"
        share = progress.cpu_s / progress.wall_s if progress.wall_s > 0 else 0.0
        if share > 0:
            text += f": about {(need - progress.cpu_s) / share:.0f} s more at the share of CPU it has had"
    if starved(progress):
        text += (f". ⚠ This machine is starving it: {100 * progress.cpu_s / max(progress.wall_s, 1e-9):.0f}% of one "
                 f"core since it began (it runs at a lower priority than requests, and other work takes the cores)")
    return text


def record_path() -> Path:
    """Where finished jobs' CPU seconds are kept: beside torch inductor's cache (``TORCHINDUCTOR_CACHE_DIR``, else
    its default folder), since what a compile needs depends on what that cache holds."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        folder = str(Path(tempfile.gettempdir()) / f"torchinductor_{user}")
    return Path(folder) / "packed-ss-background-cpu.json"


def _read_needs(path: Path | None) -> dict[str, float]:
    if path is None:
        return {}
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in found.items() if isinstance(v, (int, float))} if isinstance(found, dict) \
        else {}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _Clock:
    """A running job's CPU clock: read from any thread once the job's own thread has started it."""

    def __init__(self):
        self._clock: int | None = None
        self._begun = False  # False while the job waits for the thread: no CPU had yet
        self._start = self._children = 0.0
        self.stopped: float | None = None  # CPU seconds at the end

    def start(self) -> None:
        try:
            self._clock = time.pthread_getcpuclockid(threading.get_ident())
            self._start = time.clock_gettime(self._clock)
        except (AttributeError, OSError):
            self._clock = None
        self._children = _children_cpu()
        self._begun = True

    def read(self) -> float | None:
        if self.stopped is not None:
            return self.stopped
        if not self._begun:
            return 0.0
        if self._clock is None:
            return None
        try:
            return time.clock_gettime(self._clock) - self._start + max(0.0, _children_cpu() - self._children)
        except OSError:
            return None

    def stop(self) -> None:
        self.stopped = self.read()


def _lower_priority() -> None:
    """Make the calling (background) thread yield the CPU to the others: niceness +:data:`NICE`, one torch thread.
    Where the system refuses (not Linux, a sandbox), the thread runs at the normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + NICE)
    except (AttributeError, OSError):
        pass
    import torch

    torch.set_num_threads(1)


class Background:
    """One low-priority thread for long one-off jobs, each job run once per key (see the module docstring).
    ``needs``: the JSON file where each key's last finished job's CPU seconds are kept (None: not kept)."""

    def __init__(self, needs: Path | None = None):
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # started at the first job, not at import or start-up
        self._jobs: dict[Hashable, tuple[Future, float]] = {}  # key -> (its job, time.monotonic() at submit)
        self._clocks: dict[Hashable, _Clock] = {}
        self.needs = needs

    def job(self, key: Hashable, work: Callable[[], object]) -> tuple[Future, float]:
        """The job for ``key``: the one submitted before (running, queued or done), or ``work`` submitted now (also
        when the earlier one failed, so a failure is tried again). Returns the future and its start time
        (``time.monotonic()``)."""
        with self._lock:
            found = self._jobs.get(key)
            if found is not None and not (found[0].done() and found[0].exception() is not None):
                return found
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, "packed-ss-background", initializer=_lower_priority)
            clock = self._clocks[key] = _Clock()
            self._jobs[key] = found = (self._pool.submit(self._timed, key, clock, work), time.monotonic())
            return found

    def _timed(self, key: Hashable, clock: _Clock, work: Callable[[], object]) -> object:
        """Run ``work`` on the job's CPU clock; a job that ends without error records its CPU seconds."""
        clock.start()
        try:
            result = work()
        finally:
            clock.stop()
        if clock.stopped is not None and self.needs is not None:
            self._record(str(key), clock.stopped)
        return result

    def _record(self, key: str, cpu_s: float) -> None:
        with self._lock:
            needs = _read_needs(self.needs)
            needs[key] = round(cpu_s, 2)
            try:
                self.needs.parent.mkdir(parents=True, exist_ok=True)
                temporary = self.needs.with_name(self.needs.name + f".{os.getpid()}.tmp")
                temporary.write_text(json.dumps(needs, indent=1), encoding="utf-8")
                temporary.replace(self.needs)
            except OSError:  # a read-only folder: the need stays unknown
                pass

    def progress(self, key: Hashable) -> JobProgress | None:
        """The job of ``key`` measured now (None: no job for it)."""
        with self._lock:
            found, clock = self._jobs.get(key), self._clocks.get(key)
        if found is None or clock is None:
            return None
        job, started = found
        return JobProgress(time.monotonic() - started, clock.read(), _read_needs(self.needs).get(str(key)),
                           job.done())


def wait_for(job: Future, deadline: float | None, alive: Callable[[], bool] | None = None,
             tick: Callable[[], None] | None = None) -> bool:
    """Wait for ``job`` until ``deadline`` (``time.monotonic()``; None: no limit) or until ``alive()`` turns False;
    True once it is done (its result or error is then ready). ``tick()``: called at each look (every
    :data:`POLL_S` seconds), e.g. to show the job's progress."""
    while not job.done():
        if alive is not None and not alive():
            return False
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        if tick is not None:
            tick()
        try:
            job.exception(timeout=POLL_S if left is None else min(POLL_S, left))
        except TimeoutError:
            pass
    return True
