"""CPU threads for model calls: a spin-bounded OpenMP wait and a thread count chosen by measurement.

On a CPU that other work shares, a torch call with two OpenMP threads waits at every parallel region for the thread
the kernel descheduled, and by default each waiting thread spins for about 300,000 iterations first, taking the
core from the work it waits for. Beside busy processes a 2-thread call of the shipped model is then the slowest of
the settings measured, and one thread avoids the wait altogether (docs/speed.md, "A shared CPU":
``scripts/omp_wait.py``). Hence:

* :func:`bounded_spin`: ``import packed_ss`` calls it when torch is not loaded yet (OpenMP reads its settings once,
  when it loads), so a waiting thread spins briefly and then sleeps;
* :func:`choose_threads`: the thread count whose probe calls are fastest, measured interleaved (fewer threads win
  ties, as they leave more to the neighbours);
* :class:`ThreadTuner`: the server's choice, applied at each turn of its compute gate and measured again when the
  probe's time drifts.

Measured with ``python scripts/thread_choice.py`` (docs/speed.md, "A shared CPU").
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

SPIN_COUNT = "10000"  # GOMP_SPINCOUNT: iterations a waiting OpenMP thread spins before it sleeps (default 300,000)
ROUNDS = 5  # interleaved rounds of probe calls per candidate thread count (the median is kept)
TIE = 0.05  # a larger thread count must be this much faster (relative) to be chosen
DRIFT = 1.5  # the probe's time may change by this factor either way before the choice is measured again
RECHOOSE_S = 300.0  # seconds after which the choice is measured again even without drift
CHECK_S = 30.0  # seconds between two drift checks (3 probes each); no probe in between
# A probe at one thread (wall time) slower than this is not worth measuring per request: torch's default is kept. At
# one thread the probe measures the model more than the machine's load: the shipped model's takes about 40 ms idle and
# 80-100 ms beside two busy processes, where its 2-thread probe took 90-2,200 ms.
MAX_PROBE_MS = 400.0
DROP = 3.0  # a thread count whose first probe is this many times the fastest count's is not probed again


def bounded_spin(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless the user set it or ``OMP_WAIT_POLICY``; call before torch
    is first imported (later it changes nothing). Returns whether it set the variable."""
    environ = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True


def cores() -> int:
    """CPU cores this process may run on (its affinity mask where the system tells, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def candidates(count: int | None = None) -> tuple[int, ...]:
    """Thread counts worth measuring on ``count`` cores (default :func:`cores`): 1, 2, 4, ... and ``count`` itself."""
    count = count or cores()
    out, n = [], 1
    while n < count:
        out.append(n)
        n *= 2
    return tuple(out + [count])


@dataclass(frozen=True)
class ThreadChoice:
    """The outcome of :func:`choose_threads`: ``threads`` chosen and each candidate's median probe milliseconds."""

    threads: int
    ms: Mapping[int, float]

    def describe(self) -> str:
        """One line, e.g. ``1 thread (probe: 1 thread 4.1 ms, 2 threads 9.3 ms)``."""
        times = ", ".join(f"{n} thread{'s' if n > 1 else ''} {ms:.2f} ms" for n, ms in sorted(self.ms.items()))
        return f"{self.threads} thread{'s' if self.threads > 1 else ''} (probe: {times})"


def choose_threads(probe: Callable[[], float], options: Sequence[int] | None = None, rounds: int = ROUNDS,
                   set_threads: Callable[[int], None] | None = None) -> ThreadChoice:
    """Measure ``probe`` (a call returning its milliseconds) ``rounds`` times at each thread count of ``options``
    (default :func:`candidates`), the counts interleaved round by round so that a change of load meets every count,
    and leave torch at the fastest median (the fewest threads within :data:`TIE` of it). A count whose first probe
    took :data:`DROP` times the fastest first probe or more is not probed again (on a busy machine one 2-thread probe
    can take seconds): its median is that one probe.

    Raises: ValueError for an empty ``options`` or a count below 1.
    """
    import torch

    options = candidates() if options is None else tuple(options)
    if not options or min(options) < 1:
        raise ValueError(f"thread counts must be at least 1, got {options}")
    set_threads = set_threads or torch.set_num_threads
    times: dict[int, list[float]] = {n: [] for n in options}
    measured = list(options)
    for round_ in range(rounds):
        for n in measured:
            set_threads(n)
            times[n].append(probe())
        if round_ == 0:
            fastest = min(times[n][0] for n in measured)
            measured = [n for n in measured if times[n][0] < fastest * DROP]
    ms = {n: statistics.median(t) for n, t in times.items()}
    best = min(ms.values())
    threads = min(n for n in options if ms[n] <= best * (1 + TIE))
    set_threads(threads)
    return ThreadChoice(threads, ms)


def probe_call(model) -> Callable[[], float]:
    """A probe for :func:`choose_threads`: milliseconds of a 1-row and an 8-row causal call of ``model`` after 64
    cached tokens (:func:`packed_ss.cost._probe`, on a :meth:`share` of it, so no one's cache is touched)."""
    from packed_ss.cost import _probe

    try:
        adapter = model.share(compiled=False)  # eager: compiled kernels keep the count they were compiled with
    except TypeError:
        adapter = model.share() if hasattr(model, "share") else model

    def run() -> float:
        return sum(ms for _, _, ms in _probe(adapter, 64, (1, 8)))

    return run


