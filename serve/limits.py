"""Bounds on what one request may cost a public server: work, turn-taking and memory.

* :func:`check_work` refuses a request before it runs when its worst case exceeds the row budget: the
  sum over its runs of each schedule's ``max_rows`` (every iteration advancing one token).
* :class:`ComputeGate` lets one model iteration run at a time in the process and serves waiting work
  smallest first, so a 4-token request is answered between two iterations of a long race instead of
  after it; every iteration still runs alone, so measured times stay honest.
* :func:`gated` drives a decoding generator one iteration per turn, stops it when the client left, and ends it at
  the request's time limit from the clock (:func:`cut_off` marks such a run). The prediction of
  :func:`worst_case_seconds` refuses nothing: it sorts requests as light or heavy (:mod:`serve.admission`) and
  sets a race's repeats; the clock bounds every request.
* :func:`release_memory` hands freed heap pages back to the system after a large request.

No decoding logic lives here; the row bounds come from the schedules (``Schedule.max_rows``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import heapq
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.config import DecodeConfig
from packed_ss.models.process_state import restore_default_dtype
from packed_ss.models.static import CAPACITY_STEP
from packed_ss.records import RunRecord
from packed_ss.schedules import REGISTRY

from serve.errors import ClientGone, UserError

MAX_ROWS_PER_REQUEST = 100_000  # model rows (tokens evaluated) one request may need in its worst case


def worst_case_rows(schedules: Sequence[str], prompt_len: int, config: DecodeConfig,
                    block_sizes: Mapping[str, int] | None = None, any_order: bool = False) -> list[tuple[str, int, int]]:
    """``(schedule, B, rows)`` per run: the upper bound on the model rows of one run of each schedule in
    ``schedules`` (a schedule listed twice runs twice), at ``block_sizes[schedule]`` when given, else at
    the config's B (``Schedule.max_rows``; the any-order schedules' bounds for an any-order model)."""
    registry = ORDER_REGISTRY if any_order else REGISTRY
    out = []
    for s in schedules:
        b = (block_sizes or {}).get(s, config.block_size)
        out.append((s, b, registry[s].max_rows(prompt_len, replace(config, block_size=b))))
    return out


def reference_rows(prompt_len: int, config: DecodeConfig) -> float:
    """The gate weight (worst-case rows) of a scripted drafter's AR reference run: AR over the run's new tokens plus
    one block (:func:`packed_ss.engine.scripted_drafter`). Its turns weigh this much, not as the Step or run that
    caused it: a visitor's short request goes ahead of it between two of its iterations."""
    longer = replace(config, max_new_tokens=config.max_new_tokens + config.block_size)
    return float(worst_case_rows(["ar"], prompt_len, longer)[0][2])


def check_work(schedules: Sequence[str], prompt_len: int, config: DecodeConfig, limit: int,
               runs: int = 1, block_sizes: Mapping[str, int] | None = None, any_order: bool = False) -> int:
    """Refuse a request whose worst case exceeds ``limit`` rows; return that worst case.

    Args:
        schedules: the runs of the request (a race: every lane, the AR reference included; a schedule
            listed twice counts twice).
        prompt_len: prompt length in tokens. config: the shared settings. runs: repeats of the set.
        block_sizes: per-schedule B where it differs from the config's (a race at each schedule's best B).
        any_order: the runs decode an any-order model (:mod:`packed_ss.any_order`'s bounds).
    Raises:
        UserError: naming the worst-case rows, the heaviest schedule and the settings to lower.
    """
    rows = worst_case_rows(schedules, prompt_len, config, block_sizes, any_order)
    total = runs * sum(r for _, _, r in rows)
    if total > limit:
        heaviest, b, most = max(rows, key=lambda row: row[2])
        raise UserError(
            f"this request could evaluate up to {total:,} model rows ({(ORDER_REGISTRY if any_order else REGISTRY)[heaviest].title} alone up to "
            f"{most:,} at B = {b} with {config.max_new_tokens} new tokens and a "
            f"{prompt_len}-token prompt); this server allows {limit:,} per request: lower the block size, the "
            f"new-token limit or the prompt length")
    return total


MAX_SECONDS_PER_REQUEST = 20.0  # predicted decoder seconds one request may take in its worst case
CALLS_PER_ITERATION = {"linear": 2}  # model calls one iteration makes (every other schedule: 1)
NON_MODEL_MS = 0.5  # ms of decoder time per call outside the model (Python, sampling, records; measured 0.2-0.3)


