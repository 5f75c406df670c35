"""What the app's handlers run on: input validation, a lazy model cache, per-user runs, the race.

No decoding logic lives here: every token comes from :func:`packed_ss.engine.decode` /
:func:`packed_ss.engine.generate`. This module only decides which adapter runs what, keeps each user's
records, and measures. Nothing here is a module-level mutable global: the app's factory creates one
:class:`ModelStore`, one :class:`Sessions` and one :class:`TimingLog` per demo.

Concurrency: each run gets its own :meth:`DualModeModel.share` adapter (its own KV cache), each
:class:`StepRun` has a lock, and :class:`ModelStore` loads a model at most once.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, generate
from packed_ss.records import IterationRecord, RunRecord, summarize
from packed_ss.schedules import REGISTRY, SPECULATIVE

from components.race_panel import Lane, lane_from_run

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "model")
NEW_TOKENS_CAP = 512  # largest new-token limit the app accepts
APP_MAX_BLOCK_SIZE = 32  # Quadratic-SS evaluates B(B+1) rows: 1056 at B = 32
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**32 - 1  # largest seed the page and the API take (exact as a float; torch takes it)


class UserError(ValueError):
    """Bad input from the page or the API; its message is shown as is (no traceback)."""


# --- settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    """Everything that defines a run: model name, prompt text, schedule and decoding config."""

    model: str
    prompt: str
    schedule: str
    config: DecodeConfig


def _whole(value, name: str, low: int | None = None, high: int | None = None) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a whole number, got {value!r}") from None
    if not math.isfinite(number) or number != int(number):
        raise UserError(f"{name} must be a whole number, got {value!r}")
    number = int(number)
    if low is not None and high is not None and not low <= number <= high:
        raise UserError(f"{name} must be a whole number from {low} to {high}, got {number}")
    if low is not None and number < low:
        raise UserError(f"{name} must be at least {low}, got {number}")
    return number


def _real(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UserError(f"{name} must be a finite number, got {value!r}")
    return number


def make_settings(model: str | None, prompt: str | None, schedule: str, block_size, temperature, top_k, top_p,
                  seed, max_new_tokens, *, cap: int = NEW_TOKENS_CAP) -> RunSettings:
    """Validate raw page/API values into :class:`RunSettings`.

    Raises:
        UserError: empty prompt, unknown schedule, block size outside [2, 32], negative temperature,
            new-token limit outside [1, cap], seed outside [0, MAX_SEED], or any value :class:`DecodeConfig`
            rejects.
    """
    if prompt is not None and not isinstance(prompt, str):
        raise UserError(f"the prompt must be text, got {type(prompt).__name__} {prompt!r}")
    if prompt is None or not prompt.strip():
        raise UserError("the prompt is empty: type some text or pick an example")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"the prompt is too long ({len(prompt)} characters; at most {MAX_PROMPT_CHARS})")
    if schedule not in REGISTRY:
        raise UserError(f"unknown schedule {schedule!r}; choose one of {', '.join(REGISTRY)}")
    block = _whole(block_size, "block size", 2, APP_MAX_BLOCK_SIZE)
    temp = _real(temperature, "temperature")
    if temp < 0:
        raise UserError(f"temperature must be >= 0 (0 = greedy), got {temp}")
    limit = _whole(max_new_tokens, "new-token limit")
    if not 1 <= limit <= cap:
        raise UserError(f"the new-token limit must be from 1 to {cap} (the app's cap), got {limit}")
    try:
        config = DecodeConfig(block_size=block, temperature=temp, top_k=_whole(top_k, "top-k", 0),
                              top_p=_real(top_p, "top-p"), max_new_tokens=limit, seed=_whole(seed, "seed", 0, MAX_SEED))
    except ValueError as error:
        raise UserError(str(error)) from None
    return RunSettings(model=(model or "").strip(), prompt=str(prompt), schedule=schedule, config=config)


# --- GPU ----------------------------------------------------------------------------------------------
def gpu_task(fn: Callable) -> Callable:
    """``spaces.GPU(fn)`` when the ``spaces`` package is importable (ZeroGPU), else ``fn`` unchanged.

    Wrapped functions must return CPU data only (records, ids, floats): ZeroGPU runs them in another
    process.
    """
    try:
        import spaces  # type: ignore[import-not-found]
    except ImportError:
        return fn
    return spaces.GPU(fn)


def has_spaces() -> bool:
    """Whether the ``spaces`` package (Hugging Face ZeroGPU) is importable."""
    try:
        import spaces  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return False
    return True


# --- models -------------------------------------------------------------------------------------------
class ModelStore:
    """Models loaded on first use and cached by name (one load per name, even under concurrent requests).

    Args:
        default: folder or hub id used for an empty model name.
        device, dtype: passed to :meth:`DualModeModel.from_pretrained` (default: CUDA when present;
            float32 on CPU).
        preloaded: already loaded models by name (tests inject theirs here).
    """

    def __init__(self, default: str = DEFAULT_MODEL, device: str | None = None, dtype=None,
                 preloaded: dict | None = None):
        self.default = str(default)
        self.device = device
        self.dtype = dtype
        self._models: dict[str, object] = dict(preloaded or {})
        self._strings: dict[str, dict[int, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    def resolve(self, name: str | None) -> str:
        """The cache key of a model name (empty = the default model)."""
        return (name or "").strip() or self.default

    def get(self, name: str | None):
        """The loaded :class:`DualModeModel` for ``name`` (loads it on first use).

        Raises: ModelLoadError (a ValueError) with a readable message when loading fails.
        """
        from packed_ss.model import DualModeModel

        key = self.resolve(name)
        with self._lock:
            if key in self._models:
                return self._models[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._models:
                model = DualModeModel.from_pretrained(key, device=self.device, dtype=self.dtype)
                with self._lock:
                    self._models[key] = model
            return self._models[key]

    def strings_for(self, model) -> Callable[[Sequence[int]], list[str]]:
        """A memoised ``ids -> display strings`` function for ``model`` (one decode per distinct id)."""
        key = str(id(model))
        with self._lock:
            memo = self._strings.setdefault(key, {})

        def strings(ids: Sequence[int]) -> list[str]:
            missing = [i for i in dict.fromkeys(ids) if i not in memo]
            if missing:
                for i, s in zip(missing, model.token_strings(missing)):
                    memo[i] = s
            return [memo[i] for i in ids]

        return strings

    def loaded(self) -> list[str]:
        """Names of the models loaded so far."""
        with self._lock:
            return list(self._models)


# --- measurements -------------------------------------------------------------------------------------
class TimingLog:
    """Measured call and iteration times of this process (bounded), for the cost-model fit.

    ``calls`` holds ``(rows, model_ms)`` of every call; ``iterations`` holds ``(schedule, W, model_ms)`` of
    regular (non-prefill) iterations.
    """

    def __init__(self, limit: int = 50_000):
        self._calls: deque[tuple[int, float]] = deque(maxlen=limit)
        self._iterations: deque[tuple[str, int, float]] = deque(maxlen=limit)
        self._lock = threading.Lock()

    def add(self, records: Sequence[IterationRecord], block_size: int) -> None:
        """Add the calls and iterations of some records (any schedule)."""
        with self._lock:
            for record in records:
                for call in record.calls:
                    self._calls.append((call.layout.rows, call.model_ms))
                prefill = any(call.layout.name.startswith("prefill") for call in record.calls)
                if record.calls and not prefill and record.schedule in ("ar", "linear", "quadratic", "packed"):
                    self._iterations.append((record.schedule, block_size - 1, record.model_ms))

    def snapshot(self) -> tuple[list[tuple[int, float]], list[tuple[str, int, float]]]:
        """Copies of ``(calls, iterations)``."""
        with self._lock:
            return list(self._calls), list(self._iterations)


# --- stepping -------------------------------------------------------------------------------------------
class StepRun:
    """One user's step-through run: the records computed so far and the iteration shown.

    Locally the engine's generator is advanced one iteration per Step (its adapter keeps the KV cache
    between requests). With ``eager=True`` (ZeroGPU, where no GPU state may outlive a request) the
    first Step computes the whole run in one GPU call (``tasks.records``) and later Steps only move
    through it.

    Attributes:
        settings: what the run decodes. prompt_ids: its token ids.
        records: iterations computed so far. position: iteration shown (0 = none yet).
        finished: the engine stopped (EOS, limit or stop string). lock: held by a handler using the run.
    Raises: PromptError (a ValueError) on creation for an empty or too long prompt.
    """

    def __init__(self, settings: RunSettings, model, tasks: "GpuTasks | None" = None, eager: bool = False,
                 log: TimingLog | None = None):
        if eager and tasks is None:
            raise ValueError("an eager StepRun needs the GpuTasks that compute its records")
        self.settings = settings
        self.model = model
        self.prompt_ids = list(model.encode(settings.prompt))
        self.adapter = model.share()  # this run's own KV cache
        self.records: list[IterationRecord] = []
        self.position = 0
        self.finished = False
        self.eager = eager
        self.log = log
        self.lock = threading.Lock()
        self._iterator = decode(self.adapter, self.prompt_ids, settings.config, settings.schedule)  # validates
        self._tasks = tasks if eager else None

    @property
    def done(self) -> int:
        """Iterations computed so far."""
        return len(self.records)

    def step(self) -> bool:
        """Show the next iteration, computing it if needed. Returns False when the run is over."""
        if self.position < len(self.records):
            self.position += 1
            return True
        if self.finished:
            return False
        if self._tasks is not None:
            s = self.settings
            new = self._tasks.records(s.model, self.prompt_ids, s.config, s.schedule)
            self.finished = True
        else:
            try:
                new = [next(self._iterator)]
            except StopIteration:
                new = []
            if not new or new[-1].stop_reason is not None:
                self.finished = True
        if self.log is not None:
            self.log.add(new, self.settings.config.block_size)
        self.records.extend(new)
        if self.position < len(self.records):
            self.position += 1
            return True
        return False

    def back(self) -> None:
        """Show the previous iteration (stays at 0)."""
        self.position = max(0, self.position - 1)

    def goto(self, index: int) -> None:
        """Show iteration ``index`` (clamped to the iterations computed so far)."""
        self.position = max(0, min(int(index), len(self.records)))

    @property
    def at_end(self) -> bool:
        """Whether the last computed iteration is shown and the run has stopped."""
        return self.finished and self.position == len(self.records)

    def summary(self) -> RunRecord:
        """Run metrics over iterations 1..position."""
        shown = self.records[: self.position]
        return summarize(shown, self.settings.schedule, self.settings.config.block_size,
                         self.settings.config.temperature, len(self.prompt_ids))


@dataclass
class UserSession:
    """One browser tab's (or API client's) state: its step run, its last race and the plot it shows."""

    step: StepRun | None = None
    race: "RaceResult | None" = None
    plot_key: tuple | None = None
    playing: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Sessions:
    """Per-user state keyed by Gradio's session hash, least recently used dropped beyond ``capacity``."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self._data: OrderedDict[str, UserSession] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> UserSession:
        """The session of ``key`` (created on first use)."""
        with self._lock:
            session = self._data.pop(key, None) or UserSession()
            self._data[key] = session
            while len(self._data) > self.capacity:
                self._data.popitem(last=False)
            return session

    def drop(self, key: str) -> None:
        """Forget a session (its tab was closed)."""
        with self._lock:
            self._data.pop(key, None)

    def __len__(self) -> int:
        return len(self._data)


