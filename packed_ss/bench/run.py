"""Running a benchmark: tokenise, warm up, time every planned run, check greedy outputs against AR, summarise."""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext
import sys
from dataclasses import dataclass, replace

import pandas as pd

from packed_ss.bench.plan import (LOSSLESS, MAX_SEED, NO_BLOCK, REFERENCE, WARMUP_TOKENS, BenchConfig, BenchError,
                                  PlannedRun, Prompt, plan_runs)
from packed_ss.bench.summary import examples_frame, summarize
from packed_ss.divergence import divergence
from packed_ss.hf_reference import HF_REFERENCES, reference_problem
from packed_ss.llamacpp import LLAMACPP_REFERENCES, llamacpp_problem
from packed_ss.measure import EAGER_AR, REFERENCES, timed_run, warm_up
from packed_ss.vllm_lanes import VLLM_REFERENCES, startup_seconds, vllm_problem

Progress = Callable[[int, int, str], None]  # (runs done, runs planned, label of the next run)


@dataclass(frozen=True)
class BenchResult:
    """What :func:`run_benchmark` measured.

    Attributes:
        examples: one row per timed run of the main measurements (columns :data:`COLUMNS`; seconds).
        probe: one row per probe run (same columns), empty without a probe.
        summary: JSON-ready dict (see :func:`summarize`).
        interrupted: True when a KeyboardInterrupt stopped the measurements early.
    """

    examples: pd.DataFrame
    probe: pd.DataFrame
    summary: dict
    interrupted: bool = False


