"""Summarising a benchmark (pure functions of the example rows): per-schedule statistics, paired ratios with
bootstrap intervals (paper E.5), the lossless check against AR, the timing decomposition (F.3) and the probe table."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pandas as pd

from packed_ss import stats
from packed_ss.bench.plan import BASELINE, COMPARISONS, KNOWN, LOSSLESS, NO_BLOCK, REFERENCE, BenchConfig


# Columns of examples.csv (and probe.csv), in order.
COLUMNS = ("phase", "prompt_index", "prompt_id", "schedule", "block_size", "sample", "seed", "position",
           "prompt_tokens", "tokens", "nfe", "iterations", "verify_iterations", "rows", "max_rows_per_call",
           "wall_s", "model_s", "other_s", "tokens_per_nfe", "throughput", "mean_acceptance_length",
           "stop_reason", "token_hash", "compile_s")


def examples_frame(rows: list[dict]) -> pd.DataFrame:
    """Example rows (dicts with the keys of :data:`COLUMNS`) as a DataFrame in that column order; B nullable."""
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    frame["block_size"] = frame["block_size"].astype("Int64")
    return frame


# --- summary (pure) ---------------------------------------------------------------------------------
DEFINITIONS = {
    "tokens_per_nfe": "total generated tokens / total model forwards (prefill included), over the prompts",
    "time_per_nfe_ms": "total decoder wall time / total NFE, milliseconds",
    "throughput": "total generated tokens / total decoder wall time, tokens per second (aggregate, Section 4)",
    "wall": "decoder wall time per response in seconds: model time + non-model decoder time; model "
            "loading and tokenisation excluded (E.5)",
    "compile": "compiled calls (--compile; on CUDA the graph path's CUDA graphs by default): model calls at padded "
               "row counts through torch.compile, or replayed as CUDA graphs of the native forward; every shape "
               "is compiled or recorded in the untimed warm-up (one full run per schedule and static-cache "
               "capacity), its time reported "
               "apart (compile_s_warm_up); compile_s_in_timed_runs counts shapes first met inside a timed run, "
               "whose wall time then includes compiling (0 expected); CUDA graphs are recorded before a call's "
               "clock and left out of the wall time (a run's untimed rehearsal, or recorded_ms of the call)",
    "mean_acceptance_length": "total tokens committed by verifying iterations / their number: A = h + 1 "
                              "(bonus or correction included; any-order models: A = min(h + 1, u) with u open "
                              "positions in the window), less where EOS, a stop string or the limit cut the iteration",
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
    "references": "hf-greedy, hf-lookup and hf-greedy-compiled are transformers' own generate (greedy; prompt "
                  "lookup with prompt_lookup_num_tokens = B - 1, max_matching_ngram_size = 2; static cache with "
                  "its compiled forward) on the same weights: wall "
                  "time is the whole call (model and non-model time n/a: not split), NFE counts the network's "
                  "forwards, rows/call n/a; llamacpp-ar and llamacpp-lookup are llama.cpp (llama-cpp-python) on the "
                  "same weights written to GGUF in float32 and checked tensor by tensor, fed the same token ids: "
                  "its greedy loop, and prompt lookup with the engine's n-gram drafts (W = B - 1) verified in one "
                  "call; wall time is the decoding, prefill included, NFE counts llama.cpp's decode calls; "
                  "vllm-ar, vllm-ngram and vllm-suffix are vLLM's greedy loop, n-gram proposer and suffix decoding, "
                  "vllm-linear Linear-SS inside vLLM (the model's diffusion drafter as vLLM's proposer; its NFE "
                  "adds the drafter's calls) (k = B - 1) in vLLM's own environment and process, on the same checkpoint folder and token ids: "
                  "wall time is one generate call, prefill included (vLLM's start-up apart, meta.vllm.startup_s), "
                  "NFE counts vLLM's engine steps and the acceptance length comes from vLLM's own counters",
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
        "probe": probe_table(probe if probe is not None else examples_frame([])),
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


def read_examples(path: str | Path) -> pd.DataFrame:
    """Read an examples.csv (or probe.csv) back with the column types :func:`run_benchmark` produces."""
    frame = pd.read_csv(path, dtype={"prompt_id": str, "token_hash": str, "stop_reason": str})
    frame["block_size"] = frame["block_size"].astype("Int64")
    return frame