# --- race -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RaceResult:
    """A finished race: one lane per schedule (AR always present as the reference).

    Attributes:
        settings: the shared prompt and settings. lanes: AR first, then the requested schedules.
        greedy: temperature 0. compute_s: wall-clock seconds the computation took (lanes run one by one).
    """

    settings: RunSettings
    lanes: tuple[Lane, ...]
    greedy: bool
    compute_s: float
    prompt_tokens: int

    def lane(self, schedule: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.schedule == schedule), None)

    def to_json(self) -> dict:
        """JSON-ready result: per-lane metrics and agreement with AR."""
        lanes = {}
        for lane in self.lanes:
            metrics = dict(lane.metrics)
            metrics["identical_to_ar"] = lane.identical
            metrics["first_difference"] = lane.first_difference
            metrics["shown"] = lane.shown
            lanes[lane.schedule] = metrics
        lossless = [lane for lane in self.lanes if lane.schedule in SPECULATIVE]
        c = self.settings.config
        return {
            "prompt_tokens": self.prompt_tokens,
            "settings": {"schedules": [lane.schedule for lane in self.lanes], "block_size": c.block_size,
                         "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p, "seed": c.seed,
                         "max_new_tokens": c.max_new_tokens, "model": self.settings.model},
            "greedy": self.greedy,
            "reference": "ar",
            "lossless_identical_to_ar": all(lane.identical for lane in lossless),
            "compute_s": self.compute_s,
            "lanes": lanes,
        }


