"""A full run (the ``generate`` API), the calibration runs of the cost fit, and the check that a model can run
the settings' schedule (:func:`schedule_for`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.engine import decode
from packed_ss.records import RunRecord
from packed_ss.registry import get_schedule
from packed_ss.schedules import REGISTRY

from serve.errors import UserError
from serve.gpu import GpuTasks
from serve.limits import MAX_ROWS_PER_REQUEST, check_work, deadline_after, release_memory, worst_case_seconds
from serve.settings import RunSettings
from serve.timing import TimingLog


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


def run_generate(tasks: GpuTasks, settings: RunSettings, log: TimingLog | None = None,
                 max_rows: int = MAX_ROWS_PER_REQUEST, alive: Callable[[], bool] | None = None,
                 max_seconds: float | None = None, admit: Callable | None = None) -> RunRecord:
    """One full run of ``settings`` (the ``generate`` API).

    ``admit(predicted seconds)``: a context manager held while the run computes
    (:class:`serve.admission.Admission`; used with ``max_seconds``, which gives the prediction). ``max_seconds``
    is also a hard limit from the clock: a run still going then ends with what it decoded, its stop reason
    :data:`~serve.limits.TIME_LIMIT`.
    Raises: UserError (work beyond ``max_rows``, or not admitted), ModelLoadError, PromptError, ClientGone.
    """
    model = tasks.store.get(*settings.model_ref[:2])
    schedule_for(model, settings)
    ids = settings.prompt_ids(model)
    decode(model.share(), ids, settings.config, settings.schedule)  # validates before any GPU work
    reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
    work = check_work([settings.schedule, *reference], len(ids), settings.config, max_rows,
                      any_order=getattr(model, "any_order", False))
    seconds = 0.0  # the predicted worst case sorts the request as light or heavy (admit); the clock bounds it
    if max_seconds is not None:
        seconds = worst_case_seconds([settings.schedule, *reference], len(ids), settings.config,
                                     tasks.cost(settings.model_ref, alive), any_order=getattr(model, "any_order", False))
    try:
        with admit(seconds) if admit is not None else nullcontext():
            run = tasks.generate(settings.model_ref, ids, settings.config, settings.schedule, float(work), alive,
                                 max_seconds)
    finally:
        release_memory()
    if log is not None:
        log.add(run.records, settings.config.block_size)
    tasks.costs.observe(settings.model_ref, run.records)  # a run much slower or faster than the fit moves it
    return run


CALIBRATION_PROMPT = 256  # prompt tokens Explain's Measure decodes at most (the prompt's last ones)


def calibrate(tasks: GpuTasks, settings: RunSettings, log: TimingLog, block_sizes: Sequence[int] = (4, 8, 16),
              new_tokens: int = 16, max_seconds: float | None = None, alive=None) -> int:
    """Feed the cost fit: short runs of AR, Linear, Quadratic and Packed at several block sizes, on the last
    :data:`CALIBRATION_PROMPT` tokens of the prompt at most; then measure the model's per-call cost again, which
    the server's time estimates use from then on (:class:`serve.costs.CostBook`). Every iteration is a turn of the
    compute gate, and the runs end at ``max_seconds`` (the request's time limit; None: none).

    Returns: number of calls measured. Raises: ModelLoadError, PromptError, UserError when the time limit ended
    the runs before any was measured.
    """
    model = tasks.store.get(*settings.model_ref[:2])
    ids = settings.prompt_ids(model)[-CALIBRATION_PROMPT:]  # the fit is per call: a long prompt adds time, not calls
    calls = 0
    found = tasks.calibration(settings.model_ref, ids, tuple(block_sizes), new_tokens, deadline_after(max_seconds),
                              alive)
    if not found:
        raise UserError(f"nothing was measured within this server's time limit of {max_seconds:g} s: try again when "
                        f"the server is less busy")
    for b, records in found:
        log.add(records, b)
        calls += sum(len(r.calls) for r in records)
    tasks.costs.remeasure(settings.model_ref, "re-measured by Explain's Measure")  # the estimates follow it
    return calls
