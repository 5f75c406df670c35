"""Lanes measured in turns: several runs on one prompt advanced side by side, so that every lane meets the same
machine (a race on a busy computer measures each lane under the same load, not whichever came last).

* :func:`slice_tokens` chooses how many new tokens one turn (a *slice*) advances a lane without a time limit;
  with one, :func:`next_slice` plans each round from the speed of the rounds before.
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

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from packed_ss.measure import rotated
from packed_ss.records import IterationRecord

COMMON_STOP = "common stop"  # stop reason of a lane trimmed to the race's common token count (a time limit)
TARGET_ROUNDS = 16  # rounds a race aims at: enough paired slices for a bootstrap interval
MIN_SLICE_TOKENS = 2  # the smallest slice: a turn of at least a couple of iterations of AR


def slice_tokens(max_new_tokens: int, rounds: int = TARGET_ROUNDS) -> int:
    """New tokens per slice without a time limit: ``max_new_tokens`` over ``rounds``, at least
    :data:`MIN_SLICE_TOKENS`. Raises: ValueError for a token count or round count below 1."""
    if max_new_tokens < 1 or rounds < 1:
        raise ValueError(f"max_new_tokens and rounds must be at least 1, got {max_new_tokens} and {rounds}")
    return max(MIN_SLICE_TOKENS, -(-max_new_tokens // rounds))


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
        targets: the common token target of each round begun (rising by a slice each round).
        stopped_at: the common token count every lane was trimmed to when the turns stopped early (None: every
            lane ran to its own end); 0 when a lane had made no token, so nothing can be compared.
    """

    runs: tuple[TurnRun, ...]
    targets: tuple[int, ...]
    stopped_at: int | None = None

    @property
    def rounds(self) -> int:
        return len(self.targets)

    @property
    def slice_range(self) -> tuple[int, int]:
        """(smallest, largest) slice of the rounds (tokens); (0, 0) without rounds."""
        steps = [b - a for a, b in zip((0, *self.targets), self.targets)]
        return (min(steps), max(steps)) if steps else (0, 0)


def take_turns(lanes: Sequence[tuple[str, Iterator[IterationRecord]]], slice_size: int, max_new_tokens: int,
               time_left: Callable[[], float] | None = None, rounds_aim: int = TARGET_ROUNDS,
               clock: Callable[[], float] = time.monotonic) -> Turns:
    """Advance ``lanes`` (name, iteration generator) side by side in rounds (see the module docstring), until
    every run has ended or one generator stops without its run ending (the caller's time limit: the turns stop
    there for every lane; :func:`stop_together` then trims them).

    Without ``time_left`` every round raises the target by ``slice_size`` tokens. With it (seconds left of the
    caller's limit, read on ``clock``), the first round is :data:`MIN_SLICE_TOKENS` and each later one is planned
    from the rounds before (:func:`next_slice`): the tokens the remaining time is expected to hold at the speed so
    far, spread over the rounds left of ``rounds_aim``, so that a machine slower than predicted still gives every
    lane many rounds before the limit.

    Raises: ValueError for no lanes, two of one name, or a slice below 1 token; whatever the generators raise (a
    server's ClientGone) passes through.
    """
    if not lanes or len({name for name, _ in lanes}) != len(lanes):
        raise ValueError(f"take_turns needs one or more lanes of distinct names, got {[name for name, _ in lanes]}")
    if slice_size < 1:
        raise ValueError(f"slice_size must be at least 1 token, got {slice_size}")
    records: dict[str, list[IterationRecord]] = {name: [] for name, _ in lanes}
    ends: dict[str, list[int]] = {name: [] for name, _ in lanes}
    tokens = dict.fromkeys(records, 0)
    ended = dict.fromkeys(records, False)
    generators = dict(lanes)
    targets: list[int] = []
    begun = clock()
    stopped, progressed = False, True
    while progressed and not stopped and not all(ended.values()):
        target = targets[-1] if targets else 0
        if time_left is None:
            step = slice_size
        elif not targets:
            step = MIN_SLICE_TOKENS
        else:
            step = next_slice(target, clock() - begun, time_left(), max_new_tokens, rounds_aim - len(targets))
        target = min(max_new_tokens, target + step)
        targets.append(target)
        progressed = target < max_new_tokens  # a round at the limit that runs nothing is the last
        for name in rotated([name for name, _ in lanes], len(targets) - 1):
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
        for name in records:
            ends[name].append(len(records[name]))
    runs = tuple(TurnRun(name, tuple(records[name]), tuple(ends[name]), ended[name]) for name, _ in lanes)
    return Turns(runs=runs, targets=tuple(targets))


SAFETY = 0.8  # the share of the time left that the next rounds are planned to fill


def next_slice(reached: int, spent_s: float, left_s: float, max_new_tokens: int, rounds_left: int) -> int:
    """The next round's slice (tokens): the tokens ``left_s`` seconds should hold at the speed of the rounds so far
    (``reached`` tokens of every lane in ``spent_s`` seconds), times :data:`SAFETY`, and no more than the tokens
    still to make, spread over ``rounds_left`` rounds (at least one); at least :data:`MIN_SLICE_TOKENS`."""
    remaining = max(0, max_new_tokens - reached)
    reachable = SAFETY * left_s * reached / spent_s if spent_s > 0 else remaining
    return max(MIN_SLICE_TOKENS, -(-int(min(reachable, remaining)) // max(1, rounds_left)))


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
    """``record`` with only its first ``keep`` appended tokens and the stop reason :data:`COMMON_STOP`; the tokens
    left out join its ``cut`` (its A_t becomes ``keep``)."""
    keep = max(0, min(keep, len(record.appended)))
    positions = record.appended_positions[:keep] if record.appended_positions else ()
    return replace(record, appended=record.appended[:keep], appended_sources=record.appended_sources[:keep],
                   appended_positions=positions, stop_reason=COMMON_STOP,
                   cut=record.cut + len(record.appended) - keep)


def slices(run: TurnRun) -> tuple[tuple[int, float], ...]:
    """(new tokens, decoder milliseconds) of ``run`` in each round, (0, 0.0) for a round it sat out."""
    out = []
    start = 0
    for end in run.round_ends:
        part = run.records[start:end]
        out.append((sum(new_tokens(r) for r in part), sum(r.wall_ms for r in part)))
        start = max(start, end)
    return tuple(out)
