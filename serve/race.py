"""A race: AR, Linear-SS, Quadratic-SS and Packed-SS (and optional lanes) on one prompt, each measured
several times in rotating order (:func:`run_race` -> :class:`RaceResult`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.engine import decode
from packed_ss.registry import get_schedule
from packed_ss.schedules import LOSSLESS, REGISTRY, SPECULATIVE

from serve.block_sizes import BestBlockSizes
from serve.gpu import GpuTasks
from serve.lanes import Lane, cost_ratio, lane_from_runs, verdict_text
from serve.limits import MAX_ROWS_PER_REQUEST, TIME_LIMIT, check_work, release_memory, worst_case_seconds
from serve.notes import model_note
from serve.runs import schedule_for
from serve.settings import OPTIONAL_LANES, RunSettings, parse_lanes
from serve.timing import TimingLog


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
        model_note: what the model is (:func:`serve.notes.model_note`).
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
    model_note: str = ""

    @property
    def cut_off(self) -> tuple[str, ...]:
        """Schedules of the lanes the time limit cut off (partial output, not ranked)."""
        return tuple(lane.schedule for lane in self.lanes if lane.cut_off)

    def lane(self, schedule: str) -> Lane | None:
        return next((lane for lane in self.lanes if lane.schedule == schedule), None)

    def to_json(self) -> dict:
        """JSON-ready result: per-lane metrics and agreement with AR."""
        lanes = {}
        for lane in self.lanes:
            metrics = dict(lane.metrics)
            metrics["identical_to_ar"] = None if lane.compared is None and lane.schedule != "ar" else lane.identical
            metrics["compared_tokens"] = lane.compared
            metrics["first_difference"] = lane.first_difference
            metrics["divergence"] = lane.divergence.as_dict() if lane.divergence is not None else None
            metrics["shown"] = lane.shown
            metrics["wall_s_repeats"] = list(lane.wall_s_repeats)
            metrics["wall_s_median"], metrics["wall_s_min"], metrics["wall_s_max"] = lane.wall_range
            metrics["max_rows_per_call"] = lane.max_rows_per_call
            metrics["time_per_nfe_vs_ar"] = cost_ratio(lane, self.lane("ar"))
            lanes[lane.schedule] = metrics
        lossless = [lane for lane in self.lanes if lane.schedule in LOSSLESS]
        compared = [lane for lane in lossless if lane.compared is not None]  # a lane that made nothing claims nothing
        c = self.settings.config
        return {
            "prompt_tokens": self.prompt_tokens,
            "settings": {"schedules": [lane.schedule for lane in self.lanes], "block_size": c.block_size,
                         "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p, "seed": c.seed,
                         "max_new_tokens": c.max_new_tokens, "model": self.settings.model, "order": c.order},
            "left_out": list(self.left_out),
            "cut_off": list(self.cut_off),
            "greedy": self.greedy,
            "reference": "ar",
            "lossless_identical_to_ar": (all(lane.identical for lane in compared) if compared else None),
            "measured": not all(lane.cut_off for lane in self.lanes),
            "compute_s": self.compute_s,
            "repeats": self.repeats,
            "interleaved_iterations": self.interleaved,
            "isolation": self.isolation,
            "block_sizes": {lane.schedule: lane.metrics["block_size"] for lane in self.lanes},
            "block_size_source": self.block_size_source or "the same B for every lane",
            "verdict": verdict_text(self.lanes),
            "model_note": self.model_note,
            "lanes": lanes,
        }


RACE_REPEATS = 3  # measurements per lane in a race (fewer when the row budget does not allow three)


def run_race(tasks: GpuTasks, settings: RunSettings, extra: Sequence[str] = (), log: TimingLog | None = None,
             max_rows: int = MAX_ROWS_PER_REQUEST, alive: Callable[[], bool] | None = None,
             repeats: int = RACE_REPEATS, best: "BestBlockSizes | None" = None,
             max_seconds: float | None = None, admit: Callable | None = None) -> RaceResult:
    """Race AR, Linear, Quadratic and Packed (plus ``extra`` lanes "lookup", "packed-mixed", "partial",
    "diffusion") on one prompt.

    Every lane is measured ``repeats`` times in rotating order (as many as ``max_rows`` and ``max_seconds``
    allow, at least once); each lane replays its median-time run and reports the min-max of the repeats.
    With ``best``, each speculative lane runs at its own fastest B (:class:`BestBlockSizes`), else all at the
    settings' B. ``admit(predicted seconds)``: a context manager held while the race computes
    (:class:`serve.admission.Admission`; used with ``max_seconds``, which gives the prediction). ``max_seconds``
    is also a hard limit from the clock, shared fairly: each run may take the time left over the runs left, so
    every lane runs; a lane still running at its share's end is cut off with its partial output and not ranked
    (:attr:`RaceResult.cut_off`). A predicted time beyond ``max_seconds`` is no refusal: it lowers the repeats.
    Raises: UserError for bad extra lanes, work beyond ``max_rows`` (checked before any run), or a race not
    admitted; ModelLoadError;
    PromptError for empty / too long prompts; ClientGone when ``alive()`` turns False.
    """
    extra = parse_lanes(list(extra))
    model = tasks.store.get(*settings.model_ref[:2])
    schedule_for(model, replace(settings, schedule="ar"))  # the order and drafter suit the model
    ids = settings.prompt_ids(model)
    decode(model.share(), ids, settings.config, "ar")  # validates the prompt before any work
    any_order = getattr(model, "any_order", False)
    # An any-order model races its own schedules (AR left to right, the others in the chosen order; its native
    # decoding as the diffusion lane); lanes it has no version of are left out.
    schedules = ["ar", *SPECULATIVE] + [lane for lane in OPTIONAL_LANES
                                        if lane in extra and (not any_order or lane in ORDER_REGISTRY)]
    left_out = tuple(REGISTRY[lane].title for lane in OPTIONAL_LANES if lane in extra and lane not in schedules)
    reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
    begun = time.monotonic()  # the time limit counts from here: a best-B probe spends part of it
    sizes, source = best.choose(tasks, settings, ids, max_rows, max_seconds) if best is not None else (None, "")
    once = check_work(schedules + reference, len(ids), settings.config, max_rows, block_sizes=sizes,
                      any_order=any_order)
    repeats = max(1, min(repeats, max_rows // max(1, once)))
    once_s = 0.0  # predicted worst case of one measurement of every lane: fewer repeats when it is long
    if max_seconds is not None:
        once_s = worst_case_seconds(schedules + reference, len(ids), settings.config,
                                    tasks.cost(settings.model_ref, alive), block_sizes=sizes, any_order=any_order)
        repeats = max(1, min(repeats, int(max_seconds // max(once_s, 1e-9))))
    left = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - begun))
    start = time.perf_counter()
    try:
        with admit(once_s * repeats) if admit is not None else nullcontext():
            measured, interleaved = tasks.race(settings.model_ref, ids, settings.config, schedules,
                                               float(once * repeats), alive, repeats, sizes, left)
    finally:
        release_memory()
    compute_s = time.perf_counter() - start
    done = [run for runs in measured for run in runs]
    if log is not None:
        for run in done:
            log.add(run.records, run.block_size)
    tasks.costs.observe(settings.model_ref, [record for run in done for record in run.records])
    reference, partial = measured[0][0].token_ids, measured[0][0].stop_reason == TIME_LIMIT
    scripted = "" if settings.scripted is None else f" · scripted\u00a0drafter\u00a0q={settings.scripted:g}"
    order = f" · {settings.config.order} order" if any_order else ""
    titles = {s: get_schedule(s, model).title + (order if s in SPECULATIVE else "") for s in schedules}
    lanes = tuple(lane_from_runs(runs, titles[runs[0].schedule] + (scripted if runs[0].schedule != "ar" else ""),
                                 reference, partial) for runs in measured)
    if settings.config.greedy and not any_order:  # a lossless lane that left AR: near-tie (low precision) or bug?
        lanes = tuple(replace(lane, divergence=tasks.divergence(settings.model_ref, ids, reference, lane.token_ids))
                      if lane.schedule in LOSSLESS and not lane.identical and not lane.cut_off else lane
                      for lane in lanes)
    return RaceResult(settings=settings, lanes=lanes, greedy=settings.config.greedy, compute_s=compute_s,
                      prompt_tokens=len(ids), repeats=repeats, block_size_source=source, interleaved=interleaved,
                      left_out=left_out, model_note=model_note(tasks.store, settings.model, model))