# --- measurement ------------------------------------------------------------------------------------
def run_seed(seed: int, prompt_id: str, sample: int) -> int:
    """The seed of one run: a hash of the run's base seed, the prompt's id (a task's ids name the task and the
    record) and the sample index, so a prompt's runs are the same whatever the sharding over processes,
    the resume order or the other prompts. Returns: an integer in [0, MAX_SEED]."""
    digest = hashlib.sha256(f"{seed}\x00{prompt_id}\x00{sample}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % (MAX_SEED + 1)


def token_hash(token_ids: Sequence[int]) -> str:
    """First 16 hex digits of the SHA-256 of the comma-joined token ids (equal outputs, equal hashes)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def _example_row(unit: PlannedRun, prompt: Prompt, prompt_len: int, seed: int, run) -> dict:
    return {
        "phase": unit.phase,
        "prompt_index": unit.prompt_index,
        "prompt_id": prompt.id,
        "schedule": unit.schedule,
        "block_size": None if unit.schedule in NO_BLOCK else unit.block_size,
        "sample": unit.sample,
        "seed": seed,
        "position": unit.position,
        "prompt_tokens": prompt_len,
        "tokens": run.tokens,
        "nfe": run.nfe,
        "iterations": run.iterations,
        "verify_iterations": getattr(run, "verify_iterations", 0) or sum(1 for r in run.records if r.verifies),
        "rows": run.rows,
        "max_rows_per_call": run.max_rows_per_call,
        "wall_s": run.wall_s,
        "model_s": run.model_s,
        "other_s": run.other_s,
        "tokens_per_nfe": run.tokens_per_nfe,
        "throughput": run.throughput,
        "mean_acceptance_length": run.mean_acceptance_length,
        "stop_reason": run.stop_reason,
        "token_hash": token_hash(run.token_ids),
    }


class RunsStopped(Exception):
    """Raised by a ``progress`` callback of :func:`run_benchmark` to end the measurements there (a server's time
    limit): the runs done so far are kept and summarised, as after a KeyboardInterrupt."""


def run_benchmark(model, prompts: Sequence[Prompt], config: BenchConfig, progress: Progress | None = None,
                  meta: dict | None = None, turn: Callable[[], ContextManager] = nullcontext,
                  on_run: Callable[[dict, tuple[int, ...]], None] | None = None,
                  between: Callable[[], None] | None = None) -> BenchResult:
    """Measure every prompt with every schedule (and the probe), then summarise.

    Prompts are tokenised before any timing. A prompt whose tokens plus ``max_new_tokens`` plus two of
    the largest blocks exceed the model's positions, or that tokenises to nothing, is skipped (listed
    in ``summary["meta"]["skipped_prompts"]``). A KeyboardInterrupt during the runs, or :class:`RunsStopped` raised
    by ``progress`` (a server's time limit), stops them and returns what was measured (``interrupted=True``).

    Args:
        model: a :class:`~packed_ss.models.DualModeModel` (or the same call interface); its cache is reset
            by every run, so give each concurrent benchmark its own (``model.share()``).
        prompts: the prompts, in order.
        config: what to measure.
        progress: called as ``progress(done, total, label)`` before each timed run and once at the end.
        meta: extra entries for ``summary["meta"]`` (model name, prompt source...).
        turn: a context manager held around each run (a server passes its compute gate's turn, so other
            requests get the model between runs and never during one).
        on_run: called as ``on_run(row, token_ids)`` after each main-measurement run (the task harness
            writes its rows as they come, so an interrupted run can be resumed).
        between: called before each iteration of every run, warm-ups included; it may raise :class:`RunsStopped`
            (a server's time limit, read from the clock), which ends the measurements there: the run it cut is
            dropped, the runs done before it are kept.
    Returns: a :class:`BenchResult`.
    Raises: BenchError when no prompt fits the model.
    """
    references = [s for s in config.schedules if s in HF_REFERENCES]
    problem = references and reference_problem(model, config.temperature, config.drafter_lora)
    if problem:
        raise BenchError(f"{', '.join(references)}: {problem}")
    llamacpp = [s for s in config.schedules if s in LLAMACPP_REFERENCES]
    problem = llamacpp and llamacpp_problem(model)
    if problem:
        raise BenchError(f"{', '.join(llamacpp)}: {problem}")
    # vLLM's lanes where it cannot run are left out with one line each, and the rest of the run goes on
    left_out = {s: why for s in config.schedules if s in VLLM_REFERENCES for why in [vllm_problem(model, s)] if why}
    for schedule, why in left_out.items():
        print(f"note: {schedule} left out: {why}", file=sys.stderr)
    if left_out:
        kept = tuple(s for s in config.schedules if s not in left_out)
        if not kept:
            raise BenchError("; ".join(f"{s}: {why}" for s, why in left_out.items()))
        config = replace(config, schedules=kept)
    largest = max([config.block_size(s) for s in config.schedules] + list(config.probe_block_sizes))
    encoded, skipped = [], []
    for prompt in prompts:  # tokenisation happens here, outside the timed runs (E.5)
        ids = list(model.encode(prompt.text))
        if not ids:
            skipped.append({"prompt_id": prompt.id, "reason": "empty after tokenisation"})
        elif len(ids) + config.max_new_tokens + 2 * largest > model.max_length:
            skipped.append({"prompt_id": prompt.id, "reason": f"{len(ids)} tokens + limit + 2 blocks exceed "
                                                               f"the model's {model.max_length} positions"})
        else:
            encoded.append((prompt, ids))
    if not encoded:
        raise BenchError("no prompt fits the model: " + "; ".join(f"{s['prompt_id']}: {s['reason']}" for s in skipped))
    units = plan_runs(config, len(encoded))
    report = progress or (lambda done, total, label: None)
    rows: dict[str, list[dict]] = {"main": [], "probe": []}
    outputs: dict[tuple[int, int, str], tuple[int, ...]] = {}  # (prompt index, sample, schedule) -> tokens
    interrupted = False
    warm_start, warm_compile = compile_seconds(model), None
    isolate = None if between is None else (lambda records: checked(records, between))
    try:
        warm_compile = warm_up_all(model, encoded, config, lambda label: report(0, len(units), label), turn,
                                   isolate)
        for done, unit in enumerate(units):
            prompt, ids = encoded[unit.prompt_index]
            size = "" if unit.schedule in NO_BLOCK else f" B={unit.block_size}"
            report(done, len(units), f"{unit.phase} {prompt.id} {unit.schedule}{size}")
            seed = run_seed(config.seed, prompt.id, unit.sample)
            before = compile_seconds(model)
            with turn():
                run = timed_run(model, ids, config.decode_config(unit.schedule, unit.block_size, seed), unit.schedule,
                                isolate)
            rows[unit.phase].append({**_example_row(unit, prompt, len(ids), seed, run),
                                     "compile_s": compile_seconds(model) - before})
            if unit.phase == "main":
                outputs[(unit.prompt_index, unit.sample, unit.schedule)] = run.token_ids
                if on_run is not None:
                    on_run(rows["main"][-1], tuple(run.token_ids))
        report(len(units), len(units), "done")
    except (KeyboardInterrupt, RunsStopped):
        interrupted = True
    if warm_compile is None:  # stopped during the warm-up: what it compiled before the stop
        warm_compile = compile_seconds(model) - warm_start
    examples, probe = examples_frame(rows["main"]), examples_frame(rows["probe"])
    # AR's logit margins at a divergence are a left-to-right causal model's; an any-order model's outputs
    # differ from its ltr decoding by design under the confidence order (Appendix C)
    checks = config.temperature == 0 and not getattr(model, "any_order", False)
    divergences = greedy_divergences(model, encoded, outputs, turn) if checks else []
    info = {
        **(meta or {}),
        "divergences": divergences,
        "prompts_given": len(prompts),
        "skipped_prompts": skipped,
        "runs_planned": len(units),
        "runs_done": len(examples) + len(probe),
        "interrupted": interrupted,
        "device": str(getattr(model, "device", "unknown")),
        **compile_meta(model, warm_compile, rows["main"] + rows["probe"]),
        **({"vllm": {"left_out": left_out, "startup_s": startup_seconds(model)}}
           if left_out or any(s in VLLM_REFERENCES for s in config.schedules) else {}),
        "dtype": _model_dtype(model),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return BenchResult(examples, probe, summarize(examples, config, probe, info), interrupted)


def checked(records: Iterator, between: Callable[[], None]) -> Iterator:
    """The items of ``records``, with ``between()`` called before each is computed (it may raise to stop the run)."""
    while True:
        between()
        item = next(records, StopIteration)
        if item is StopIteration:
            return
        yield item


def compile_seconds(model) -> float:
    """Seconds the adapter has spent in calls that compiled a new shape so far (0 on the eager path)."""
    static = getattr(model, "static", None)
    return float(static.compile_s) if static is not None else 0.0


def warm_up_all(model, encoded: Sequence[tuple], config: BenchConfig, report: Callable[[str], None],
                turn: Callable[[], ContextManager], isolate=None) -> float:
    """The untimed warm-up runs of every schedule (none with ``config.warmup`` off): first-call costs (allocations,
    kernel selection, compiling) fall here. ``isolate``: wraps each run's iterations (:func:`timed_run`). Returns the
    seconds spent compiling in them."""
    started = compile_seconds(model)
    for schedule in config.schedules if config.warmup else ():
        report(f"warm-up {schedule}")
        sizes = [config.block_size(schedule)]
        if getattr(model, "compiled", False) and schedule not in NO_BLOCK:  # the probe's shapes too
            sizes += [b for b in config.probe_block_sizes if b not in sizes]
        for block, (ids, tokens) in ((b, run) for b in sizes for run in warm_up_prompts(model, encoded, config,
                                                                                         schedule, b)):
            warm_up(model, ids, [(schedule, config.decode_config(schedule, block, config.seed, tokens))], isolate,
                    around=turn)
    return compile_seconds(model) - started


def warm_up_prompts(model, encoded: Sequence[tuple], config: BenchConfig, schedule: str,
                    block_size: int | None = None) -> list[tuple[list, int]]:
    """(prompt ids, new-token limit) of a schedule's untimed warm-up runs at B = ``block_size`` (default: its
    own): one short run on the first prompt on the eager path; with compiled calls (the engine's or
    ``hf-greedy-compiled``) one full-length run per static-cache capacity the prompts need, so that every shape
    is compiled before the clock starts."""
    compiled = (getattr(model, "compiled", False) and schedule != EAGER_AR) or schedule == "hf-greedy-compiled"
    if not compiled:
        return [(encoded[0][1], min(WARMUP_TOKENS, config.max_new_tokens))]
    from packed_ss.models.static import CAPACITY_STEP

    extra = 0 if schedule in REFERENCES else 2 * (block_size or config.block_size(schedule))
    firsts: dict[int, list] = {}
    for _, ids in encoded:
        firsts.setdefault(-(-(len(ids) + config.max_new_tokens + extra) // CAPACITY_STEP), ids)
    return [(ids, config.max_new_tokens) for ids in firsts.values()]


def compile_meta(model, warm_s: float, rows: list[dict]) -> dict:
    """What the report says about compiling: whether calls were compiled, the warm-up's compile time and the
    compile time that fell inside timed runs (0 when the warm-up covered every shape), apart from decoding."""
    static = getattr(model, "static", None)
    inside = sum(r.get("compile_s", 0.0) for r in rows)
    return {"cache": getattr(model, "cache_kind", "n/a"), "forward": getattr(model, "path", "n/a"),
            "compiled": bool(getattr(model, "compiled", False)), "graphs": bool(getattr(model, "graphs", False)),
            "compile_note": getattr(model, "compile_note", None), "compile_s_warm_up": round(warm_s, 3),
            "compile_s_in_timed_runs": round(inside, 3),
            "compiled_shapes": [list(shape) for shape in static.shapes] if static is not None else []}


def any_order_problem(model, config: BenchConfig) -> None:
    """Refuse what an any-order model cannot run (other schedules, T > 0, the drafter LoRA) and the confidence
    order on a left-to-right model, before anything is measured.

    Raises: BenchError naming what to change."""
    from packed_ss.any_order import ORDER_REGISTRY

    if getattr(model, "any_order", False):
        other = [s for s in config.schedules if s not in ORDER_REGISTRY]
        if other:
            raise BenchError(f"{', '.join(other)} cannot run on an any-order model; choose from "
                             f"{', '.join(ORDER_REGISTRY)}")
        if config.temperature > 0:
            raise BenchError("any-order verification is greedy (Algorithm 3): use --temperature 0 with this model")
        if config.drafter_lora:
            raise BenchError("an any-order model has no drafter adapter: leave out --drafter-lora")
    elif config.order != "ltr":
        raise BenchError(f"--order {config.order} needs an any-order model (e.g. --model assets/model-anyorder)")


def greedy_divergences(model, encoded: Sequence[tuple], outputs: dict, turn=nullcontext) -> list[dict]:
    """For each greedy lossless run whose tokens differ from AR's (same prompt and sample): where, and
    AR's top-2 logit margin there (:func:`packed_ss.divergence.divergence`). Empty for models without
    a ``transformers`` network (scripted test models)."""
    if getattr(model, "model", None) is None:
        return []
    found = []
    for (index, sample, schedule), tokens in sorted(outputs.items()):
        reference = outputs.get((index, sample, REFERENCE))
        if schedule not in LOSSLESS or reference is None or tuple(reference) == tuple(tokens):
            continue
        prompt, ids = encoded[index]
        with turn():
            found_here = divergence(model, ids, reference, tokens)
        found.append({"schedule": schedule, "prompt_id": prompt.id, "sample": sample, **found_here.as_dict()})
    return found


def _model_dtype(model) -> str:
    network = getattr(model, "model", None)
    try:
        return str(next(network.parameters()).dtype).replace("torch.", "")
    except (AttributeError, StopIteration, TypeError):
        return "unknown"

