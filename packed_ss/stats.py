"""Paired percentile bootstrap over prompts (paper Appendix E.5), as pure functions.

Every statistic of a benchmark is a function of per-prompt totals (tokens, NFE, wall seconds, ... of
each schedule, summed over that prompt's samples). :func:`bootstrap_sums` resamples prompt indices with
replacement once per resample and sums *every* column over the same drawn indices, so all schedules and
all statistics see identical resamples. Ratios are then ratios of aggregated sums over the resampled
prompts, e.g. the throughput ratio of A to B is ``(sum tokens_A / sum wall_A) / (sum tokens_B / sum
wall_B)``, the paper's definition of aggregate throughput (Section 4).

Shape legend: N prompts, M columns (per-prompt totals), R resamples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESAMPLES = 20_000  # bootstrap resamples (Appendix E.5)
LEVEL = 0.95  # coverage of the percentile intervals


@dataclass(frozen=True)
class Interval:
    """A point estimate with a percentile bootstrap interval.

    Attributes:
        estimate: the statistic on the observed prompts (not the bootstrap mean).
        low, high: the (1 - level)/2 and (1 + level)/2 percentiles of the bootstrap distribution.
        n: number of prompts behind the estimate.
        level: coverage, e.g. 0.95.
    """

    estimate: float
    low: float
    high: float
    n: int
    level: float = LEVEL

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in [low, high]."""
        return self.low <= value <= self.high

    def as_dict(self) -> dict:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "n": self.n, "level": self.level}


def bootstrap_sums(columns: np.ndarray, resamples: int = RESAMPLES, seed: int = 0,
                   chunk: int = 2_000) -> np.ndarray:
    """Column sums over resampled prompts, the same drawn prompt indices for every column.

    Args:
        columns: (N, M) per-prompt totals; row i is prompt i.
        resamples: R, number of bootstrap resamples (>= 1).
        seed: seed of the ``numpy`` generator; the same seed gives the same resamples.
        chunk: resamples drawn at once (bounds memory at chunk x N counts).
    Returns:
        (R, M) array: row r holds sum over the N indices drawn in resample r of each column.
    Raises:
        ValueError: N < 1, R < 1, or ``columns`` not two-dimensional.
    """
    x = np.asarray(columns, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"columns must be a 2-D (prompts, columns) array, got shape {x.shape}")
    n = x.shape[0]
    if n < 1:
        raise ValueError("the bootstrap needs at least one prompt")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, x.shape[1]))
    for start in range(0, resamples, chunk):
        size = min(chunk, resamples - start)
        drawn = rng.integers(0, n, size=(size, n))  # prompt indices, with replacement
        offsets = drawn + n * np.arange(size)[:, None]
        counts = np.bincount(offsets.ravel(), minlength=size * n).reshape(size, n)
        out[start:start + size] = counts @ x
    return out


def _divide(num, den):
    """num / den elementwise, NaN where den is 0 (no silent infinities)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def percentile_interval(estimate: float, draws: np.ndarray, n: int, level: float = LEVEL) -> Interval:
    """Percentile interval of bootstrap ``draws`` around ``estimate``; NaN draws are ignored.

    Raises: ValueError if ``level`` is not in (0, 1).
    """
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    draws = np.asarray(draws, dtype=np.float64)
    draws = draws[np.isfinite(draws)]
    if draws.size == 0:
        return Interval(float(estimate), float("nan"), float("nan"), n, level)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return Interval(float(estimate), float(low), float(high), n, level)


def ratio_of_ratios(sums: np.ndarray, observed: np.ndarray, num_a: int, den_a: int, num_b: int, den_b: int,
                    level: float = LEVEL) -> Interval:
    """``(sum x_a / sum y_a) / (sum x_b / sum y_b)`` with its paired percentile interval.

    Args:
        sums: (R, M) output of :func:`bootstrap_sums`.
        observed: (N, M) the per-prompt totals that were resampled (gives the estimate and N).
        num_a, den_a, num_b, den_b: column indices of x_a, y_a, x_b, y_b.
        level: interval coverage.
    Returns: an :class:`Interval`; NaN where a denominator sums to zero.
    """
    total = np.asarray(observed, dtype=np.float64).sum(axis=0)
    estimate = _divide(_divide(total[num_a], total[den_a]), _divide(total[num_b], total[den_b]))
    draws = _divide(_divide(sums[:, num_a], sums[:, den_a]), _divide(sums[:, num_b], sums[:, den_b]))
    return percentile_interval(float(estimate), draws, len(observed), level)


def mean_difference(sums: np.ndarray, observed: np.ndarray, a: int, b: int, count: int,
                    level: float = LEVEL) -> Interval:
    """``(sum a - sum b) / sum count``: the paired difference of per-response means, with its interval.

    With ``count`` the number of responses of each prompt, this is the mean of a minus the mean of b
    over responses (for wall time: seconds per response, A minus B).
    """
    total = np.asarray(observed, dtype=np.float64).sum(axis=0)
    estimate = _divide(total[a] - total[b], total[count])
    draws = _divide(sums[:, a] - sums[:, b], sums[:, count])
    return percentile_interval(float(estimate), draws, len(observed), level)


SLICE_RESAMPLES = 5_000  # resamples of a race's paired slices (a few dozen slices: the interval settles by then)


def paired_speed_ratio(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]],
                       resamples: int = SLICE_RESAMPLES, seed: int = 0, level: float = LEVEL) -> Interval | None:
    """Speed of lane a over lane b, ``(sum tokens_a / sum ms_a) / (sum tokens_b / sum ms_b)``, with a paired
    percentile bootstrap interval over the slices both lanes ran (:mod:`packed_ss.turns`).

    Args:
        a, b: per round, (tokens, milliseconds) of each lane, aligned by round. A round where either lane made
            no token (it sat out: its previous round overshot the target, or its run had ended) is joined to the
            following rounds until both lanes have worked (:func:`paired_blocks`), so that every round's work
            counts and the estimate is the ratio of the two lanes' whole speeds.
        resamples, seed, level: as :func:`bootstrap_sums` and :func:`percentile_interval`.
    Returns: the :class:`Interval` (``n`` = paired blocks), or None when the two lanes never both worked.
    """
    blocks = paired_blocks(a, b)
    if not blocks:
        return None
    observed = np.asarray(blocks, dtype=np.float64)
    sums = bootstrap_sums(observed, resamples=resamples, seed=seed)
    return ratio_of_ratios(sums, observed, 0, 1, 2, 3, level)


def paired_blocks(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
                  ) -> list[tuple[float, float, float, float]]:
    """(tokens_a, ms_a, tokens_b, ms_b) per block of consecutive rounds: a block closes at the first round after
    which both lanes have made tokens in it; rounds left open at the end join the last block (none without one)."""
    blocks: list[list[float]] = []
    open_block = [0.0, 0.0, 0.0, 0.0]
    for (ta, ma), (tb, mb) in zip(a, b):
        open_block = [open_block[0] + ta, open_block[1] + ma, open_block[2] + tb, open_block[3] + mb]
        if all(value > 0 for value in open_block):
            blocks.append(open_block)
            open_block = [0.0, 0.0, 0.0, 0.0]
    if blocks and any(open_block):
        blocks[-1] = [x + y for x, y in zip(blocks[-1], open_block)]
    return [tuple(block) for block in blocks]
