"""Accuracy beside speed (paper Section 4, Appendix E.3-E.5, Tables 3 and 11), as pure functions of graded runs.

Accuracy is the mean correctness per response (pass@1 for code; at T = 1 the mean over a prompt's repeated
responses, all of which stay together in every resample). Paired differences between schedules use the
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
ACCURACY_PAIRS = (("packed", "linear"), ("packed", "quadratic"), ("packed", "ar"), ("linear", "ar"),
                  ("quadratic", "ar"), ("diffusion", "ar"), ("packed", "diffusion"))


def per_prompt_correct(graded: pd.DataFrame, schedule: str, prompts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(correct responses, responses) per prompt of one schedule, in ``prompts`` order: (N,), (N,)."""
    rows = graded[graded["schedule"] == schedule]
    sums = rows.groupby("prompt_index")["correct"].agg(["sum", "count"]).reindex(list(prompts), fill_value=0)
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
        out["by_schedule"][name] = {"accuracy": correct.sum() / total if total else math.nan,
                                    "correct": int(correct.sum()), "responses": int(total)}
    for a, b in ACCURACY_PAIRS:
        if a in counts and b in counts:
            observed = np.column_stack([counts[a][0], counts[b][0], counts[a][1]])
            sums = stats.bootstrap_sums(observed, resamples, seed)
            out["differences"].append({"a": a, "b": b,
                                       "difference": stats.mean_difference(sums, observed, 0, 1, 2, level).as_dict()})
    if temperature == 0 and REFERENCE in schedules:
        out["labels"] = correctness_labels(graded[graded["prompt_index"].isin(prompts)], schedules, order)
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