def configure_threads(model, threads: int | None) -> str:
    """Set torch's thread count for a command-line run of ``model``: ``threads`` when given (``--threads``), else
    :func:`choose_threads` on the model's probe calls (a CUDA model, or one core: torch's default). Call it before
    the first compiled call (compiled kernels keep the count they were compiled with). Returns one line for stderr,
    e.g. ``threads: 1 thread (probe: 1 thread 4.10 ms, 2 threads 9.30 ms)``."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
        return f"threads: {threads} (given with --threads)"
    if str(getattr(model, "device", "cpu")).startswith("cuda") or len(candidates()) < 2:
        return f"threads: {torch.get_num_threads()} (torch's default)"
    return f"threads: {choose_threads(probe_call(model)).describe()}"


class ThreadTuner:
    """The thread count of a process's model calls (one server's): chosen by measurement, applied per turn.

    ``fixed``: a count the user gave (``--threads``); then nothing is measured. Otherwise :meth:`check` measures
    :func:`candidates` on first use, and again when the probe at the chosen count (checked at most every
    :data:`CHECK_S` seconds) drifts by :data:`DRIFT`, or after :data:`RECHOOSE_S` seconds. A model whose probe takes
    over :data:`MAX_PROBE_MS` keeps torch's default (long calls lose little to a busy core's wait; measuring them per
    request would cost seconds). torch keeps the count per calling thread, so :meth:`apply` sets it in the thread
    about to compute (the compute gate calls it at each turn), torch's count at the tuner's making (:attr:`default`)
    where nothing was chosen. Thread-safe.
    """

    def __init__(self, fixed: int | None = None, options: Sequence[int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        import torch

        self.fixed = fixed
        self.options = tuple(options or candidates())
        self.clock = clock
        self.choice: ThreadChoice | None = None
        # torch's count where the tuner is made (a server's start-up): what calls run with until a measurement chose
        # one. Set at each turn all the same: a thread started later takes the count set last in any thread (the
        # background compile's 1, a measurement's candidates), not this one.
        self.default = torch.get_num_threads()
        self.reason = "given with --threads" if fixed else "not measured yet"
        self._chosen_at = self._checked_at = -float("inf")
        self._lock = threading.Lock()

    @property
    def threads(self) -> int | None:
        """The count calls run with now (None: torch's default, before any measurement)."""
        return self.fixed or (self.choice.threads if self.choice else None)

    @property
    def count(self) -> int:
        """The count a call starting now runs with: :attr:`threads`, or :attr:`default` before a measurement chose
        one."""
        return self.threads or self.default

    def apply(self, count: int | None = None) -> None:
        """Set torch's thread count in the calling thread to ``count`` (a request's, taken from :attr:`count` when it
        was admitted), else to :attr:`count` (nothing when it already is)."""
        import torch

        threads = count or self.count
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)

    def check(self, model, between: Callable[[], None] | None = None,
              busy: Callable[[], bool] | None = None) -> ThreadChoice | None:
        """Measure again if needed (first use, drift, age), on ``model``'s probe calls; call it where nothing else
        computes (at the gate). Returns the new choice when one was made, else None. A CUDA model measures nothing.
        ``between``: called before each probe call; what it raises (a server's ClientGone) ends the measurement
        with nothing chosen, and the next check measures again. ``busy()``: True while other work waits; then a
        choice already made is kept and the check waits for a quiet moment (the probes would delay that work, and
        whichever short request came to check first paid for them: up to 6 s, issue 54)."""
        if self.fixed or len(self.options) < 2 or str(getattr(model, "device", "cpu")).startswith("cuda"):
            return None
        if self.choice is not None and busy is not None and busy():
            self.apply()
            return None
        with self._lock:
            now = self.clock()
            if now - self._checked_at < CHECK_S:
                return None
            before_at, self._checked_at = self._checked_at, now
            call = probe_call(model)

            def probe() -> float:
                if between is not None:
                    between()
                return call()

            try:
                return self._measure(probe, now)
            except BaseException:
                self._checked_at = before_at
                raise

    def _measure(self, probe: Callable[[], float], now: float) -> ThreadChoice | None:
        """The body of :meth:`check` (its lock held): the drift check, then a new choice where one is due."""
        if self.choice is not None and now - self._chosen_at < RECHOOSE_S:
            self.apply()
            current = statistics.median(probe() for _ in range(3))
            before = self.choice.ms[self.choice.threads]
            if before / DRIFT <= current <= before * DRIFT:
                return None
            self.reason = f"the probe drifted from {before:.2f} ms to {current:.2f} ms"
        else:
            self.apply(min(self.options))  # the fewest threads: no OpenMP wait, so the model's cost more than the load's
            start = time.perf_counter()
            probe()
            first = (time.perf_counter() - start) * 1000  # what the request pays per probe, not model time
            if first > MAX_PROBE_MS:
                self.apply()
                self.reason = (f"not measured: one probe at {min(self.options)} thread"
                               f"{'s' if min(self.options) > 1 else ''} takes {first:.0f} ms (over {MAX_PROBE_MS:.0f} ms)")
                self._checked_at = self._chosen_at = self.clock() + RECHOOSE_S  # not again for a while
                return None
            self.reason = "first use" if self.choice is None else f"{RECHOOSE_S:.0f} s since the last choice"
        self.choice = choose_threads(probe, self.options)
        self._chosen_at = self.clock()
        return self.choice

    def describe(self) -> str:
        """One line for a log or a page: the count and why (``--threads``, or the measurement and its reason)."""
        if self.fixed:
            return f"{self.fixed} thread{'s' if self.fixed > 1 else ''} (given with --threads)"
        if self.choice is None:
            return (f"torch's default, {self.default} threads ({self.reason})"
                    if self.reason.startswith("not measured:") else
                    "threads not measured yet (chosen at the first model call)")
        return f"{self.choice.describe()}, measured at {self.reason}"