class GpuTasks:
    """The GPU work of each kind of request: one call each, light arguments, CPU data back.

    Each task takes the model *name* (looked up in ``store``, so no model crosses a process boundary),
    token ids and a config, and returns records or run records (tensors in them are CPU tensors). When
    the ``spaces`` package is importable every task is wrapped in ``spaces.GPU`` (ZeroGPU). Create one per
    app at start-up.
    """

    def __init__(self, store: ModelStore):
        self.store = store
        self.records = gpu_task(self._records)
        self.race = gpu_task(self._race)
        self.generate = gpu_task(self._generate)
        self.calibration = gpu_task(self._calibration)

    def _records(self, model_name: str, prompt_ids: Sequence[int], config: DecodeConfig,
                 schedule: str) -> list[IterationRecord]:
        """Every iteration record of one run (an eager step-through run)."""
        return list(decode(self.store.get(model_name).share(), list(prompt_ids), config, schedule))

    def _race(self, model_name: str, prompt_ids: Sequence[int], config: DecodeConfig,
              schedules: Sequence[str]) -> list[RunRecord]:
        """Each schedule to the end, one after the other on its own adapter (wall time measured alone).

        A two-token AR warm-up runs first so that the first lane does not pay one-off start-up costs.
        """
        model = self.store.get(model_name)
        generate(model.share(), list(prompt_ids), DecodeConfig(block_size=config.block_size, max_new_tokens=2), "ar")
        return [generate(model.share(), list(prompt_ids), config, s) for s in schedules]

    def _generate(self, model_name: str, prompt_ids: Sequence[int], config: DecodeConfig, schedule: str) -> RunRecord:
        """One full run."""
        return generate(self.store.get(model_name).share(), list(prompt_ids), config, schedule)

    def _calibration(self, model_name: str, prompt_ids: Sequence[int], block_sizes: Sequence[int],
                     new_tokens: int) -> list[tuple[int, list[IterationRecord]]]:
        """Short runs of AR (once) and the three speculative schedules at each block size."""
        model = self.store.get(model_name)
        out = []
        for i, b in enumerate(block_sizes):
            config = DecodeConfig(block_size=b, max_new_tokens=new_tokens)
            for schedule in (("ar",) if i == 0 else ()) + SPECULATIVE:
                out.append((b, list(decode(model.share(), list(prompt_ids), config, schedule))))
        return out


