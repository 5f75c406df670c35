"""A race lane (:class:`Lane`): the compact, CPU-only timeline of one measured run (cumulative wall time, NFE
and tokens at the end of each iteration), replayed by the page on a shared clock; and the race's verdict.
Wall times are the engine's measured decoder times, so the replay speed never changes the numbers."""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from packed_ss.divergence import Divergence, first_difference
from packed_ss.records import RunRecord


@dataclass(frozen=True)
class Lane:
    """One schedule's run, ready to replay.

    Attributes:
        schedule, title: registry name and display name.
        token_ids, sources: generated tokens and where each came from.
        wall_ms, nfe, tokens: cumulative decoder wall time (ms), NFE and tokens after each iteration.
        metrics: ``RunRecord.metrics()`` of the run (JSON-ready).
        differs: per generated token, whether it differs from the AR reference (empty: no reference).
        first_difference: index of the first differing token (a length difference counts), or None.
        shown: whether the lane is displayed (the AR reference may run hidden).
        divergence: for a greedy lossless lane that differs: AR's top-2 margin there and the near-tie verdict.
        wall_s_repeats: decoder wall time (s) of every measurement of this lane (the lane replays the median).
    """

    schedule: str
    title: str
    token_ids: tuple[int, ...]
    sources: tuple[str, ...]
    wall_ms: tuple[float, ...]
    nfe: tuple[int, ...]
    tokens: tuple[int, ...]
    metrics: dict = field(repr=False)
    differs: tuple[bool, ...] = ()
    first_difference: int | None = None
    shown: bool = True
    divergence: Divergence | None = None
    wall_s_repeats: tuple[float, ...] = ()

    @property
    def total_ms(self) -> float:
        return self.wall_ms[-1] if self.wall_ms else 0.0

    @property
    def identical(self) -> bool:
        """Whether the output equals the reference token for token."""
        return self.first_difference is None

    @property
    def wall_range(self) -> tuple[float, float, float]:
        """(median, min, max) decoder wall time in seconds over the repeats."""
        times = sorted(self.wall_s_repeats) or [self.total_ms / 1000]
        return statistics.median(times), times[0], times[-1]

    def at(self, clock_ms: float) -> int:
        """Iterations finished ``clock_ms`` into the run (0..len(wall_ms))."""
        return bisect.bisect_right(self.wall_ms, clock_ms)


def lane_from_run(run: RunRecord, title: str, reference: Sequence[int] | None, shown: bool = True) -> Lane:
    """Build a lane from a finished run; ``reference`` is the AR output to compare with (or None)."""
    wall, nfe, tokens = [], [], []
    w = n = k = 0
    for record in run.records:
        w += record.wall_ms
        n += len(record.calls)
        k += len(record.appended)
        wall.append(w)
        nfe.append(n)
        tokens.append(k)
    differs: tuple[bool, ...] = ()
    first = None
    if reference is not None:
        ref = list(reference)
        differs = tuple(i >= len(ref) or t != ref[i] for i, t in enumerate(run.token_ids))
        first = first_difference(ref, run.token_ids)
    return Lane(schedule=run.schedule, title=title, token_ids=tuple(run.token_ids), sources=tuple(run.sources),
                wall_ms=tuple(wall), nfe=tuple(nfe), tokens=tuple(tokens), metrics=run.metrics(), differs=differs,
                first_difference=first, shown=shown)


def lane_from_runs(runs: Sequence[RunRecord], title: str, reference: Sequence[int] | None) -> Lane:
    """A lane from repeated runs of one schedule: it replays the run of median wall time and keeps every
    run's wall time (the outputs of repeats are identical: same settings, same seed)."""
    ordered = sorted(runs, key=lambda run: run.wall_s)
    lane = lane_from_run(ordered[(len(ordered) - 1) // 2], title, reference)
    return replace(lane, wall_s_repeats=tuple(run.wall_s for run in runs))


def verdict_text(lanes: Sequence[Lane]) -> str:
    """Ranking by median wall time and the winner's speed against each other lane, "tie" where the
    min-max ranges of the repeats overlap. Speed ratio = the other lane's median / the winner's."""
    timed = sorted(lanes, key=lambda lane: lane.wall_range[0])
    if len(timed) < 2:
        return ""
    best = timed[0]
    b_med, b_lo, b_hi = best.wall_range
    repeats = len(best.wall_s_repeats) or 1
    parts, ties = [], []
    for lane in timed[1:]:
        med, lo, hi = lane.wall_range
        tie = lo <= b_hi and b_lo <= hi
        ties += [lane.title] if tie else []
        parts.append(f"{med / b_med:.2f}x {lane.title}{' (tie: ranges overlap)' if tie else ''}" if b_med > 0
                     else lane.title)
    ranking = ", ".join(f"{i}. {lane.title} {lane.wall_range[0]:.3f} s" for i, lane in enumerate(timed, 1))
    noun = "median of {} runs each".format(repeats) if repeats > 1 else "one run each: no range to judge noise by"
    if ties:
        head = (f"No clear winner: {best.title} has the lowest median but ties with {', '.join(ties)} "
                f"(their min-max ranges overlap)")
    else:
        head = f"Fastest: {best.title}, beyond the spread of the repeats"
    return f"{head}. By median: {', '.join(parts)}. Ranking by decoder wall time ({noun}): {ranking}."
