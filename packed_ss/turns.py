"""Lanes measured in turns: several runs on one prompt advanced side by side, so that every lane meets the same
machine (a race on a busy computer measures each lane under the same load, not whichever came last).

* :func:`slice_tokens` chooses how many new tokens one turn (a *slice*) advances a lane.
* :func:`take_turns` drives the lanes' iteration generators in rounds: round r raises a common token target by
  one slice, and each lane, in an order rotated by one lane every round, runs iterations until it reaches the
  target (or ends). Between two iterations a server may serve other requests (the generators are its own gated
  ones), so a turn never holds the machine for more than one iteration.
* When a generator stops without the engine ending its run (a time limit from the clock), :func:`take_turns`
  stops every lane and :func:`stop_together` trims all of them to the same point: the token count the slowest
  unfinished lane had reached. No lane is cut while another finished.
* :func:`slices` gives one lane's (tokens, milliseconds) per round: the paired observations behind
  :func:`packed_ss.stats.paired_speed_ratio`.

Times are the engine's decoder times of each iteration (model plus non-model time, paper E.5); the order of
the lanes never changes what any lane computes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from packed_ss.measure import rotated
from packed_ss.records import IterationRecord

COMMON_STOP = "common stop"  # stop reason of a lane trimmed to the race's common token count (a time limit)
TARGET_ROUNDS = 16  # rounds a race aims at: enough paired slices for a bootstrap interval
MIN_SLICE_TOKENS = 2  # the smallest slice: a turn of at least a couple of iterations of AR


def slice_tokens(max_new_tokens: int, reachable_tokens: int | None = None, rounds: int = TARGET_ROUNDS) -> int:
    """New tokens per slice: the tokens the race expects to reach (``reachable_tokens``, e.g. what a time limit
    allows at the predicted speed; None: ``max_new_tokens``) over ``rounds``, at least :data:`MIN_SLICE_TOKENS`.

    Raises: ValueError for a token count or round count below 1.
    """
    if max_new_tokens < 1 or rounds < 1:
        raise ValueError(f"max_new_tokens and rounds must be at least 1, got {max_new_tokens} and {rounds}")
    reach = max_new_tokens if reachable_tokens is None else max(1, min(max_new_tokens, reachable_tokens))
    return max(MIN_SLICE_TOKENS, -(-reach // rounds))


def new_tokens(record: IterationRecord) -> int:
    """Output tokens an iteration added: appended minus positions it dropped (an any-order end marker)."""
    return len(record.appended) - len(record.dropped_positions)


@dataclass(frozen=True)
class TurnRun:
    """One lane after the turns.

    Attributes:
        name: the lane's key (a schedule name).
        records: its iterations in order (trimmed by :func:`stop_together`).
        round_ends: ``len(records)`` at the end of each round (rounds it sat out, ended, repeat the count).
        ended: the engine ended the run itself (EOS, the new-token limit, a stop string).
    """

    name: str
    records: tuple[IterationRecord, ...]
    round_ends: tuple[int, ...]
    ended: bool

    @property
    def tokens(self) -> int:
        return sum(new_tokens(r) for r in self.records)


@dataclass(frozen=True)
class Turns:
    """Lanes measured in turns.

    Attributes:
        runs: one :class:`TurnRun` per lane, in the order the lanes were given.
        slice_tokens: the target's step from one round to the next (tokens).
        rounds: rounds begun.
        stopped_at: the common token count every lane was trimmed to when the turns stopped early (None: every
            lane ran to its own end); 0 when a lane had made no token, so nothing can be compared.
    """

    runs: tuple[TurnRun, ...]
    slice_tokens: int
    rounds: int
    stopped_at: int | None = None


def take_turns(lanes: Sequence[tuple[str, Iterator[IterationRecord]]], slice_size: int,
               max_new_tokens: int) -> Turns:
    """Advance ``lanes`` (name, iteration generator) side by side in rounds of ``slice_size`` tokens (see the
    module docstring), until every run has ended or one generator stops without its run ending (the caller's
    time limit: the turns stop there for every lane; :func:`stop_together` then trims them).

    Raises: ValueError for no lanes or a slice below 1 token; whatever the generators raise (a server's
    ClientGone) passes through.
    """
    if not lanes:
        raise ValueError("take_turns needs at least one lane")
    if slice_size < 1:
        raise ValueError(f"slice_size must be at least 1 token, got {slice_size}")
    records: dict[str, list[IterationRecord]] = {name: [] for name, _ in lanes}
    ends: dict[str, list[int]] = {name: [] for name, _ in lanes}
    tokens = dict.fromkeys(records, 0)
    ended = dict.fromkeys(records, False)
    generators = dict(lanes)
    target, rounds, stopped = 0, 0, False
    progressed = True
    while progressed and not stopped and not all(ended.values()):
        target = min(max_new_tokens, target + slice_size)
        progressed = target < max_new_tokens  # a round at the limit that runs nothing is the last
        for name in rotated([name for name, _ in lanes], rounds):
            while not ended[name] and tokens[name] < target:
                record = next(generators[name], None)
                if record is None:  # the generator stopped before the engine ended the run: out of time
                    stopped = True
                    break
                progressed = True
                records[name].append(record)
                tokens[name] += new_tokens(record)
                ended[name] = record.stop_reason is not None
            if stopped:
                break
        rounds += 1
        for name in records:
            ends[name].append(len(records[name]))
    runs = tuple(TurnRun(name, tuple(records[name]), tuple(ends[name]), ended[name]) for name, _ in lanes)
    return Turns(runs=runs, slice_tokens=slice_size, rounds=rounds, stopped_at=None)


def stop_together(turns: Turns) -> Turns:
    """``turns`` with every lane trimmed to the same output length when any lane's run did not end: the tokens
    of the unfinished lane that made the fewest. A lane past that count keeps its iterations up to the first
    that reached it, whose appended tokens are cut to the count and whose stop reason becomes
    :data:`COMMON_STOP` (its whole time is kept: that iteration was needed for the count's last token); a lane
    whose run ended before the count keeps its whole run. Unchanged when every run ended."""
    unfinished = [run for run in turns.runs if not run.ended]
    if not unfinished:
        return turns
    common = min(run.tokens for run in unfinished)
    return replace(turns, runs=tuple(trimmed(run, common) for run in turns.runs), stopped_at=common)


def trimmed(run: TurnRun, tokens: int) -> TurnRun:
    """``run`` cut at ``tokens`` output tokens (see :func:`stop_together`); a run that ended with no more than
    that is returned as it is, and one that made no tokens at all is cut to no iterations."""
    if run.ended and run.tokens <= tokens:
        return run
    kept: list[IterationRecord] = []
    made = 0
    for record in run.records:
        if made >= tokens:
            break
        if made + new_tokens(record) >= tokens:
            kept.append(cut_record(record, tokens - made))
            break
        kept.append(record)
        made += new_tokens(record)
    return TurnRun(run.name, tuple(kept), tuple(min(end, len(kept)) for end in run.round_ends), ended=False)


def cut_record(record: IterationRecord, keep: int) -> IterationRecord:
    """``record`` with only its first ``keep`` appended tokens and the stop reason :data:`COMMON_STOP`."""
    keep = max(0, min(keep, len(record.appended)))
    positions = record.appended_positions[:keep] if record.appended_positions else ()
    return replace(record, appended=record.appended[:keep], appended_sources=record.appended_sources[:keep],
                   appended_positions=positions, stop_reason=COMMON_STOP)


def slices(run: TurnRun) -> tuple[tuple[int, float], ...]:
    """(new tokens, decoder milliseconds) of ``run`` in each round, (0, 0.0) for a round it sat out."""
    out = []
    start = 0
    for end in run.round_ends:
        part = run.records[start:end]
        out.append((sum(new_tokens(r) for r in part), sum(r.wall_ms for r in part)))
        start = max(start, end)
    return tuple(out)
