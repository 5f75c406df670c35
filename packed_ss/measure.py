"""Timing decoding runs: the one measuring core of the race (one prompt, a verdict) and the benchmark (many
prompts, intervals).

* :func:`rotation` orders the timed runs: every lane once per round, the order rotated by one lane from
  one round to the next, so that a drift of the machine's speed falls on every lane alike and no lane
  always runs first (the race's rounds are its repeats; the benchmark's are its prompts and samples).
* :func:`warm_up` makes untimed runs first, so that one-off first-call costs (allocations, kernel choice)
  land in no measurement.
* :func:`timed_run` makes one run on an adapter of its own and returns its
  :class:`~packed_ss.records.RunRecord`: decoder wall time is the sum of the iteration times (model time
  plus non-model decoder time, prefill included); loading, tokenisation and detokenisation are outside
  (paper E.5). transformers' own ``generate`` (:data:`~packed_ss.hf_reference.HF_REFERENCES`) and llama.cpp's
  loops (:data:`~packed_ss.llamacpp.LLAMACPP_REFERENCES`) and vLLM's (:data:`~packed_ss.vllm_lanes.VLLM_REFERENCES`)
  are timed as one call each.
* Isolation: ``isolate`` wraps a run's iteration generator; a server passes its compute gate there
  (each iteration computed alone, other requests served between two iterations), or holds a turn around
  the whole run itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext
from dataclasses import replace
from typing import TypeVar

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, finish_run
from packed_ss.hf_reference import HF_REFERENCES, hf_generate
from packed_ss.llamacpp import LLAMACPP_REFERENCES, llamacpp_generate
from packed_ss.vllm_lanes import VLLM_REFERENCES, vllm_generate
from packed_ss.records import IterationRecord, RunRecord

REFERENCES = HF_REFERENCES + LLAMACPP_REFERENCES + VLLM_REFERENCES  # loops outside the engine, same weights, greedy
EAGER_AR = "ar-eager"  # benchmark row: AR through eager calls, to compare with --compile's AR in the same run

Item = TypeVar("Item")
Isolate = Callable[[Iterator[IterationRecord]], Iterator[IterationRecord]]


def rotated(items: Sequence[Item], shift: int) -> list[Item]:
    """``items`` rotated left by ``shift`` (modulo their number): ``rotated("abc", 1) == list("bca")``."""
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def rotation(lanes: Sequence[Item], rounds: int) -> Iterator[tuple[int, int, Item]]:
    """``(round, position, lane)`` in execution order: ``rounds`` rounds of every lane, round r in the
    order :func:`rotated` by r. Nothing for no lanes or no rounds."""
    if not lanes:
        return
    for round_index in range(rounds):
        for position, lane in enumerate(rotated(lanes, round_index)):
            yield round_index, position, lane


def timed_run(model, prompt_ids: Sequence[int], config: DecodeConfig, schedule: str,
              isolate: Isolate | None = None) -> RunRecord:
    """One run of ``schedule`` to its end, timed.

    Args:
        model: the run's own adapter (``DualModeModel.share()``, or a scripted drafter over one): its KV
            cache is reset by the run.
        prompt_ids: prompt token ids (tokenised before timing).
        config: the run's decoding settings. schedule: an engine schedule name or a reference (:data:`REFERENCES`:
            ``hf-greedy``, ``hf-lookup``, ``llamacpp-ar``, ``llamacpp-lookup``..., greedy only,
            ``config.block_size - 1`` lookup tokens).
        isolate: wraps the engine's iteration generator (e.g. one compute-gate turn per iteration);
            not used for the HF references, which run as one call.
    Returns: the :class:`~packed_ss.records.RunRecord` (wall time in seconds) with its text.
    Raises: what :func:`packed_ss.engine.decode` raises (unknown schedule, PromptError), and whatever
        ``isolate`` raises between iterations (a server's ClientGone).
    """
    if schedule in HF_REFERENCES:
        return hf_generate(model, list(prompt_ids), config.max_new_tokens, schedule, config.block_size)
    if schedule in LLAMACPP_REFERENCES:
        return llamacpp_generate(model, list(prompt_ids), config.max_new_tokens, schedule, config.block_size)
    if schedule in VLLM_REFERENCES:
        return vllm_generate(model, list(prompt_ids), config.max_new_tokens, schedule, config.block_size)
    if schedule == EAGER_AR:  # the engine's AR on the eager path of the same weights, beside compiled runs
        run = timed_run(model.share(compiled=False), prompt_ids, config, "ar", isolate)
        return replace(run, schedule=EAGER_AR)
    records = decode(model, list(prompt_ids), config, schedule)
    return finish_run(model, isolate(records) if isolate else records, config, schedule, len(prompt_ids))


def warm_up(model, prompt_ids: Sequence[int], runs: Iterable[tuple[str, DecodeConfig]], isolate: Isolate | None = None,
            around: Callable[[], ContextManager] = nullcontext) -> None:
    """Untimed runs before any measurement, one per ``(schedule, config)`` of ``runs``, on the same path as the
    measurements (:func:`timed_run` with ``isolate``, inside ``around()``); their records are dropped."""
    for schedule, config in runs:
        with around():
            timed_run(model, prompt_ids, config, schedule, isolate)
