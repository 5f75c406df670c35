"""A race lane (:class:`Lane`): the compact, CPU-only timeline of one measured run (cumulative wall time, NFE
and tokens at the end of each iteration), replayed by the page on a shared clock, with its per-round slices
(:mod:`packed_ss.turns`); and the race's verdict: speed ratios with paired bootstrap intervals over the slices
(:func:`packed_ss.stats.paired_speed_ratio`). Wall times are the engine's measured decoder times, so the replay
speed never changes the numbers."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from packed_ss.divergence import Divergence, first_difference
from packed_ss.records import RunRecord
from packed_ss.stats import Interval, paired_speed_ratio
from packed_ss.turns import COMMON_STOP
from packed_ss.wording import counted

from serve.limits import TIME_LIMIT


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
        slices: (tokens, decoder ms) of each round of the race (:func:`packed_ss.turns.slices`), aligned by round
            across the lanes: the paired observations of the verdict's intervals.
        max_rows_per_call: the most rows of one call after the first iteration (the prefill's excluded).
        call_rows: the rows of each of its calls in order (the prefill's included): what a projection onto another
            device's measured call costs prices (:mod:`packed_ss.projection`).
        compared: the tokens compared with the reference: all of them, or (either run stopped early: cut off, or
            stopped with the other lanes) the ones both made; None where nothing could be compared (no reference,
            or a cut-off run with no tokens on one side). partial: the comparison stopped at a stopped run's end.
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
    slices: tuple[tuple[int, float], ...] = ()
    call_rows: tuple[int, ...] = ()
    max_rows_per_call: int = 0
    compared: int | None = None
    partial: bool = False

    @property
    def total_ms(self) -> float:
        return self.wall_ms[-1] if self.wall_ms else 0.0

    @property
    def identical(self) -> bool:
        """Whether the output equals the reference token for token (over the tokens both made when either was cut
        off at the time limit); False where nothing was compared (:attr:`compared` None)."""
        return self.compared is not None and self.first_difference is None

    def agreement(self) -> str:
        """A few words on the lane against AR's output: "reference", "= AR output", "= AR over the first 4
        tokens (a run was cut off)", "differs from AR at token 7 (3 of 32 tokens)", or why it was not compared."""
        if self.schedule == "ar":
            return "reference"
        if self.compared is None:
            return ("made no tokens before the time limit: not compared" if not self.token_ids else
                    "not compared: AR made no tokens before the time limit")
        if self.identical:
            why = "the race stopped every lane there" if self.stopped_early else "a run was cut off"
            return f"= AR over the first {counted(self.compared, 'token')} ({why})" if self.partial else "= AR output"
        return (f"differs from AR at token {self.first_difference} ({sum(self.differs)} of {len(self.token_ids)} "
                f"tokens)")

    @property
    def cut_off(self) -> bool:
        """Whether the request's time limit stopped this lane's run before its end (its output is partial)."""
        return self.metrics.get("stop_reason") == TIME_LIMIT

    @property
    def stopped_early(self) -> bool:
        """Whether the race stopped this lane with the others at their common token count (a time limit)."""
        return self.metrics.get("stop_reason") == COMMON_STOP

    @property
    def wall_s(self) -> float:
        """Decoder wall time of the lane's run (seconds): the time its tokens took."""
        return self.total_ms / 1000

    def at(self, clock_ms: float) -> int:
        """Iterations finished ``clock_ms`` into the run (0..len(wall_ms))."""
        return bisect.bisect_right(self.wall_ms, clock_ms)


def lane_from_run(run: RunRecord, title: str, reference: Sequence[int] | None, shown: bool = True,
                  partial_reference: bool = False, slices: Sequence[tuple[int, float]] = ()) -> Lane:
    """Build a lane from a finished run; ``reference`` is the AR output to compare with (or None). When the run or
    the reference (``partial_reference``) stopped early (cut off at the time limit, or stopped with the other
    lanes), only their common length is compared. ``slices``: the run's per-round (tokens, ms)."""
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
    first = compared = None
    partial = False
    if reference is not None:
        ref, ids = list(reference), list(run.token_ids)
        partial = partial_reference or run.stop_reason in (TIME_LIMIT, COMMON_STOP)
        if partial:
            ref, ids = ref[:len(ids)], ids[:len(ref)]
        if ids or not partial:  # a cut-off run with nothing on one side compares nothing
            differs = tuple(i >= len(ref) or t != ref[i] for i, t in enumerate(run.token_ids[:len(ids)]))
            differs += (False,) * (len(run.token_ids) - len(differs)) if partial else ()
            first = first_difference(ref, ids)
            compared = len(ids) if partial else max(len(ref), len(ids))
    return Lane(schedule=run.schedule, title=title, token_ids=tuple(run.token_ids), sources=tuple(run.sources),
                wall_ms=tuple(wall), nfe=tuple(nfe), tokens=tuple(tokens), metrics=run.metrics(), differs=differs,
                first_difference=first, shown=shown,
                max_rows_per_call=run.max_rows_per_call or 0, compared=compared, partial=partial,
                slices=tuple((int(t), float(ms)) for t, ms in slices),
                call_rows=tuple(call.layout.rows for record in run.records for call in record.calls))


