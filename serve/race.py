"""A race: AR, Linear-SS, Quadratic-SS and Packed-SS (and optional lanes) on one prompt, measured side by side
in turns (:mod:`packed_ss.turns`; :func:`run_race` -> :class:`RaceResult`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.engine import decode
from packed_ss.registry import get_schedule
from packed_ss.schedules import LOSSLESS, REGISTRY, SPECULATIVE
from packed_ss.turns import COMMON_STOP, slice_tokens, slices as turn_slices

from serve.block_sizes import BestBlockSizes
from serve.gpu import GpuTasks
from serve.lanes import Lane, cost_ratio, lane_from_run, speed_ratio, verdict_text
from serve.limits import MAX_ROWS_PER_REQUEST, TIME_LIMIT, check_work, release_memory, worst_case_seconds
from serve.notes import forward_note, model_note
from serve.runs import schedule_for
from serve.settings import OPTIONAL_LANES, RunSettings, parse_lanes
from serve.timing import TimingLog


# --- race -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RaceResult:
    """A finished race: one lane per schedule (AR always present as the reference).

    Attributes:
        settings: the shared prompt and settings. lanes: AR first, then the requested schedules.
        greedy: temperature 0. compute_s: wall-clock seconds the computation took (the lanes' turns together).
        rounds: rounds of turns (each lane advanced once per round, the order rotated every round).
        slice_range: (smallest, largest) rise of the common token target from one round to the next (tokens).
        stopped_at: the token count every lane was stopped at when the time limit came (None: every lane ran
            to its own end; 0: a lane had made no token, so every lane is cut off and nothing is ranked).
        block_size_source: where each lane's own best B came from ("" = every lane at the settings' B).
        interleaved: iterations of other requests that ran between this race's iterations (0 = isolated).
        left_out: titles of requested lanes the model has no version of (an any-order model).
        model_note: what the model is (:func:`serve.notes.model_note`).
    """

    @property
    def isolation(self) -> str:
        """One sentence on whether the race had the machine to itself."""
        if not self.interleaved:
            return ("Nothing else computed in this process during the race (other programs on the machine may have: "
                    "the lanes met their load alike, and the intervals say how much it mattered).")
        return (f"{self.interleaved} iterations of other requests ran between this race's iterations: each call was "
                f"still measured alone, but caches and memory bandwidth were shared, so treat close results as ties.")

    settings: RunSettings
    lanes: tuple[Lane, ...]
    greedy: bool
    compute_s: float
    prompt_tokens: int
    rounds: int = 0
    slice_range: tuple[int, int] = (0, 0)
    stopped_at: int | None = None
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
        ar = self.lane("ar")
        for lane in self.lanes:
            metrics = dict(lane.metrics)
            metrics["identical_to_ar"] = None if lane.compared is None and lane.schedule != "ar" else lane.identical
            metrics["compared_tokens"] = lane.compared
            metrics["first_difference"] = lane.first_difference
            metrics["divergence"] = lane.divergence.as_dict() if lane.divergence is not None else None
            metrics["shown"] = lane.shown
            metrics["slices"] = [list(pair) for pair in lane.slices]
            ratio = speed_ratio(lane, ar) if ar is not None and lane is not ar else None
            metrics["speed_vs_ar"] = ratio.as_dict() if ratio is not None else None
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
            "rounds": self.rounds,
            "slice_tokens": list(self.slice_range),
            "stopped_at_tokens": self.stopped_at,
            "interleaved_iterations": self.interleaved,
            "isolation": self.isolation,
            "block_sizes": {lane.schedule: lane.metrics["block_size"] for lane in self.lanes},
            "block_size_source": self.block_size_source or "the same B for every lane",
            "verdict": verdict_text(self.lanes),
            "model_note": self.model_note,
            "lanes": lanes,
        }



def sizes_source(source: str, schedules: Sequence[str], sizes: dict[str, int] | None, block_size: int) -> str:
    """Where each lane's B came from (``source``, "" when every lane runs at the settings' B), naming the lanes that
    have no best B of their own (a probe finds them for the three speculative schedules only) and so run at the
    settings' ``block_size`` (AR has no B). "Each schedule at its best B" left Block-diffusion at the sidebar's B
    without a word."""
    if sizes is None or not source:
        return source
    plain = [REGISTRY[s].title if s in REGISTRY else s for s in schedules if s != "ar" and s not in sizes]
    if not plain:
        return source
    lanes = plain[0] if len(plain) == 1 else ", ".join(plain[:-1]) + " and " + plain[-1]
    verb, own = ("has", "its") if len(plain) == 1 else ("have", "their")
    return f"{source}; {lanes} {verb} no best B of {own} own and ran at the sidebar's B = {block_size}"

def run_race(tasks: GpuTasks, settings: RunSettings, extra: Sequence[str] = (), log: TimingLog | None = None,
             max_rows: int = MAX_ROWS_PER_REQUEST, alive: Callable[[], bool] | None = None,
             best: "BestBlockSizes | None" = None, max_seconds: float | None = None,
             admit: Callable | None = None) -> RaceResult:
    """Race AR, Linear, Quadratic and Packed (plus ``extra`` lanes "lookup", "packed-mixed", "partial",
    "diffusion") on one prompt, side by side in turns (:meth:`serve.gpu.GpuTasks._race`).

    Each round raises a common token target by a slice (a sixteenth of the new-token limit without a time
    limit; with one, planned each round from the time left and the speed so far) and every lane runs up to it,
    the order rotated every round, so that every lane meets the same machine. ``max_seconds`` is a hard limit from the
    clock: when it comes, every lane stops at the same token count and all are ranked over those tokens. The
    verdict compares speeds with paired intervals over the rounds (:func:`serve.lanes.verdict_text`).
    With ``best``, each speculative lane runs at its own fastest B (:class:`BestBlockSizes`), else all at the
    settings' B. ``admit(predicted seconds)``: a context manager held while the race computes
    (:class:`serve.admission.Admission`).
    Raises: UserError for bad extra lanes, work beyond ``max_rows`` (checked before any run), or a race not
    admitted; ModelLoadError; PromptError for empty / too long prompts; ClientGone when ``alive()`` turns False.
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
    source = sizes_source(source, schedules, sizes, settings.config.block_size)
    once = check_work(schedules + reference, len(ids), settings.config, max_rows, block_sizes=sizes,
                      any_order=any_order)
    c = settings.config
    predicted = 0.0 if max_seconds is None else worst_case_seconds(
        schedules + reference, len(ids), c, tasks.cost(settings.model_ref, alive), block_sizes=sizes,
        any_order=any_order)  # what admission weighs; the clock, not this, plans the slices
    left = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - begun))
    start = time.perf_counter()
    try:
        with admit(min(predicted, max_seconds or predicted)) if admit is not None else nullcontext():
            turns, runs, interleaved = tasks.race(settings.model_ref, ids, c, schedules, float(once), alive,
                                                  slice_tokens(c.max_new_tokens), sizes, left)
    finally:
        release_memory()
    compute_s = time.perf_counter() - start
    if log is not None:
        for run in runs:
            log.add(run.records, run.block_size)
    tasks.costs.observe(settings.model_ref, [record for run in runs for record in run.records])
    reference, partial = runs[0].token_ids, runs[0].stop_reason in (TIME_LIMIT, COMMON_STOP)
    scripted = "" if settings.scripted is None else f" · scripted\u00a0drafter\u00a0q={settings.scripted:g}"
    order = f" · {c.order} order" if any_order else ""
    titles = {s: get_schedule(s, model).title + (order if s in SPECULATIVE else "") for s in schedules}
    lanes = tuple(lane_from_run(run, titles[run.schedule] + (scripted if run.schedule != "ar" else ""), reference,
                                partial_reference=partial, slices=turn_slices(turn))
                  for run, turn in zip(runs, turns.runs))
    if c.greedy and not any_order:  # a lossless lane that left AR: near-tie (low precision) or bug?
        lanes = tuple(replace(lane, divergence=tasks.divergence(settings.model_ref, ids, reference, lane.token_ids))
                      if lane.schedule in LOSSLESS and not lane.identical and not lane.cut_off
                      and lane.compared is not None else lane for lane in lanes)
    return RaceResult(settings=settings, lanes=lanes, greedy=c.greedy, compute_s=compute_s,
                      prompt_tokens=len(ids), rounds=turns.rounds, slice_range=turns.slice_range,
                      stopped_at=turns.stopped_at, block_size_source=source, interleaved=interleaved,
                      left_out=left_out,
                      model_note=model_note(tasks.store, settings.model, model) + " " + forward_note(
                          model, [record for run in runs for record in run.records], tasks.floor(settings.model_ref))
                      + recording_note(runs))


def recording_note(runs) -> str:
    """A sentence when CUDA graphs were recorded inside the race's iterations (shapes its untimed rehearsals did not
    meet): their time was left out of the lanes' times (``recorded_ms``). Empty otherwise."""
    recorded = [(run.schedule, run.recorded_s) for run in runs if run.recorded_s > 0]
    if not recorded:
        return ""
    lanes = ", ".join(f"{schedule} {seconds * 1000:.0f} ms" for schedule, seconds in recorded)
    return f" CUDA graphs recorded inside the race ({lanes}) were left out of those lanes' times."
