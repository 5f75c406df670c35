"""Entry points: step through a run (``decode``) or run it to the end (``generate``); a scripted drafter that
follows a run's AR output (``scripted_drafter``, for teaching)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace

from packed_ss.any_order import OrderSession
from packed_ss.config import DecodeConfig
from packed_ss.iteration import checked_inputs
from packed_ss.models.scripted import ScriptedDrafter
from packed_ss.records import IterationRecord, RunRecord, summarize
from packed_ss.registry import get_schedule
from packed_ss.schedules.base import Session


def decode(model, prompt_ids: list[int], config: DecodeConfig, schedule: str = "packed",
           rehearse: bool = True) -> Iterator[IterationRecord]:
    """Yield one :class:`IterationRecord` per iteration; the caller may step, pause or stop early.

    Args:
        model: a :class:`~packed_ss.models.DualModeModel` (or any object with the same call interface).
        prompt_ids: prompt token ids (at least one).
        config: decoding settings.
        schedule: a name in :data:`packed_ss.schedules.REGISTRY` (``"ar"``, ``"linear"``, ``"quadratic"``,
            ``"packed"``, ``"diffusion"``, ``"lookup"``, ``"packed-mixed"``, ``"partial"``); on an any-order
            model (``model.any_order``) ``"ar"``, ``"linear"``, ``"quadratic"``, ``"packed"`` or ``"diffusion"``
            with ``config.order`` (:mod:`packed_ss.any_order`).
        rehearse: on the graph path (``model.graphs``), rehearse the run's first iterations untimed at the first
            ``next()`` so that its graphs are recorded before its clock (:func:`_rehearsed`); False: shapes not
            recorded yet are recorded before their calls' clocks (``recorded_ms``), as for short runs whose every
            shape is recorded already.
    Raises:
        ValueError: unknown schedule, or the confidence order on a left-to-right model; PromptError: empty or too
            long prompt, or a token id outside the vocabulary (raised on creation); TypeError: a model that is
            not a loaded model (None, a name), a config that is not a DecodeConfig, or a prompt that is text or
            holds anything but integers.
    """
    if not callable(getattr(model, "forward", None)) or not hasattr(model, "mask_token_id"):
        raise TypeError(f"model must be a loaded model (DualModeModel.from_pretrained(name) gives one), got "
                        f"{type(model).__name__} {model!r:.60}")
    prompt_ids = checked_inputs(prompt_ids, config, getattr(model, "vocab_size", None))
    if config.order != "ltr" and not getattr(model, "any_order", False):
        raise ValueError(f"order {config.order!r} needs an any-order model (assets/model-anyorder); a left-to-right "
                         f"model verifies left to right: leave order at 'ltr'")
    runner = get_schedule(schedule, model)
    kind = OrderSession if getattr(model, "any_order", False) else Session
    session = kind(model, list(prompt_ids), config, runner.name)  # checks the prompt and settings now
    adapter = getattr(model, "base", model)  # a scripted drafter's calls are its model's
    if rehearse and getattr(adapter, "graphs", False) is True:
        return _rehearsed(model, adapter, lambda on: kind(on, list(prompt_ids), config, runner.name), runner)
    return runner.iterate(session)


REHEARSAL_ITERATIONS = 3  # the prefill and two iterations: every schedule's steady call shapes


def _rehearsed(model, adapter, session, runner) -> Iterator[IterationRecord]:
    """The run's iterations after an untimed rehearsal of its first :data:`REHEARSAL_ITERATIONS` on the same adapter
    (:meth:`~packed_ss.models.DualModeModel.rehearsing`): on the graph path every shape it meets is recorded there,
    largest first, so that no timed call records (:mod:`packed_ss.models.graphs`). It runs at the first ``next()``,
    inside whatever isolation the caller wraps the iterations in (a server's compute gate), never in a record's time.
    ``session(model)`` makes a session of the run over ``model``."""
    stand_in = adapter if adapter is model else _Rehearsal(model, adapter)
    with adapter.rehearsing():
        for _ in itertools.islice(runner.iterate(session(stand_in)), REHEARSAL_ITERATIONS):
            pass
    yield from runner.iterate(session(model))


class _Rehearsal:
    """A scripted drafter's model as the rehearsal calls it: the model's own calls, made as the drafter makes them
    (whether deferred rows are asked for decides a call's graph), without the script (its counters stay the run's)."""

    def __init__(self, drafter, adapter):
        self._adapter = adapter
        self.supports_deferred_rows = getattr(drafter, "supports_deferred_rows", False)

    def __getattr__(self, name: str):
        return getattr(self._adapter, name)


def generate(model, prompt_ids: list[int], config: DecodeConfig, schedule: str = "packed") -> RunRecord:
    """Run a schedule to completion and return its :class:`RunRecord` (records included).

    Wall time is the sum of the iterations' decoder time: tokenisation and model loading are outside
    (paper E.5). Same errors as :func:`decode`.
    """
    return finish_run(model, decode(model, prompt_ids, config, schedule), config, schedule, len(prompt_ids))


def finish_run(model, records: Iterable[IterationRecord], config: DecodeConfig, schedule: str,
               prompt_len: int) -> RunRecord:
    """The :class:`RunRecord` of a run's iteration records (consumed here) with its text decoded.

    For callers that drive :func:`decode` themselves (one iteration per turn on a shared server) and
    still want what :func:`generate` returns. ``prompt_len`` in tokens.
    """
    run = summarize(list(records), schedule, config.block_size, config.temperature, prompt_len)
    decoder = getattr(model, "decode", None)
    text = decoder(list(run.token_ids)) if decoder else ""
    return replace(run, text=text)


def scripted_drafter(model, prompt_ids: Sequence[int], config, quality: float, seed: int = 0,
                     isolate: Callable[[Iterator[IterationRecord]], Iterable[IterationRecord]] | None = None,
                     follow: bool = False) -> ScriptedDrafter:
    """A :class:`ScriptedDrafter` over its own adapter of ``model`` for one run of ``config`` on
    ``prompt_ids``: the reference is AR's greedy output, B tokens longer than the run's limit (fewer where the
    model's positions end sooner). ``isolate`` wraps
    the reference run's iterations (a server computes each one at its gate, and may end the run early: the
    reference is then shorter, and proposals past it are never right). ``follow``: the reference follows the run's
    verified prefix once it leaves AR's output (:class:`ScriptedDrafter`; greedy runs only).

    Raises: ValueError for a quality outside [0, 1]; PromptError for an empty or too long prompt.
    """
    own = replace(config, temperature=0.0, drafter_lora=False)
    decode(model.share(), list(prompt_ids), own, "ar")  # the run's own limits: a refusal names the tokens asked for
    # One block past the run's end where the model has room for it (proposals past the reference are never right)
    room = getattr(model, "max_length", None)
    extra = config.block_size if room is None else max(0, min(
        config.block_size, room - len(prompt_ids) - config.max_new_tokens - 2 * config.block_size))
    reference_config = replace(own, max_new_tokens=config.max_new_tokens + extra)
    adapter = model.share()
    records = decode(adapter, list(prompt_ids), reference_config, "ar")
    reference = finish_run(adapter, isolate(records) if isolate else records, reference_config, "ar",
                           len(prompt_ids)).token_ids
    return ScriptedDrafter(model.share(), list(prompt_ids) + list(reference), quality, seed,
                           follow=ar_continuation(model) if follow else None)


def ar_continuation(model) -> Callable[[Sequence[int], int], tuple[list[int], int]]:
    """``(prefix, n) -> (AR's greedy continuation of prefix, at most n tokens; model calls made)``, run on one adapter
    of its own, made here and kept for every call (what a following :class:`ScriptedDrafter` computes after a
    near-tie; one cache and its graphs for all the continuations, not an adapter and a cache per call)."""
    from packed_ss.config import DecodeConfig

    own = model.share()

    def continuation(prefix: Sequence[int], n: int) -> tuple[list[int], int]:
        tokens, calls = [], 0
        # no rehearsal: the 1-row graph is recorded by the first continuation and replayed by every later one
        for record in decode(own, list(prefix), DecodeConfig(block_size=2, max_new_tokens=max(1, n)), "ar",
                             rehearse=False):
            tokens.extend(record.appended)
            calls += len(record.calls)
        return tokens, calls

    continuation.adapter = own  # its recording time, for a report
    return continuation