GPU_NOTE = ("on a GPU a call of a few dozen rows costs about the same as a one-row call (paper, Appendix F), so "
            "there tokens per call turn almost directly into speed")
CPU_NOTE = ("on a CPU whose calls run near its floor (the native forward, as llama.cpp does) every row is arithmetic "
            "and weight reads: llama.cpp's own 24-row call costs 7.1x its one-row call on this project's 2-core CPU, so "
            "there AR can win every race")
PAPER_BASELINES = ("linear", "quadratic", "ar")  # the paper compares Packed-SS with these (Section 4)


def cost_ratio(lane: Lane, ar: Lane | None) -> float | None:
    """The lane's time per call (time/NFE) over AR's: what one of its calls costs in AR calls (None without
    an AR lane that made calls)."""
    ar_ms = ar.metrics["time_per_nfe_ms"] if ar is not None else 0.0
    return lane.metrics["time_per_nfe_ms"] / ar_ms if ar_ms > 0 else None


MIN_SLICES = 4  # paired slices below which no winner is named: too few rounds to tell a difference from noise


def speed_ratio(lane: Lane, other: Lane) -> Interval | None:
    """``lane``'s speed (tokens per second of decoder time) over ``other``'s, with its 95% paired bootstrap
    interval over the rounds both ran (:func:`packed_ss.stats.paired_speed_ratio`); None where no round pairs
    them (a lane that made nothing). Computed once per pair of slice lists: the verdict, the table, the JSON and
    the CSV of one race ask for the same pairs."""
    return _paired(lane.slices, other.slices)


@functools.lru_cache(maxsize=256)
def _paired(a: tuple, b: tuple) -> Interval | None:
    return paired_speed_ratio(a, b)


def ratio_text(interval: Interval) -> str:
    """"0.52 [0.48, 0.57]": a speed ratio and its interval; an end that two decimals would round to 1.00 gets as
    many as show which side of 1 it is on ("[0.71, 0.9981]" is beyond noise, "[0.65, 1.0004]" a tie)."""
    return f"{interval.estimate:.2f} [{_edge(interval.low)}, {_edge(interval.high)}]"


def _edge(value: float) -> str:
    if value == 1.0 or abs(value - 1.0) >= 0.005:
        return f"{value:.2f}"
    digits = 3
    while f"{value:.{digits}f}" == f"{1.0:.{digits}f}" and digits < 8:
        digits += 1
    return f"{value:.{digits}f}"


def is_tie(interval: Interval | None) -> bool:
    """Whether a speed ratio's interval holds 1 (no difference beyond noise); True without an interval."""
    return interval is None or not interval.low > 1.0 and not interval.high < 1.0


def noise_note(lane: Lane, ar: Lane | None) -> str:
    """A sentence when a lane's multi-row calls cost less than AR's one-row calls: more rows cannot be cheaper
    than one, so the measured ratio is the machine's load, not a property of the schedule (empty otherwise)."""
    cost = cost_ratio(lane, ar)
    if cost is None or cost >= 1 or lane is ar or lane.max_rows_per_call <= 1:
        return ""
    return (f"Noise, not a reason: {lane.title}'s calls of up to {lane.max_rows_per_call} rows measured "
            f"{cost:.2f}x AR's one-row calls, and a call of more rows cannot cost less than one of a single row; "
            f"the machine's load varied during the race.")


def why_text(lanes: Sequence[Lane], winner: Lane) -> str:
    """One sentence on why the winner won: speed against AR = tokens per call / cost per call (both against
    AR's, whose tokens per call is 1). Empty without an AR lane; a cost ratio that can only be noise is said
    to be noise (:func:`noise_note`) instead of being given as the reason."""
    ar = next((lane for lane in lanes if lane.schedule == "ar"), None)
    if cost_ratio(winner, ar) is None:
        return ""
    noisy = next((note for note in (noise_note(lane, ar) for lane in lanes) if note), "")
    if noisy:
        return noisy
    if winner is not ar:
        tpn, cost = winner.metrics["tokens_per_nfe"], cost_ratio(winner, ar)
        return (f"Why: {winner.title} accepted {tpn:.2f} tokens per call and its calls (up to "
                f"{winner.max_rows_per_call} rows) cost {cost:.2f}x AR's one-row calls on this machine, so it runs "
                f"at about {tpn / cost:.2f}x AR's speed.")
    speculative = [lane for lane in lanes if lane is not ar and lane.metrics["tokens_per_nfe"] > 1]
    if not speculative:
        return "Why: no other lane accepted more than one token per call."
    subject = next((lane for lane in speculative if lane.schedule == "packed"), speculative[0])
    tpn, cost = subject.metrics["tokens_per_nfe"], cost_ratio(subject, ar)
    return (f"Why: {subject.title} accepted {tpn:.2f} tokens per call, but its calls (up to "
            f"{subject.max_rows_per_call} rows) cost {cost:.2f}x AR's one-row calls on this machine, so AR is "
            f"faster here; {CPU_NOTE}, while {GPU_NOTE}.")


