"""The GPU work of each kind of request (:class:`GpuTasks`), one ``spaces.GPU`` call each on ZeroGPU."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace

from packed_ss.config import DecodeConfig
from packed_ss.cost import CallCost, call_cost, roofline, warm_probe
from packed_ss.divergence import Divergence, divergence
from packed_ss.engine import decode, finish_run, scripted_drafter
from packed_ss.measure import timed_run, warm_up
from packed_ss.models import ModelLoadError
from packed_ss.models.scripted import ScriptedDrafter
from packed_ss.records import IterationRecord, RunRecord
from packed_ss.schedules import SPECULATIVE
from packed_ss.turns import MIN_SLICE_TOKENS, Turns, stop_together, take_turns

from serve.background import Background, progress_note, record_path, wait_for
from serve.costs import CostBook
from serve.errors import ClientGone
from serve.limits import TIME_LIMIT, ComputeGate, cut_off, deadline_after, gated, reference_rows, worst_case_rows
from serve.models import ModelStore


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


COMPILING = ("compiling the probe's call shapes with torch.compile in the background (short requests are served "
             "meanwhile), then fitting them: 172 s on an idle 2-core CPU the first time, where inductor measures its "
             "C++ GEMMs for each shape, 36 s from inductor's cache afterwards")


TICK_S = 3.0  # seconds between two reports of a background compile's progress to the waiting page


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
        if gate is not None:  # a loaded model's warm-up computes (and records CUDA graphs) at the gate too
            store.gate = gate
        self.records = gpu_task(self._records)
        self.race = gpu_task(self._race)
        self.generate = gpu_task(self._generate)
        self.calibration = gpu_task(self._calibration)
        self.divergence = gpu_task(self._divergence)
        self._floor_task, self._floors = gpu_task(self._floor), {}  # (name, precision) -> Roofline
        self.costs = CostBook(gpu_task(self._cost))  # the latest fit of each model (serve.costs)
        self.paths = gpu_task(self._paths)
        self.background = Background(record_path())  # compiling, away from the gate (one job per network)
        self.inline = has_spaces()  # ZeroGPU: a GPU call's work cannot outlive it, so it compiles in the call

    def _tuned(self, model, alive: Callable[[], bool] | None = None) -> None:
        """Measure the torch thread count again where it is due (first use, drift, age:
        :meth:`packed_ss.threads.ThreadTuner.check`), at the gate; the server log gets a line for a new choice, and
        for a probe too slow to measure.
        Raises: ClientGone before a probe call once ``alive()`` is False (a cancelled request stops at once)."""
        tuner = getattr(self.gate, "threads", None)
        if tuner is None:
            return

        def between() -> None:
            if alive is not None and not alive():
                raise ClientGone("the client disconnected; the run was stopped")

        with self.gate.turn(0.0):
            before = tuner.describe()
            choice = tuner.check(model, between, busy=lambda: self.gate.waiting > 0)
            now = tuner.describe()
        if choice is not None or now != before:  # a new choice, or why none was measured (a slow probe)
            print(f"threads: {now}", file=sys.stderr, flush=True)

    def _adapter(self, model, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
                 reference: Sequence[int] | None = None, isolate=None):
        """A run's own adapter: ``model``'s (the one its request got from the store: a reload of ``model_ref``
        meanwhile, after another visitor's loads pushed it out, is not this run's), or a scripted drafter over it
        (``model_ref[2]`` = its quality; ``reference``: the AR output it follows, when already computed, else computed
        through ``isolate``: at the gate, within the request's time limit)."""
        quality = model_ref[2] if len(model_ref) > 2 else None
        if quality is None:
            return model.share()
        if reference is not None:
            return ScriptedDrafter(model.share(), reference, quality, config.seed)
        return scripted_drafter(model, prompt_ids, config, quality, config.seed, isolate)

    def _isolate(self, priority: float, alive: Callable[[], bool] | None = None, owner: object = None,
                 deadline: float | None = None):
        """A run's isolation for :func:`packed_ss.measure.timed_run`: each iteration computed alone at the gate
        (wall time stays honest) at the thread count of the moment it is made (the request's, kept whatever the
        tuner measures meanwhile), stopped once ``alive()`` is False, ended at ``deadline`` (monotonic seconds)."""
        threads = None if self.gate is None else self.gate.count
        return lambda records: gated(records, self.gate, priority, alive, owner, deadline, threads)

    def _records(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
                 schedule: str, priority: float = 0.0, limit_s: float | None = None) -> list[IterationRecord]:
        """Every iteration record of one run (an eager step-through run), those computed within ``limit_s``
        seconds (None: all)."""
        deadline = deadline_after(limit_s)
        model = self.store.get(*model_ref[:2])
        self._tuned(model)
        isolate = self._isolate(priority, deadline=deadline)
        weighed = self._isolate(reference_rows(len(prompt_ids), config), deadline=deadline)  # a whole AR run
        adapter = self._adapter(model, model_ref, prompt_ids, config, isolate=weighed)
        return list(isolate(decode(adapter, list(prompt_ids), config, schedule)))

    def _race(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig,
              schedules: Sequence[str], priority: float = 0.0, alive: Callable[[], bool] | None = None,
              slice_size: int = MIN_SLICE_TOKENS, block_sizes: dict[str, int] | None = None,
              limit_s: float | None = None) -> tuple[Turns, list[RunRecord], int]:
        """Every schedule on its own adapter, side by side in turns (:func:`packed_ss.turns.take_turns`): each
        round raises a common token target by a slice (``slice_size`` tokens without a limit, else planned from
        the time left) and each lane, in an order rotated every round, runs its iterations up to it, every
        iteration measured alone at the gate. ``block_sizes``: a
        schedule's own B where given. ``limit_s``: the race's time limit from the clock (None: none); when it
        comes, every lane stops at the same token count (:func:`packed_ss.turns.stop_together`; stop reason
        :data:`~packed_ss.turns.COMMON_STOP`, or :data:`~serve.limits.TIME_LIMIT` for all when a lane had made
        no token).

        A two-token AR warm-up runs first so that no lane pays one-off start-up costs. Returns the turns, one
        run record per schedule (in ``schedules`` order, text decoded) and how many iterations of other
        requests ran between this race's ones. Raises: ClientGone between two iterations once ``alive()`` is
        False.
        """
        model = self.store.get(*model_ref[:2])
        owner = object()  # this race's turns at the gate
        deadline = deadline_after(limit_s)
        self._tuned(model, alive)  # within the time limit
        isolate = self._isolate(priority, alive, owner, deadline)
        with self.gate.watch(owner) if self.gate is not None else nullcontext(lambda: 0) as others:
            warm_up(model.share(), prompt_ids, [("ar", DecodeConfig(block_size=config.block_size, max_new_tokens=2))],
                    isolate)
            # A scripted drafter follows AR's output: computed once for every lane.
            reference = getattr(self._adapter(model, model_ref, prompt_ids, config, isolate=isolate), "reference", None)
            lanes, adapters, configs = [], [], []
            for schedule in schedules:
                own = replace(config, block_size=(block_sizes or {}).get(schedule, config.block_size))
                adapter = self._adapter(model, model_ref, prompt_ids, own, reference)
                lanes.append((schedule, isolate(decode(adapter, list(prompt_ids), own, schedule))))
                adapters.append(adapter)
                configs.append(own)
            left = None if deadline is None else (lambda: deadline - time.monotonic())
            turns = stop_together(take_turns(lanes, slice_size, config.max_new_tokens, time_left=left))
            interleaved = others()
        runs = [cut_off(finish_run(adapter, list(run.records), own, run.name, len(prompt_ids)))
                for adapter, own, run in zip(adapters, configs, turns.runs)]
        return turns, runs, interleaved

    def _generate(self, model_ref: tuple, prompt_ids: Sequence[int], config: DecodeConfig, schedule: str,
                  priority: float = 0.0, alive: Callable[[], bool] | None = None,
                  limit_s: float | None = None) -> RunRecord:
        """One full run, cut off after ``limit_s`` seconds from the clock (stop reason
        :data:`~serve.limits.TIME_LIMIT`; None: no limit). Raises: ClientGone between two iterations once
        ``alive()`` is False."""
        deadline = deadline_after(limit_s)
        model = self.store.get(*model_ref[:2])
        self._tuned(model, alive)
        isolate = self._isolate(priority, alive, deadline=deadline)
        return cut_off(timed_run(self._adapter(model, model_ref, prompt_ids, config, isolate=isolate), prompt_ids,
                                 config, schedule, isolate))

    def cost(self, model_ref: tuple, alive: Callable[[], bool] | None = None) -> CallCost:
        """The model's latest per-call cost fit (:class:`serve.costs.CostBook`; measured at first use, stopped with
        ClientGone once ``alive()`` turns False)."""
        return self.costs.fit(model_ref, alive)

    def _cost(self, model_ref: tuple, fresh: bool = False, alive: Callable[[], bool] | None = None) -> CallCost:
        """The model's fitted per-call cost (:func:`packed_ss.cost.call_cost`, cached on its network; ``fresh``:
        measured again), each call a turn of the gate, so that nothing else computes during one and short requests
        go between them. Raises: ClientGone before a call once ``alive()`` is False."""
        model = self.store.get(*model_ref[:2])
        return call_cost(model.share(), fresh=fresh, turn=self._turn(alive))

    def _turn(self, alive: Callable[[], bool] | None = None) -> Callable:
        """``() -> context manager``: one turn of the gate (none without a gate), entered only while ``alive()``
        (raises ClientGone once it is False)."""

        @contextmanager
        def turn():
            if alive is not None and not alive():
                raise ClientGone("the client disconnected; the run was stopped")
            with self.gate.turn(0.0) if self.gate is not None else nullcontext():
                yield

        return turn

    def _paths(self, model_ref: tuple, stage: Callable[[int, str], None] | None = None,
               deadline: float | None = None, alive: Callable[[], bool] | None = None) -> dict:
        """The per-call cost fits of eager and compiled calls and the machine's limits for the model, all measured
        again in this one pass (a limit probed at another moment, under another load, was once drawn above the calls
        measured beside it; the compile itself is done once per checkpoint). Every timed call is one turn of the
        compute gate; compiling the probe's shapes runs away from it (:class:`serve.background.Background`, inline on
        ZeroGPU), and this request waits for that only until ``deadline`` (``time.monotonic()``; None: no limit) or
        until ``alive()`` turns False.

        Returns ``eager``, ``compiled`` (None when the model cannot compile, or is still compiling: ``note`` says
        which), ``compiling`` (True while the compile goes on in the background) and ``roofline``.
        ``stage(done, label)``: told before each of the 3 stages (not across processes: None on ZeroGPU)."""
        stage = stage or (lambda done, label: None)
        model = self.store.get(*model_ref[:2])
        turn = self._turn(alive)
        stage(0, "fitting eager calls (about 50 calls of 1-32 rows)")
        eager = call_cost(model.share(compiled=False), fresh=True, turn=turn)
        compiled, note, compiling = None, None, False
        try:
            adapter = model.share(compiled=True)
        except ModelLoadError as error:
            note = str(error)
        else:
            if adapter.graphs:  # CUDA graphs belong to a cache and take seconds: recorded here, then fitted
                stage(1, "recording the probe's call shapes as CUDA graphs, then fitting them")
                with turn():
                    warm_probe(adapter)
            elif self.inline:
                stage(1, COMPILING)
                warm_probe(adapter)
            else:
                stage(1, COMPILING)
                # one job per checkpoint and dtype, not per load: a reload adopts what the first load compiled
                # (serve.models.ModelStore), so its job is the one already done or running
                key = ("compile", self.store.resolve(model_ref[0]), model_ref[1])
                job, _ = self.background.job(key, lambda: warm_probe(model.share(compiled=True)))
                shown = [time.monotonic()]

                def tick() -> None:  # the compile's measured progress, every few seconds
                    if time.monotonic() - shown[0] < TICK_S:
                        return
                    shown[0] = time.monotonic()
                    progress = self.background.progress(key)
                    if progress is not None:
                        stage(1, f"{progress_note(progress)} (short requests are served meanwhile)")

                if not wait_for(job, deadline, alive, tick):
                    compiling = True
                    progress = self.background.progress(key)
                    said = progress_note(progress) if progress is not None else "still compiling in the background"
                    note = (f"{said}. This request's time limit came first: press the button again later for the "
                            f"compiled fit (the compile goes on meanwhile, and other requests are served)")
                elif job.exception() is not None:
                    note = f"compiling failed: {(str(job.exception()) or repr(job.exception())).splitlines()[0]}"
            if not compiling and note is None:
                fit = call_cost(adapter, fresh=True, turn=turn)
                compiled, note = (fit, None) if adapter.compiled else (None, adapter.compile_note)
        stage(2, "measuring the machine's compute and weight-read limits")
        with turn():  # again on every press: the limits drawn beside the fits are measured in the same pass
            limits = roofline(model, fresh=True)
        return {"eager": eager, "compiled": compiled, "note": note, "compiling": compiling, "roofline": limits}

    def floor(self, model_ref: tuple):
        """:meth:`_floor`, measured once per model and precision and kept here (on ZeroGPU the network that
        measured it lives in another process)."""
        key = tuple(model_ref[:2])
        if key not in self._floors:  # None kept too: a model without a floor is not measured again on every view
            self._floors[key] = self._floor_task(model_ref)
        return self._floors[key]

    def _floor(self, model_ref: tuple):
        """The machine's limits for the model (:func:`packed_ss.cost.roofline`: its weight-read floor, measured
        once per network at the gate, about a second on a CPU), or None where they cannot be measured (a model
        without a network, no device memory left)."""
        model = self.store.get(*model_ref[:2])
        try:
            with self.gate.turn(0.0) if self.gate is not None else nullcontext():
                return roofline(model)
        except ValueError:  # no network, or no memory left (roofline says which)
            return None

    def _divergence(self, model_ref: tuple, prompt_ids: Sequence[int], reference: Sequence[int],
                    other: Sequence[int]) -> Divergence | None:
        """Where ``other`` leaves AR's ``reference``, with AR's top-2 margin there (one no-cache forward)."""
        model = self.store.get(*model_ref[:2])
        if self.gate is None:
            return divergence(model, prompt_ids, reference, other)
        with self.gate.turn(0.0):
            return divergence(model, prompt_ids, reference, other)

    def _calibration(self, model_ref: tuple, prompt_ids: Sequence[int], block_sizes: Sequence[int],
                     new_tokens: int, deadline: float | None = None,
                     alive=None) -> list[tuple[int, list[IterationRecord]]]:
        """Short runs of AR (once) and the three speculative schedules at each block size, after one short AR run
        that is not kept (the first calls' overheads), each iteration a turn of the compute gate at the run's
        worst-case rows (as any other request's); no run starts, and none goes on, past ``deadline``
        (``time.monotonic()``; the runs done are returned). Raises: ClientGone when ``alive()`` turns False."""
        model = self.store.get(*model_ref[:2])
        ids = list(prompt_ids)
        threads = None if self.gate is None else self.gate.count  # every run of the set at one thread count
        warm = DecodeConfig(block_size=max(block_sizes), max_new_tokens=2)
        for _ in gated(decode(model.share(), ids, warm, "ar"), self.gate,
                       float(worst_case_rows(["ar"], len(ids), warm)[0][2]), alive, deadline=deadline, threads=threads):
            pass
        out = []
        for i, b in enumerate(block_sizes):
            config = DecodeConfig(block_size=b, max_new_tokens=new_tokens)
            for schedule in (("ar",) if i == 0 else ()) + SPECULATIVE:
                if deadline is not None and time.monotonic() >= deadline:
                    return out
                rows = float(worst_case_rows([schedule], len(ids), config)[0][2])
                records = list(gated(decode(model.share(), ids, config, schedule), self.gate, rows, alive,
                                     deadline=deadline, threads=threads))
                if records:
                    out.append((b, records))
        return out