def worst_case_seconds(schedules: Sequence[str], prompt_len: int, config: DecodeConfig, cost,
                       block_sizes: Mapping[str, int] | None = None, any_order: bool = False) -> float:
    """Upper estimate of the decoder seconds of one run of each schedule in ``schedules``: every iteration
    advancing one token (at most 1 + L iterations, Linear-SS two calls each), each call costing the model's
    fitted ``tau + delta * rows + mu * keys + kappa * rows * keys`` (:func:`packed_ss.cost.call_cost`) plus
    :data:`NON_MODEL_MS`, over the rows of :func:`worst_case_rows` and the keys of :func:`worst_case_keys`."""
    seconds = 0.0
    for schedule, _, rows in worst_case_rows(schedules, prompt_len, config, block_sizes, any_order):
        calls = 1 + config.max_new_tokens * CALLS_PER_ITERATION.get(schedule, 1)
        keys = worst_case_keys(prompt_len, config.max_new_tokens, rows, calls)
        key_ms = keys * cost.kappa_ms + calls * (keys / max(1, rows)) * cost.mu_ms  # mu: per key of each call
        seconds += (calls * (cost.tau_ms + NON_MODEL_MS) + rows * cost.delta_ms + key_ms) / 1000
    return seconds


def worst_case_keys(prompt_len: int, new_tokens: int, rows: int, calls: int) -> int:
    """Upper bound on the (row, attended key) pairs of one run of ``rows`` rows in ``calls`` calls: every row attends
    to at most the whole sequence (the prompt, ``new_tokens`` and the rows of one later call, those spread evenly over
    the later calls), rounded up to a static cache's capacity (whose calls attend over all of it)."""
    per_call = -(-max(0, rows - prompt_len) // max(1, calls - 1))
    capacity = -(-(prompt_len + new_tokens + per_call) // CAPACITY_STEP) * CAPACITY_STEP
    return rows * capacity


class ComputeGate:
    """One model iteration at a time in this process; the waiting turn with the least work goes first.

    ``priority`` is the work of the request a turn belongs to (rows); ties go first come, first served.
    A long request therefore lets shorter ones through between its iterations.

    ``threads``: a :class:`packed_ss.threads.ThreadTuner` whose count is set in the thread of each turn (torch keeps
    the count per thread), so across every concurrent request at most that many torch threads compute at once.
    Each turn also starts from the process's default dtype (put back, with one line in the server's log, where
    something outside a model load left another: :func:`packed_ss.models.process_state.restore_default_dtype`).
    ``holder``: the native id of the thread whose turn it is (None between turns).
    """

    def __init__(self, threads=None):
        self.threads = threads
        self.holder: int | None = None  # native id of the thread computing at the gate now
        self._lock = threading.Lock()
        self._busy = False
        self._waiting: list[tuple[float, int]] = []  # heap of (priority, arrival)
        self._wakers: dict[int, tuple[threading.Event, object]] = {}  # arrival -> (its turn has come, owner)
        self._tickets = itertools.count()
        self._watched: dict[object, int] = {}  # owner -> turns other owners took while it was watched
        self._started = 0  # turns begun so far
        self._released = time.monotonic()  # when the last turn ended

    @property
    def count(self) -> int | None:
        """The torch thread count a request admitted now keeps for all its turns (None: no tuner): a new measurement
        meanwhile, made for another request, changes the later requests' count, not this one's."""
        return None if self.threads is None else self.threads.count

    @contextmanager
    def turn(self, priority: float, owner: object = None, threads: int | None = None):
        """Hold the gate for the body of the ``with`` block (waits for its turn); ``owner`` tags the turn
        for :meth:`watch`; ``threads``: the torch thread count of the request the turn belongs to (:attr:`count` when
        it was admitted; None: the tuner's count now). A waiting turn sleeps until the gate is handed to it: only the
        next turn is woken, so waiting requests take no CPU from the one computing."""
        with self._lock:
            if self._busy:
                arrival, event = next(self._tickets), threading.Event()
                heapq.heappush(self._waiting, (priority, arrival))
                self._wakers[arrival] = (event, owner)
            else:
                event = None
                self._busy = True
                self._count_turn(owner)
                self._started += 1  # counted when granted (a woken turn may not have run a line yet)
        if event is not None:
            event.wait()  # the gate is ours once set (handed over, still busy)
        try:
            self.holder = threading.get_native_id()
            if self.threads is not None:
                self.threads.apply(threads)
            found = restore_default_dtype()  # a turn computes with the process's default dtype, whatever left another
            if found is not None:
                print(found, file=sys.stderr, flush=True)
            yield
        finally:
            with self._lock:
                self.holder = None
                self._released = time.monotonic()
                if self._waiting:
                    _, arrival = heapq.heappop(self._waiting)
                    event, following = self._wakers.pop(arrival)
                    self._count_turn(following)
                    self._started += 1
                    event.set()
                else:
                    self._busy = False

    def _count_turn(self, owner: object) -> None:
        """Note a turn of ``owner`` for every other watched owner (call with the lock held)."""
        for watched in self._watched:
            if watched is not owner:
                self._watched[watched] += 1

    @contextmanager
    def watch(self, owner: object) -> Iterator[Callable[[], int]]:
        """Count the turns of other owners while the block runs; yields a function returning that count
        (a race says whether other requests computed between its iterations)."""
        with self._lock:
            self._watched[owner] = 0
        try:
            yield lambda: self._watched.get(owner, 0)
        finally:
            with self._lock:
                self._watched.pop(owner, None)

    def activity(self) -> tuple[int, float]:
        """(turns begun so far, seconds since the last turn ended: 0 while one is held or waiting). A long request
        that notes the count inside its own turn can tell later whether anybody else has used the gate since, and
        how long ago (see :mod:`tabs.benchmark`)."""
        with self._lock:
            idle = 0.0 if self._busy or self._waiting else time.monotonic() - self._released
            return self._started, idle

    @property
    def waiting(self) -> int:
        """Turns waiting now."""
        with self._lock:
            return len(self._waiting)


TIME_LIMIT = "time limit"  # stop reason of a run the server cut off at its request's time limit


def deadline_after(limit_s: float | None) -> float | None:
    """The ``time.monotonic()`` reading ``limit_s`` seconds from now (None: no limit)."""
    return None if limit_s is None else time.monotonic() + limit_s


def gated(records: Iterator, gate: ComputeGate | None, priority: float,
          alive: Callable[[], bool] | None = None, owner: object = None, deadline: float | None = None,
          threads: int | None = None) -> Iterator:
    """Yield the items of ``records``, computing each one while holding ``gate`` (turns tagged ``owner``, at the
    request's torch thread count ``threads``: :meth:`ComputeGate.turn`); stop (without error) once
    ``time.monotonic()`` has passed ``deadline``: the request's time limit, from the clock.

    Raises: ClientGone before an iteration when ``alive()`` is False (the client disconnected).
    """
    while True:
        if alive is not None and not alive():
            raise ClientGone("the client disconnected; the run was stopped")
        with gate.turn(priority, owner, threads) if gate is not None else nullcontext():
            if deadline is not None and time.monotonic() >= deadline:
                return
            item = next(records, StopIteration)
        if item is StopIteration:
            return
        yield item


def cut_off(run: RunRecord) -> RunRecord:
    """``run`` with the stop reason :data:`TIME_LIMIT` when it stopped before the engine ended it (a run that ends
    always has a stop reason: EOS, the limit or a stop string)."""
    return run if run.stop_reason is not None else replace(run, stop_reason=TIME_LIMIT)


def release_memory() -> None:
    """Give freed heap memory back to the system (glibc ``malloc_trim``; a no-op elsewhere).

    Large requests free their tensors when they end, but glibc keeps the pages for reuse; trimming makes
    the process's resident memory return near its level before the request.
    """
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def client_alive(blocks, session_hash: str | None, listeners=None, origin: object = None) -> Callable[[], bool]:
    """A check that the request of ``session_hash`` now running in a Gradio app (``blocks``) is still wanted.

    Call it from the request's own handler: it notes the request's own event among those running at that moment:
    the one that arrived with ``origin`` (the request's own HTTP request, ``gr.Request.request``: Gradio hands every
    queued event's handler the request of its join), else, where none matches (a direct call), every running event
    of the page (the same ``session_hash``). The check then answers False once one of them is marked not alive (its
    event stream disconnected) or has left the queue's running jobs (the job was cancelled, e.g. gradio_client's
    ``job.cancel()``: Gradio cancels the task but not the thread computing it), or, for a raw
    ``/gradio_api/call`` request, once nobody has opened its result stream for a few seconds (``listeners``:
    :class:`serve.address_shares.CallListeners`). Another event of the same page or client ending (a tab's view,
    a quick request beside a long one) does not end this one. It reads Gradio 6.31 queue internals (pinned in
    requirements.txt) and answers True when it cannot tell.
    """

    def running() -> list:
        queue = getattr(blocks, "_queue", None)
        return [event for jobs in getattr(queue, "active_jobs", None) or [] for event in jobs or []]

    now = running()
    own = [event for event in now if origin is not None and getattr(event, "request", None) is origin]
    mine = own or [event for event in now if getattr(event, "session_hash", None) == session_hash]

    def alive() -> bool:
        if not mine:
            return True
        now = running()
        if listeners is not None and any(listeners.unread(getattr(event, "_id", "")) for event in mine):
            return False
        return all(getattr(event, "alive", True) and any(event is other for other in now) for event in mine)

    return alive
