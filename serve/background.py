"""Long one-off work (compiling a model's call shapes) away from the compute gate (:class:`Background`).

Compiling the probe's shapes took 172-208 s on a 2-core CPU; done at the gate it kept every other request waiting
that long. Here it runs in one thread of its own at a lower CPU priority (nice +10), one torch thread, one job at
a time: the gate's turns (and the short requests behind them) keep going meanwhile and take the CPU first. The
request that asked waits for the job only until its own time limit; the job goes on, and a later request
finds it done.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor

NICE = 10  # added to the background thread's CPU niceness (Linux: lower priority than every request's thread)
POLL_S = 0.25  # how often a waiting request looks at its job, its client and its time limit


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
    """One low-priority thread for long one-off jobs, each job run once per key (see the module docstring)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # started at the first job, not at import or start-up
        self._jobs: dict[Hashable, tuple[Future, float]] = {}  # key -> (its job, time.monotonic() at submit)

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
            self._jobs[key] = found = (self._pool.submit(work), time.monotonic())
            return found


def wait_for(job: Future, deadline: float | None, alive: Callable[[], bool] | None = None) -> bool:
    """Wait for ``job`` until ``deadline`` (``time.monotonic()``; None: no limit) or until ``alive()`` turns False;
    True once it is done (its result or error is then ready)."""
    while not job.done():
        if alive is not None and not alive():
            return False
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return False
        try:
            job.exception(timeout=POLL_S if left is None else min(POLL_S, left))
        except TimeoutError:
            pass
    return True