def run_race(tasks: GpuTasks, settings: RunSettings, extra: Sequence[str] = (), show_ar: bool = False,
             log: TimingLog | None = None) -> RaceResult:
    """Race Linear, Quadratic and Packed (plus ``extra`` lanes: "ar", "diffusion") on one prompt.

    AR always runs as the reference; it is shown only when ``show_ar`` or "ar" is in ``extra``.
    Raises: UserError for bad extra lanes; ModelLoadError; PromptError for empty / too long prompts.
    """
    unknown = [s for s in extra if s not in ("ar", "diffusion")]
    if unknown:
        raise UserError(f"optional race lanes are 'ar' and 'diffusion', got {', '.join(map(repr, unknown))}")
    model = tasks.store.get(settings.model)
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, settings.config, "ar")  # validates the prompt before any work
    schedules = ["ar", *SPECULATIVE] + (["diffusion"] if "diffusion" in extra else [])
    start = time.perf_counter()
    runs = tasks.race(settings.model, ids, settings.config, schedules)
    compute_s = time.perf_counter() - start
    if log is not None:
        for run in runs:
            log.add(run.records, settings.config.block_size)
    reference = runs[0].token_ids
    lanes = tuple(lane_from_run(run, REGISTRY[run.schedule].title, reference,
                                shown=run.schedule != "ar" or show_ar or "ar" in extra) for run in runs)
    return RaceResult(settings=settings, lanes=lanes, greedy=settings.config.greedy, compute_s=compute_s,
                      prompt_tokens=len(ids))


def run_generate(tasks: GpuTasks, settings: RunSettings, log: TimingLog | None = None) -> RunRecord:
    """One full run of ``settings`` (the ``generate`` API). Raises: ModelLoadError, PromptError."""
    model = tasks.store.get(settings.model)
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, settings.config, settings.schedule)  # validates before any GPU work
    run = tasks.generate(settings.model, ids, settings.config, settings.schedule)
    if log is not None:
        log.add(run.records, settings.config.block_size)
    return run


def calibrate(tasks: GpuTasks, settings: RunSettings, log: TimingLog, block_sizes: Sequence[int] = (4, 8, 16),
              new_tokens: int = 16) -> int:
    """Feed the cost fit: short runs of AR, Linear, Quadratic and Packed at several block sizes.

    Returns: number of calls measured. Raises: ModelLoadError, PromptError.
    """
    model = tasks.store.get(settings.model)
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, DecodeConfig(block_size=max(block_sizes), max_new_tokens=new_tokens), "ar")
    calls = 0
    for b, records in tasks.calibration(settings.model, ids, tuple(block_sizes), new_tokens):
        log.add(records, b)
        calls += sum(len(r.calls) for r in records)
    return calls