def paper_comparisons(lanes: Sequence[Lane]) -> str:
    """Packed-SS against the paper's baselines (Linear-SS, Quadratic-SS, AR): its speed over each one's with the
    paired interval over the race's slices, "a tie" where the interval holds 1. Empty without Packed-SS."""
    packed = next((lane for lane in lanes if lane.schedule == "packed" and not lane.cut_off), None)
    if packed is None or packed.total_ms <= 0:
        return ""
    parts = []
    for name in PAPER_BASELINES:
        other = next((lane for lane in lanes if lane.schedule == name and not lane.cut_off), None)
        interval = speed_ratio(packed, other) if other is not None else None
        if interval is None:
            continue
        judged = ("a tie: the interval holds 1" if is_tie(interval) else
                  "faster, beyond noise" if interval.low > 1 else "slower, beyond noise")
        parts.append(f"{packed.title} / {other.title} {ratio_text(interval)} ({judged})")
    return "The paper's comparisons, speed over speed: " + "; ".join(parts) + "." if parts else ""


def verdict_text(lanes: Sequence[Lane]) -> str:
    """Ranking by speed (tokens per second of decoder time) and every other lane's speed over the fastest one's
    with its 95% paired interval over the race's slices, "a tie" where the interval holds 1; then why the
    winner won (:func:`why_text`) and Packed-SS against the paper's baselines (:func:`paper_comparisons`).
    Lanes cut off at the time limit are not ranked (the race stopped before they made a token); the verdict
    names them first. The sentences of :func:`verdict_parts`, joined."""
    return " ".join(verdict_parts(lanes))


def verdict_parts(lanes: Sequence[Lane]) -> list[str]:
    """The verdict's sentences in order (the page sets each on a line of its own, the headline first)."""
    cut = [lane.title for lane in lanes if lane.cut_off]
    ranked = verdict_of([lane for lane in lanes if not lane.cut_off])
    if not cut:
        return ranked
    return [f"Cut off at the server's time limit, so not ranked (partial output): {', '.join(cut)}.", *ranked]


def verdict_of(lanes: Sequence[Lane]) -> list[str]:
    """:func:`verdict_parts` over the lanes that were not cut off (none for fewer than two timed lanes)."""
    timed = sorted((lane for lane in lanes if lane.total_ms > 0 and lane.token_ids),
                   key=lambda lane: -lane.metrics["throughput"])
    if len(timed) < 2:
        return []
    best = timed[0]
    against = [(lane, speed_ratio(lane, best)) for lane in timed[1:]]
    paired = min((interval.n if interval is not None else 0) for _, interval in against)
    ties = [lane.title for lane, interval in against if is_tie(interval)]
    slices = counted(paired, "paired slice", "paired slices")
    parts = [f"{lane.title} {ratio_text(interval)}{' (a tie: the interval holds 1)' if is_tie(interval) else ''}"
             if interval is not None else f"{lane.title} (no round in common)" for lane, interval in against]
    ranking = ", ".join(f"{i}. {lane.title} {lane.metrics['throughput']:.1f} tokens/s" for i, lane in
                        enumerate(timed, 1))
    if paired < MIN_SLICES:
        head = (f"No winner can be judged: {slices} {'is' if paired == 1 else 'are'} too "
                f"few to tell a difference from noise (it takes {MIN_SLICES}: raise the new-token limit); "
                f"{best.title} had the highest speed")
    elif ties:
        head = (f"No clear winner: {best.title} is fastest but ties with {', '.join(ties)} (the interval of the "
                f"speed ratio holds 1)")
    else:
        head = f"Fastest: {best.title}, beyond noise against every other lane"
    if paired < MIN_SLICES:  # no winner, so no reason why it won; a ratio that can only be noise is still said
        ar = next((lane for lane in lanes if lane.schedule == "ar"), None)
        why = next((note for note in (noise_note(lane, ar) for lane in lanes) if note), "")
    else:
        why = why_text(lanes, best)
    return [s for s in (f"{head}.", f"Speed over {best.title}'s (95% interval over {slices}): {', '.join(parts)}.",
                        f"Ranking by tokens per second of decoder time: {ranking}.", why, paper_comparisons(lanes))
            if s]
