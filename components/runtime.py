"""What the app's handlers run on: input validation, a lazy model cache, per-user runs, the race.

No decoding logic lives here: every token comes from :func:`packed_ss.engine.decode` /
:func:`packed_ss.engine.generate`. This module only decides which adapter runs what, keeps each user's
records, and measures. Nothing here is a module-level mutable global: the app's factory creates one
:class:`ModelStore`, one :class:`Sessions` and one :class:`TimingLog` per demo.

Concurrency: each run gets its own :meth:`DualModeModel.share` adapter (its own KV cache), each
:class:`StepRun` has a lock, :class:`ModelStore` loads a model at most once, and every model iteration
takes a turn at the app's :class:`~components.limits.ComputeGate` (one at a time, least work first).
Every request's worst-case work is checked against a row budget before it runs (``components.limits``).
"""

from __future__ import annotations

import itertools
import json
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from packed_ss.config import DecodeConfig
from packed_ss.divergence import Divergence, divergence
from packed_ss.engine import decode, finish_run
from packed_ss.models.scripted import ScriptedDrafter, scripted_drafter
from packed_ss.inputs import PromptTextError, check_prompt, model_name, shown
from packed_ss.records import IterationRecord, RunRecord, summarize
from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.registry import get_schedule
from packed_ss.schedules import LOSSLESS, REGISTRY, SPECULATIVE

from components.limits import (MAX_ROWS_PER_REQUEST, ComputeGate, UserError, check_work, gated,
                               release_memory)
from components.race_panel import Lane, lane_from_runs, verdict_text

DEFAULT_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "model")
# The shipped any-order model (Appendix C), offered beside the default when the operator names no others.
ANY_ORDER_MODEL = str(Path(__file__).resolve().parents[1] / "assets" / "model-anyorder")
NEW_TOKENS_CAP = 512  # largest new-token limit the app accepts
APP_MAX_BLOCK_SIZE = 32  # Quadratic-SS evaluates B(B+1) rows: 1056 at B = 32
MAX_PROMPT_CHARS = 20_000
MAX_SEED = 2**32 - 1  # largest seed the page and the API take (exact as a float; torch takes it)
OPTIONAL_LANES = ("lookup", "packed-mixed", "partial", "diffusion")  # race lanes beyond AR and the self-speculative ones
DRAFTERS = ("model", "scripted")  # the model's own drafter, or the scripted one (packed_ss.models.scripted)
PRECISIONS = ("", "bfloat16", "float32")  # "" = the server's default (bfloat16 on CUDA, float32 on CPU)


# --- settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    """Everything that defines a run: model name, prompt text, schedule, decoding config, the precision
    the model runs in ("" = the server's default: bfloat16 on CUDA, float32 on CPU) and, for teaching,
    the quality q of a scripted drafter (None = the model's own drafter; :mod:`packed_ss.models.scripted`)."""

    model: str
    prompt: str
    schedule: str
    config: DecodeConfig
    precision: str = ""
    scripted: float | None = None

    @property
    def model_ref(self) -> tuple[str, str, float | None]:
        """(model name, precision, scripted drafter quality or None): what a run is decoded with.
        ``ModelStore.get(*model_ref[:2])`` gives the loaded model."""
        return self.model, self.precision, self.scripted


def _whole(value, name: str, low: int | None = None, high: int | None = None) -> int:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a whole number, got {shown(value)}") from None
    if not math.isfinite(number) or number != int(number):
        raise UserError(f"{name} must be a whole number, got {shown(value)}")
    number = int(number)
    if low is not None and high is not None and not low <= number <= high:
        raise UserError(f"{name} must be a whole number from {low} to {high}, got {shown(number)}")
    if low is not None and number < low:
        raise UserError(f"{name} must be at least {low}, got {shown(number)}")
    return number


def _real(value, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{name} must be a number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise UserError(f"{name} must be a finite number, got {shown(value)}")
    return number


def make_settings(model: str | None, prompt: str | None, schedule: str, block_size, temperature, top_k, top_p,
                  seed, max_new_tokens, drafter_lora=False, precision="", drafter="model", drafter_quality=0.8,
                  order="ltr", *, cap: int = NEW_TOKENS_CAP) -> RunSettings:
    """Validate raw page/API values into :class:`RunSettings`.

    Raises:
        UserError: a prompt that is not text, empty or not valid Unicode, a model name that is not text,
            unknown schedule, block size outside [2, 32], negative temperature, new-token limit outside
            [1, cap], seed outside [0, MAX_SEED], a drafter-LoRA switch that is not true/false, a precision
            not in PRECISIONS, a drafter other than "model" or "scripted", a scripted drafter quality
            outside [0, 1], an order other than "ltr" or "confidence", or any value :class:`DecodeConfig`
            rejects.
    """
    try:
        check_prompt(prompt)  # the rule of every front end: non-empty, valid Unicode, whitespace allowed
    except PromptTextError as error:
        raise UserError(str(error)) from None
    if len(prompt) > MAX_PROMPT_CHARS:
        raise UserError(f"the prompt is too long ({len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,})")
    model = text_value(model, "model")
    if not isinstance(schedule, str) or schedule not in REGISTRY:
        raise UserError(f"unknown schedule {shown(schedule)}; choose one of {', '.join(REGISTRY)}")
    block = _whole(block_size, "block size", 2, APP_MAX_BLOCK_SIZE)
    temp = _real(temperature, "temperature")
    if temp < 0:
        raise UserError(f"temperature must be >= 0 (0 = greedy), got {temp}")
    if drafter_lora is None:
        drafter_lora = False
    if not isinstance(drafter_lora, bool):
        raise UserError(f"drafter_lora must be true or false, got {type(drafter_lora).__name__} {shown(drafter_lora)}")
    precision = text_value(precision, "precision").strip()
    if precision not in PRECISIONS:
        raise UserError(f"precision must be bfloat16 or float32 (empty = the server's default), got {shown(precision)}")
    drafter = text_value(drafter, "drafter").strip() or "model"
    if drafter not in DRAFTERS:
        raise UserError(f"drafter must be 'model' (the model's own) or 'scripted', got {shown(drafter)}")
    quality = _real(0.8 if drafter_quality is None else drafter_quality, "drafter quality")
    if not 0 <= quality <= 1:
        raise UserError(f"drafter quality must be from 0 to 1, got {quality}")
    limit = _whole(max_new_tokens, "new-token limit")
    if not 1 <= limit <= cap:
        raise UserError(f"the new-token limit must be from 1 to {cap} (the app's cap), got {limit}")
    try:
        config = DecodeConfig(block_size=block, temperature=temp, top_k=_whole(top_k, "top-k", 0),
                              top_p=_real(top_p, "top-p"), max_new_tokens=limit, seed=_whole(seed, "seed", 0, MAX_SEED),
                              drafter_lora=drafter_lora, order=text_value(order, "order").strip() or "ltr")
    except ValueError as error:
        raise UserError(str(error)) from None
    return RunSettings(model=model.strip(), prompt=prompt, schedule=schedule, config=config, precision=precision,
                       scripted=quality if drafter == "scripted" else None)


def text_value(value, name: str) -> str:
    """A text field's value (None = empty). Raises: UserError when it is not text."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{name} must be text, got {type(value).__name__} {shown(value)}")
    return value


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
    """The models a server offers, loaded on first use, keyed by their resolved identity, at most
    ``capacity`` held at once (least recently used dropped).

    Visitors choose among ``allowed`` models only (default: the default model and any preloaded one),
    never an arbitrary folder or hub id, so nobody can make the server download or hold models the
    operator did not offer. Every spelling of a folder (``./m``, ``m/``, ``m//``) is one model.

    Args:
        default: folder or hub id used for an empty model name.
        device, dtype: passed to :meth:`DualModeModel.from_pretrained` (default: CUDA when present;
            float32 on CPU).
        preloaded: already loaded models by name (tests inject theirs here); they are offered too.
        allowed: further folders or hub ids visitors may choose.
        capacity: models held in memory at once (>= 1).
        family: force a model family for every model (default: detected per model).
        drafter_lora: drafter adapter (path, or subfolder such as ``linear_spec_lora``) attached to every
            model that has it; the others load without one.
    """

    def __init__(self, default: str = DEFAULT_MODEL, device: str | None = None, dtype=None,
                 preloaded: dict | None = None, allowed: Sequence[str] = (), capacity: int = 2,
                 family: str | None = None, drafter_lora: str | None = None):
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.default = str(default)
        self.device = device
        self.dtype = dtype
        self.capacity = capacity
        self.family = family
        self.drafter_lora = drafter_lora
        self._models: OrderedDict[tuple[str, str], object] = OrderedDict(
            ((self.identity(name), str(dtype or "")), model) for name, model in (preloaded or {}).items())
        names = [self.default, *(preloaded or {}), *allowed]
        self._offered: dict[str, str] = {}  # identity -> name as the operator gave it
        for name in names:
            self._offered.setdefault(self.identity(name), str(name))
        self._strings: dict[int, dict[int, str]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()

    @staticmethod
    def identity(name: str) -> str:
        """One key per model: a local folder's resolved absolute path, else the hub id as given."""
        name = str(name).strip()
        local = Path(name).expanduser()
        if name.startswith((".", "/", "~")) or local.exists():
            return str(local.resolve())
        return name

    @property
    def offered(self) -> list[str]:
        """The models visitors may choose, as the operator named them (the default first)."""
        return list(self._offered.values())

    def resolve(self, name: str | None) -> str:
        """The identity of a model name (empty = the default model).

        Raises: UserError when the model is not one this server offers.
        """
        name = (name or "").strip() or self.default
        key = self.identity(name)
        if key not in self._offered:
            raise UserError(f"model {shown(name)} is not offered on this server; choose one of: "
                            f"{', '.join(repr(model_name(n)) for n in self.offered)}")
        return key

    def get(self, name: str | None, precision: str = ""):
        """The loaded :class:`DualModeModel` for ``name`` in ``precision`` ("" = the server's dtype); loads
        it on first use (each precision is a model of its own, counted against ``capacity``).

        Raises: UserError for a model not offered; ModelLoadError (a ValueError) with a readable message
        when loading fails.
        """
        from packed_ss.models import DualModeModel

        dtype = precision or self.dtype
        key = (self.resolve(name), str(dtype or ""))
        with self._lock:
            if key in self._models:
                self._models.move_to_end(key)
                return self._models[key]
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._models:
                    return self._models[key]
            model = DualModeModel.from_pretrained(key[0], device=self.device, dtype=dtype, family=self.family,
                                                  drafter_lora=self.drafter_lora, require_adapter=False)
            warm_up(model)
            with self._lock:
                self._models[key] = model
                while len(self._models) > self.capacity:
                    _, dropped = self._models.popitem(last=False)
                    self._strings.pop(id(dropped), None)
            return model

    def strings_for(self, model) -> Callable[[Sequence[int]], list[str]]:
        """A memoised ``ids -> display strings`` function for ``model`` (one decode per distinct id)."""
        with self._lock:
            memo = self._strings.setdefault(id(model), {})

        def strings(ids: Sequence[int]) -> list[str]:
            missing = [i for i in dict.fromkeys(ids) if i not in memo]
            if missing:
                for i, s in zip(missing, model.token_strings(missing)):
                    memo[i] = s
            return [memo[i] for i in ids]

        return strings

    def loaded(self) -> list[str]:
        """Identities of the models held now (one entry per precision held)."""
        with self._lock:
            return [identity for identity, _ in self._models]


def warm_up(model) -> None:
    """A few untimed calls right after loading (AR and Packed-SS, a handful of tokens), so that one-off
    first-call costs (allocations, kernel choice) do not land in the first visitor's timings or the
    cost fit."""
    never = set(model.never_emit_ids)
    ids = [t for t in range(1, min(256, model.vocab_size)) if t not in never][:8]
    for schedule in ("ar", "packed"):
        finish_run(model, decode(model.share(), ids, DecodeConfig(block_size=4, max_new_tokens=4), schedule),
                   DecodeConfig(block_size=4, max_new_tokens=4), schedule, len(ids))


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
        first_call_only: the shown iteration is shown up to its first call only (Linear-SS stepped by
            call: the drafting call, before its verification).
        finished: the engine stopped (EOS, limit or stop string). lock: held by a handler using the run.
    Raises: PromptError (a ValueError) on creation for an empty or too long prompt.
    """

    def __init__(self, settings: RunSettings, model, tasks: "GpuTasks | None" = None, eager: bool = False,
                 log: TimingLog | None = None, gate: ComputeGate | None = None, max_rows: int = MAX_ROWS_PER_REQUEST):
        if eager and tasks is None:
            raise ValueError("an eager StepRun needs the GpuTasks that compute its records")
        self.settings = settings
        self.model = model
        self.prompt_ids = list(model.encode(settings.prompt))
        # The whole run is bounded like any request (an eager run computes it at once); a Step's turn at
        # the gate weighs one call, so Steps pass ahead of long races between two of their iterations.
        reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
        runner = schedule_for(model, settings)
        check_work([settings.schedule, *reference], len(self.prompt_ids), settings.config, max_rows,
                   any_order=getattr(model, "any_order", False))
        self.gate = gate
        self.priority = float(runner.max_rows(1, replace(settings.config, max_new_tokens=2)))
        if settings.scripted is None or eager:
            self.adapter = model.share()  # this run's own KV cache
        else:
            with gate.turn(self.priority) if gate is not None else nullcontext():
                self.adapter = scripted_drafter(model, self.prompt_ids, settings.config, settings.scripted,
                                                settings.config.seed)
        self.records: list[IterationRecord] = []
        self.position = 0
        self.first_call_only = False
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

    def step(self, by_call: bool = False) -> bool:
        """Show the next iteration, computing it if needed; ``by_call``: an iteration of several calls
        (Linear-SS) is shown one call at a time. Returns False when the run is over."""
        if self.first_call_only:  # the rest of the shown iteration: its verification call
            self.first_call_only = False
            return True
        if not self._advance():
            return False
        self.first_call_only = by_call and len(self.records[self.position - 1].calls) > 1
        return True

    def _advance(self) -> bool:
        if self.position < len(self.records):
            self.position += 1
            return True
        if self.finished:
            return False
        if self._tasks is not None:
            s = self.settings
            new = self._tasks.records(s.model_ref, self.prompt_ids, s.config, s.schedule, self.priority)
            self.finished = True
        else:
            new = list(itertools.islice(gated(self._iterator, self.gate, self.priority), 1))
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
        """Show the previous iteration (stays at 0); from a first call only, the previous whole iteration."""
        self.first_call_only = False
        self.position = max(0, self.position - 1)

    def goto(self, index: int) -> None:
        """Show iteration ``index`` (clamped to the iterations computed so far), all of its calls."""
        self.first_call_only = False
        self.position = max(0, min(int(index), len(self.records)))

    @property
    def at_end(self) -> bool:
        """Whether the last computed iteration is shown whole and the run has stopped."""
        return self.finished and self.position == len(self.records) and not self.first_call_only

    def shown_records(self) -> list[IterationRecord]:
        """Iterations 1..position as shown (the last one up to its first call when ``first_call_only``)."""
        shown = self.records[: self.position]
        if self.first_call_only and shown:
            shown[-1] = shown[-1].first_call()
        return shown

    def summary(self) -> RunRecord:
        """Run metrics over the iterations shown (:meth:`shown_records`)."""
        shown = self.shown_records()
        return summarize(shown, self.settings.schedule, self.settings.config.block_size,
                         self.settings.config.temperature, len(self.prompt_ids))


@dataclass
class UserSession:
    """One browser tab's (or API client's) state: its step run, its last race and the plot it shows."""

    step: StepRun | None = None
    race: "RaceResult | None" = None
    plot_key: tuple | None = None
    playing: bool = False
    by_call: bool = False  # Step shows one call at a time (Linear-SS's drafting call, then its verification)
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
        repeats: measurements per lane (rotating order).
        block_size_source: where each lane's own best B came from ("" = every lane at the settings' B).
        interleaved: iterations of other requests that ran between this race's iterations (0 = isolated).
        left_out: titles of requested lanes the model has no version of (an any-order model).
    """

    @property
    def isolation(self) -> str:
        """One sentence on whether the race had the machine to itself."""
        if not self.interleaved:
            return "Nothing else computed in this process during the race."
        return (f"{self.interleaved} iterations of other requests ran between this race's iterations: each call was "
                f"still measured alone, but caches and memory bandwidth were shared, so treat close results as ties.")

    settings: RunSettings
    lanes: tuple[Lane, ...]
    greedy: bool
    compute_s: float
    prompt_tokens: int
    repeats: int = 1
    block_size_source: str = ""
    interleaved: int = 0
    left_out: tuple[str, ...] = ()

    def lane(self, schedule: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.schedule == schedule), None)

    def to_json(self) -> dict:
        """JSON-ready result: per-lane metrics and agreement with AR."""
        lanes = {}
        for lane in self.lanes:
            metrics = dict(lane.metrics)
            metrics["identical_to_ar"] = lane.identical
            metrics["first_difference"] = lane.first_difference
            metrics["divergence"] = lane.divergence.as_dict() if lane.divergence is not None else None
            metrics["shown"] = lane.shown
            metrics["wall_s_repeats"] = list(lane.wall_s_repeats)
            metrics["wall_s_median"], metrics["wall_s_min"], metrics["wall_s_max"] = lane.wall_range
            lanes[lane.schedule] = metrics
        lossless = [lane for lane in self.lanes if lane.schedule in LOSSLESS]
        c = self.settings.config
        return {
            "prompt_tokens": self.prompt_tokens,
            "settings": {"schedules": [lane.schedule for lane in self.lanes], "block_size": c.block_size,
                         "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p, "seed": c.seed,
                         "max_new_tokens": c.max_new_tokens, "model": self.settings.model, "order": c.order},
            "left_out": list(self.left_out),
            "greedy": self.greedy,
            "reference": "ar",
            "lossless_identical_to_ar": all(lane.identical for lane in lossless),
            "compute_s": self.compute_s,
            "repeats": self.repeats,
            "interleaved_iterations": self.interleaved,
            "isolation": self.isolation,
            "block_sizes": {lane.schedule: lane.metrics["block_size"] for lane in self.lanes},
            "block_size_source": self.block_size_source or "the same B for every lane",
            "verdict": verdict_text(self.lanes),
            "lanes": lanes,
        }


class GpuTasks:
    """The GPU work of each kind of request: one call each, light arguments, CPU data back.

    Each task takes the model *name* and precision (looked up in ``store``, so no model crosses a process boundary),
    token ids and a config, and returns records or run records (tensors in them are CPU tensors). When
    the ``spaces`` package is importable every task is wrapped in ``spaces.GPU`` (ZeroGPU). Create one per
    app at start-up.
    """

    def __init__(self, store: ModelStore, gate: ComputeGate | None = None):
        self.store = store
        self.gate = gate
        self.records = gpu_task(self._records)
        self.race = gpu_task(self._race)
        self.generate = gpu_task(self._generate)
        self.calibration = gpu_task(self._calibration)
        self.divergence = gpu_task(self._divergence)

    def _adapter(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
                 reference: Sequence[int] | None = None):
        """A run's own adapter: the model's, or a scripted drafter over it (``model_ref[2]`` = its quality;
        ``reference``: the AR output it follows, when already computed)."""
        model = self.store.get(*model_ref[:2])
        quality = model_ref[2] if len(model_ref) > 2 else None
        if quality is None:
            return model.share()
        if reference is not None:
            return ScriptedDrafter(model.share(), reference, quality, config.seed)
        return scripted_drafter(model, prompt_ids, config, quality, config.seed)

    def _run(self, adapter, prompt_ids: Sequence[int], config: DecodeConfig, schedule: str, priority: float,
             alive: Callable[[], bool] | None, owner: object = None) -> RunRecord:
        """One run on ``adapter`` (its own), each iteration computed alone at the gate (wall time stays honest)."""
        records = gated(decode(adapter, list(prompt_ids), config, schedule), self.gate, priority, alive, owner)
        return finish_run(adapter, records, config, schedule, len(prompt_ids))

    def _records(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
                 schedule: str, priority: float = 0.0) -> list[IterationRecord]:
        """Every iteration record of one run (an eager step-through run)."""
        return list(gated(decode(self._adapter(model_ref, prompt_ids, config), list(prompt_ids), config, schedule),
                          self.gate, priority))

    def _race(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
              schedules: Sequence[str], priority: float = 0.0, alive: Callable[[], bool] | None = None,
              repeats: int = 1, block_sizes: dict[str, int] | None = None) -> tuple[list[list[RunRecord]], int]:
        """Each schedule to the end ``repeats`` times, one run after the other on its own adapter (each
        iteration measured alone at the gate); the order rotates by one lane per repeat so that no lane
        always runs first. ``block_sizes``: a schedule's own B where given. Returns the runs per schedule,
        in ``schedules`` order, and how many iterations of other requests ran between this race's ones.

        A two-token AR warm-up runs first so that the first lane does not pay one-off start-up costs.
        Raises: ClientGone between two iterations once ``alive()`` is False.
        """
        model = self.store.get(*model_ref[:2])
        owner = object()  # this race's turns at the gate
        with self.gate.watch(owner) if self.gate is not None else nullcontext(lambda: 0) as others:
            self._run(model.share(), prompt_ids, DecodeConfig(block_size=config.block_size, max_new_tokens=2), "ar",
                      priority, alive, owner)
            # A scripted drafter follows AR's output: computed once for every lane and repeat.
            reference = getattr(self._adapter(model_ref, prompt_ids, config), "reference", None)
            runs: dict[str, list[RunRecord]] = {s: [] for s in schedules}
            for rep in range(repeats):
                shift = rep % len(schedules)
                for schedule in list(schedules[shift:]) + list(schedules[:shift]):
                    own = replace(config, block_size=(block_sizes or {}).get(schedule, config.block_size))
                    adapter = self._adapter(model_ref, prompt_ids, own, reference)
                    runs[schedule].append(self._run(adapter, prompt_ids, own, schedule, priority, alive, owner))
            interleaved = others()
        return [runs[s] for s in schedules], interleaved

    def _generate(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig, schedule: str,
                  priority: float = 0.0, alive: Callable[[], bool] | None = None) -> RunRecord:
        """One full run. Raises: ClientGone between two iterations once ``alive()`` is False."""
        return self._run(self._adapter(model_ref, prompt_ids, config), prompt_ids, config, schedule, priority, alive)

    def _divergence(self, model_ref: tuple, prompt_ids: Sequence[int], reference: Sequence[int],
                    other: Sequence[int]) -> Divergence | None:
        """Where ``other`` leaves AR's ``reference``, with AR's top-2 margin there (one no-cache forward)."""
        model = self.store.get(*model_ref[:2])
        if self.gate is None:
            return divergence(model, prompt_ids, reference, other)
        with self.gate.turn(0.0):
            return divergence(model, prompt_ids, reference, other)

    def _calibration(self, model_ref: tuple, prompt_ids: Sequence[int], block_sizes: Sequence[int],
                     new_tokens: int) -> list[tuple[int, list[IterationRecord]]]:
        """Short runs of AR (once) and the three speculative schedules at each block size."""
        model = self.store.get(*model_ref[:2])
        out = []
        for i, b in enumerate(block_sizes):
            config = DecodeConfig(block_size=b, max_new_tokens=new_tokens)
            for schedule in (("ar",) if i == 0 else ()) + SPECULATIVE:
                records = gated(decode(model.share(), list(prompt_ids), config, schedule), self.gate, 0.0)
                out.append((b, list(records)))
        return out


def schedule_for(model, settings: RunSettings):
    """The schedule ``settings`` name on ``model`` (an any-order model has its own, :data:`ORDER_REGISTRY`).

    Raises: UserError for a schedule the model cannot run, the confidence order on a left-to-right
    model, or a scripted drafter or the drafter LoRA on an any-order model."""
    any_order = getattr(model, "any_order", False)
    if any_order and settings.schedule not in ORDER_REGISTRY:
        offered = ", ".join(ORDER_REGISTRY[s].title for s in ORDER_REGISTRY)
        raise UserError(f"{REGISTRY[settings.schedule].title} has no version for an any-order model; choose one of: "
                        f"{offered}")
    if settings.config.order != "ltr" and not any_order:
        raise UserError("verification by confidence needs an any-order model (assets/model-anyorder in the model "
                        "list), or choose the order \"left to right\"")
    if any_order and settings.scripted is not None:
        raise UserError("the scripted drafter works with left-to-right models only: choose the model's own drafter")
    if any_order and settings.config.drafter_lora:
        raise UserError("an any-order model has no drafter adapter: turn the drafter LoRA off")
    return get_schedule(settings.schedule, model)


def parse_lanes(lanes) -> list[str]:
    """Optional race lanes from a list or a comma-separated text: "lookup" (prompt lookup, the peer without a
    drafter), "packed-mixed" (Packed-SS with drafter and n-gram drafts), "partial" (partial-branch SS),
    "diffusion" ("ar", "linear", "quadratic" and "packed" are accepted and change nothing: they are always lanes).

    Raises: UserError for a value that is not text or an unknown lane.
    """
    if isinstance(lanes, str) or lanes is None:
        items = [s.strip() for s in (lanes or "").split(",") if s.strip()]
    elif isinstance(lanes, (list, tuple)):
        items = [text_value(s, "a race lane").strip() for s in lanes]
    else:
        raise UserError(f"lanes must be text such as 'ar,diffusion', got {type(lanes).__name__} {shown(lanes)}")
    unknown = [s for s in items if s not in ("ar", *SPECULATIVE, *OPTIONAL_LANES)]
    if unknown:
        raise UserError(f"optional race lanes are {', '.join(map(repr, OPTIONAL_LANES))}, got "
                        f"{', '.join(map(shown, unknown))}")
    return items


def wants_best_sizes(choice) -> bool:
    """A race's block-size choice: "same" (every lane at the settings' B, default) or "best" (each
    schedule at its own best B). Raises: UserError for anything else."""
    choice = text_value(choice, "block_sizes").strip() or "same"
    if choice not in ("same", "best"):
        raise UserError(f"block_sizes must be 'same' (every lane at B) or 'best' (each schedule at its own best B), "
                        f"got {shown(choice)}")
    return choice == "best"


PROBE_BLOCK_SIZES = (2, 3, 4, 6, 8)  # block sizes a best-B probe tries
PROBE_TOKENS = 32  # new tokens of each probe run
SAVED_REPORT = Path(__file__).resolve().parents[1] / "docs" / "bench-humaneval" / "summary.json"


class BestBlockSizes:
    """Each speculative schedule's fastest B, per model, precision and drafter, kept for the server's life.

    From the saved benchmark report (``docs/bench-humaneval``) when it measured this very model on this
    kind of device in this dtype; otherwise from a short probe on this machine: one greedy run of
    :data:`PROBE_TOKENS` tokens on the race's prompt at each B in :data:`PROBE_BLOCK_SIZES`, the highest
    throughput wins (one prompt: a rough choice, said so on the page).
    """

    def __init__(self, report: Path = SAVED_REPORT):
        self.report = report
        self._found: dict[tuple, tuple[dict[str, int], str]] = {}
        self._lock = threading.Lock()

    def choose(self, tasks: "GpuTasks", settings: RunSettings, prompt_ids: Sequence[int],
               max_rows: int) -> tuple[dict[str, int], str]:
        """``({schedule: B}, where it came from)``. Raises: UserError when a probe would exceed ``max_rows``."""
        model = tasks.store.get(*settings.model_ref[:2])
        key = (tasks.store.resolve(settings.model), str(model.dtype), str(model.device), settings.scripted)
        with self._lock:
            if key in self._found:
                return self._found[key]
        found = self._from_report(key[0], model) or self._probe(tasks, settings, prompt_ids, max_rows)
        with self._lock:
            self._found[key] = found
        return found

    def _from_report(self, identity: str, model) -> tuple[dict[str, int], str] | None:
        try:
            summary = json.loads(self.report.read_text(encoding="utf-8"))
            meta, sizes = summary["meta"], summary["config"]["block_sizes"]
        except (OSError, ValueError, KeyError):
            return None
        same = (meta.get("model") == model_name(identity) and meta.get("dtype") == str(model.dtype).removeprefix("torch.")
                and str(meta.get("device", "")).split(":")[0] == model.device.type)
        if not same or not all(s in sizes for s in SPECULATIVE):
            return None
        lanes = set(SPECULATIVE) | set(OPTIONAL_LANES)  # every lane the saved benchmark measured
        return ({s: int(b) for s, b in sizes.items() if s in lanes and s in REGISTRY},
                f"each schedule's best B from the saved benchmark of this model ({model_name(str(self.report.parent))})")

    @staticmethod
    def _probe(tasks: "GpuTasks", settings: RunSettings, prompt_ids: Sequence[int],
               max_rows: int) -> tuple[dict[str, int], str]:
        base = replace(settings.config, temperature=0.0, max_new_tokens=PROBE_TOKENS)
        runs = [(s, b) for s in SPECULATIVE for b in PROBE_BLOCK_SIZES]
        work = sum(check_work([s], len(prompt_ids), replace(base, block_size=b), max_rows) for s, b in runs)
        if work > max_rows:
            raise UserError(f"finding each schedule's best B needs up to {work:,} model rows on this prompt; this "
                            f"server allows {max_rows:,} per request: use the same B for every lane, or a shorter prompt")
        speed: dict[str, dict[int, float]] = {s: {} for s in SPECULATIVE}
        for s, b in runs:
            run = tasks.generate(settings.model_ref, prompt_ids, replace(base, block_size=b), s, float(work))
            speed[s][b] = run.throughput
        best = {s: max(speed[s], key=speed[s].get) for s in SPECULATIVE}
        tried = ", ".join(map(str, PROBE_BLOCK_SIZES))
        return best, (f"each schedule's best B from a short probe on this machine ({PROBE_TOKENS} tokens of this "
                      f"prompt at B = {tried}; one prompt, so a rough choice)")


RACE_REPEATS = 3  # measurements per lane in a race (fewer when the row budget does not allow three)


def run_race(tasks: GpuTasks, settings: RunSettings, extra: Sequence[str] = (), log: TimingLog | None = None,
             max_rows: int = MAX_ROWS_PER_REQUEST, alive: Callable[[], bool] | None = None,
             repeats: int = RACE_REPEATS, best: "BestBlockSizes | None" = None) -> RaceResult:
    """Race AR, Linear, Quadratic and Packed (plus ``extra`` lanes "lookup", "packed-mixed", "partial", "diffusion") on one
    prompt.

    Every lane is measured ``repeats`` times in rotating order (as many as ``max_rows`` allows, at least
    once); each lane replays its median-time run and reports the min-max of the repeats. With ``best``,
    each speculative lane runs at its own fastest B (:class:`BestBlockSizes`), else all at the settings' B.
    Raises: UserError for bad extra lanes or work beyond ``max_rows`` for one measurement (checked before
    any run); ModelLoadError; PromptError for empty / too long prompts; ClientGone when ``alive()`` turns False.
    """
    extra = parse_lanes(list(extra))
    model = tasks.store.get(*settings.model_ref[:2])
    schedule_for(model, replace(settings, schedule="ar"))  # the order and drafter suit the model
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, settings.config, "ar")  # validates the prompt before any work
    any_order = getattr(model, "any_order", False)
    # An any-order model races its own schedules (AR left to right, the others in the chosen order; its native
    # decoding as the diffusion lane); lanes it has no version of are left out.
    schedules = ["ar", *SPECULATIVE] + [lane for lane in OPTIONAL_LANES
                                        if lane in extra and (not any_order or lane in ORDER_REGISTRY)]
    left_out = tuple(REGISTRY[lane].title for lane in OPTIONAL_LANES if lane in extra and lane not in schedules)
    reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
    sizes, source = best.choose(tasks, settings, ids, max_rows) if best is not None else (None, "")
    once = check_work(schedules + reference, len(ids), settings.config, max_rows, block_sizes=sizes,
                      any_order=any_order)
    repeats = max(1, min(repeats, max_rows // max(1, once)))
    start = time.perf_counter()
    try:
        measured, interleaved = tasks.race(settings.model_ref, ids, settings.config, schedules,
                                           float(once * repeats), alive, repeats, sizes)
    finally:
        release_memory()
    compute_s = time.perf_counter() - start
    if log is not None:
        for runs in measured:
            for run in runs:
                log.add(run.records, run.block_size)
    reference = measured[0][0].token_ids
    scripted = "" if settings.scripted is None else f" · scripted\u00a0drafter\u00a0q={settings.scripted:g}"
    order = f" · {settings.config.order} order" if any_order else ""
    titles = {s: get_schedule(s, model).title + (order if s in SPECULATIVE else "") for s in schedules}
    lanes = tuple(lane_from_runs(runs, titles[runs[0].schedule] + (scripted if runs[0].schedule != "ar" else ""),
                                 reference) for runs in measured)
    if settings.config.greedy and not any_order:  # a lossless lane that left AR: near-tie (low precision) or bug?
        lanes = tuple(replace(lane, divergence=tasks.divergence(settings.model_ref, ids, reference, lane.token_ids))
                      if lane.schedule in LOSSLESS and not lane.identical else lane for lane in lanes)
    return RaceResult(settings=settings, lanes=lanes, greedy=settings.config.greedy, compute_s=compute_s,
                      prompt_tokens=len(ids), repeats=repeats, block_size_source=source, interleaved=interleaved,
                      left_out=left_out)


def run_generate(tasks: GpuTasks, settings: RunSettings, log: TimingLog | None = None,
                 max_rows: int = MAX_ROWS_PER_REQUEST, alive: Callable[[], bool] | None = None) -> RunRecord:
    """One full run of ``settings`` (the ``generate`` API).

    Raises: UserError (work beyond ``max_rows``), ModelLoadError, PromptError, ClientGone.
    """
    model = tasks.store.get(*settings.model_ref[:2])
    schedule_for(model, settings)
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, settings.config, settings.schedule)  # validates before any GPU work
    reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
    work = check_work([settings.schedule, *reference], len(ids), settings.config, max_rows,
                      any_order=getattr(model, "any_order", False))
    try:
        run = tasks.generate(settings.model_ref, ids, settings.config, settings.schedule, float(work), alive)
    finally:
        release_memory()
    if log is not None:
        log.add(run.records, settings.config.block_size)
    return run


def calibrate(tasks: GpuTasks, settings: RunSettings, log: TimingLog, block_sizes: Sequence[int] = (4, 8, 16),
              new_tokens: int = 16) -> int:
    """Feed the cost fit: short runs of AR, Linear, Quadratic and Packed at several block sizes.

    Returns: number of calls measured. Raises: ModelLoadError, PromptError.
    """
    model = tasks.store.get(*settings.model_ref[:2])
    ids = model.encode(settings.prompt)
    decode(model.share(), ids, DecodeConfig(block_size=max(block_sizes), max_new_tokens=new_tokens), "ar")
    calls = 0
    for b, records in tasks.calibration(settings.model_ref, ids, tuple(block_sizes), new_tokens):
        log.add(records, b)
        calls += sum(len(r.calls) for r in records)
    return calls
