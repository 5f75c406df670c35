"""What a decoding run leaves behind: one record per iteration and one per run.

An iteration record carries what the paper's Figure 2 draws (old draft d, verifier predictions v, new
proposals z, h and A, kept and discarded proposals) plus the calls made, so a UI can replay the run.
Metric definitions (shared/notes/field-notes.md, paper Section 4 and E.5):

* tokens/NFE = generated tokens / model forwards (prefill included);
* time/NFE = decoder wall time / NFE (milliseconds);
* throughput = generated tokens / decoder wall time (tokens per second);
* mean acceptance length = mean tokens committed per verifying iteration: A = h + 1 (correction or bonus
  included), or fewer where EOS, a stop string or the limit cut the iteration (A is then the tokens appended,
  and the record's ``cut`` counts the rest); the prefill iteration is excluded; AR's iterations each commit
  A = 1. A cut iteration counts with the A it appended (what it committed, not what the verifier accepted);
* per-position acceptance rate i = committed draft tokens at draft position i / drafts that had a
  position i;
* acceptance histogram = counts of committed draft tokens per verifying iteration (h, or fewer where
  EOS, a stop string or the limit cut the iteration), 0..W.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from packed_ss.layout import CallLayout

# Where an appended token came from.
SOURCE_PREFILL = "prefill"  # the verifier's prediction from the prefill call
SOURCE_DRAFT = "accepted draft"  # a draft token the verifier accepted
SOURCE_CORRECTION = "correction"  # verifier token replacing the first rejected draft token
SOURCE_BONUS = "bonus"  # verifier token after a fully accepted draft
SOURCE_AR = "autoregressive"  # plain AR decoding
SOURCE_DIFFUSION = "diffusion"  # committed by the drafter without verification
SOURCES = (SOURCE_PREFILL, SOURCE_DRAFT, SOURCE_CORRECTION, SOURCE_BONUS, SOURCE_AR, SOURCE_DIFFUSION)


@dataclass(frozen=True)
class CallRecord:
    """One model forward: its layout and its model time (milliseconds, CUDA-synchronised).

    ``adapter_selected``: rows that received the drafter adapter's update; ``adapter_evaluated``: rows it
    was computed for (the whole call when on, 0 when off). Paper Table 5's "selected" and "evaluated".
    ``recorded_ms``: time spent recording the call's CUDA graph before its clock started (a shape the run's untimed
    rehearsal did not meet, :mod:`packed_ss.models.graphs`); in neither ``model_ms`` nor the iteration's wall time.
    """

    layout: CallLayout
    model_ms: float
    adapter_selected: int = 0
    adapter_evaluated: int = 0
    recorded_ms: float = 0.0


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of a schedule (Algorithm 1 lines 2-11 for Packed-SS).

    Positions are absolute token positions; the first generated token has position ``prompt_len``.

    Attributes:
        index: iteration number t (1-based).
        prefix_len_before, prefix_len_after: |P_{t-1}| and |P_t| in tokens, prompt included.
        old_draft: d_{t-1}, the draft verified by this iteration (Linear-SS: the one drafted in it).
        verifier_tokens: v_t^(i), argmax of each verifier row, aligned from position prefix_len_before;
            rows past h + 1 were computed but not reached.
        verifier_probs: p_t^(i)(v_t^(i)) for each verifier row (probabilities of the shown tokens).
        accept_probs: alpha_i = min(1, p/Q) of the tested draft tokens (T > 0), empty when greedy.
        proposals: z_t, the drafter's proposals; ``proposal_start`` is the position of z_t^(1).
        kept: indices into ``proposals`` that form the next draft D_t (the rest were discarded).
        h: draft tokens the verifier accepted (all of them, also those past a cut).
        appended, appended_sources: tokens added to the prefix and where each came from.
        advance: A_t = len(appended), the tokens this iteration committed: h + 1 (accepted draft tokens plus
            the correction or bonus) unless the stopping rule cut the iteration; 0 for calls that only draft.
            Derived from ``appended``, never passed. Left to right, the advances of a run sum to its tokens;
            any order, they sum to its tokens plus the ``dropped_positions`` of all its iterations.
        cut: tokens of C_t the stopping rule left out (EOS, a stop string, the new-token limit, or the common
            stop of a race): h + 1 - A_t for a verifying iteration (the correction or bonus first, then any
            accepted draft tokens past the stopping index), the block's rest for block diffusion, the
            accepted pairs past the new E any order; 0 when nothing was cut. ``stop_reason`` says why.
        calls: the model calls of this iteration.
        model_ms, other_ms: model time and non-model decoder time (milliseconds).
        stop_reason: ``"eos"``, ``"limit"``, ``"stop string"`` or ``None`` while running.
        next_draft, next_draft_sources: D_t from position ``prefix_len_after`` on and where each token came
            from (``"drafter"`` or ``"n-gram"``); filled by schedules that mix draft sources, empty otherwise
            (there D_t is ``proposals`` at ``kept``).
        old_draft_sources: the same for ``old_draft`` (what this iteration verified).
        branches: the partial-branch schedule only: the acceptance lengths h its call prepared a branch for.
        order: any-order schedules (Appendix C) only: pi_t, the window's unresolved output positions in
            verification order (absolute positions); empty for left-to-right schedules, whose rows follow
            the prefix. There ``old_draft`` and ``verifier_tokens`` are in rank order, ``draft_positions``
            gives the position of each old draft token, ``appended_positions`` of each appended token,
            ``proposal_positions`` of each proposal, and ``dropped_positions`` lists earlier accepted
            positions removed because an end marker moved E before them (Algorithm 3 line 12).
        cropped: oldest cached tokens dropped before this iteration's calls to fit the model's context
            (SetDLM checkpoints beyond their ``length``, :mod:`packed_ss.any_order.session`); 0 otherwise.
        recorded_ms: CUDA graph recording inside the iteration (its calls' ``recorded_ms``), left out of
            ``other_ms`` and so of the wall time; 0 otherwise.
    """

    index: int
    schedule: str
    prefix_len_before: int
    prefix_len_after: int
    old_draft: tuple[int, ...]
    verifier_tokens: tuple[int, ...]
    verifier_probs: tuple[float, ...]
    accept_probs: tuple[float, ...]
    proposals: tuple[int, ...]
    proposal_start: int
    kept: tuple[int, ...]
    h: int
    appended: tuple[int, ...]
    appended_sources: tuple[str, ...]
    calls: tuple[CallRecord, ...]
    model_ms: float
    other_ms: float
    stop_reason: str | None = None
    cut: int = 0
    next_draft: tuple[int, ...] = ()
    next_draft_sources: tuple[str, ...] = ()
    old_draft_sources: tuple[str, ...] = ()
    branches: tuple[int, ...] = ()
    order: tuple[int, ...] = ()
    draft_positions: tuple[int, ...] = ()
    appended_positions: tuple[int, ...] = ()
    proposal_positions: tuple[int, ...] = ()
    dropped_positions: tuple[int, ...] = ()
    cropped: int = 0
    recorded_ms: float = 0.0
    advance: int = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "advance", len(self.appended))  # A_t: the tokens this iteration committed

    @property
    def rows(self) -> int:
        """Rows evaluated over all calls of the iteration (Table 2)."""
        return sum(call.layout.rows for call in self.calls)

    @property
    def wall_ms(self) -> float:
        return self.model_ms + self.other_ms

    @property
    def discarded(self) -> tuple[int, ...]:
        """Indices into ``proposals`` not kept: at positions this iteration filled, or past them where the run
        stopped (or, Packed-SS + n-gram, replaced by the n-gram's token)."""
        return tuple(i for i in range(len(self.proposals)) if i not in self.kept)

    def first_call(self) -> "IterationRecord":
        """This iteration as it stood after its first call (Linear-SS: drafted, not yet verified): that
        call only, the draft, no verifier outputs, nothing appended. Its time is the call's model time."""
        call = self.calls[0]
        return replace(self, calls=(call,), model_ms=call.model_ms, other_ms=0.0, verifier_tokens=(),
                       verifier_probs=(), accept_probs=(), h=0, appended=(), appended_sources=(), cut=0,
                       prefix_len_after=self.prefix_len_before, stop_reason=None)

    @property
    def verifies(self) -> bool:
        """Whether this iteration checked a draft (prefill and drafting-only calls do not)."""
        return any(s in (SOURCE_DRAFT, SOURCE_CORRECTION, SOURCE_BONUS) for s in self.appended_sources)


@dataclass(frozen=True)
class RunRecord:
    """A finished (or stopped) run: generated tokens, costs and acceptance statistics.

    Units: ``wall_s``/``model_s``/``other_s`` seconds of decoder time (model loading and tokenisation
    excluded, paper E.5), ``time_per_nfe_ms`` milliseconds, ``throughput`` tokens per second.
    """

    schedule: str
    block_size: int
    temperature: float
    prompt_len: int
    token_ids: tuple[int, ...]
    sources: tuple[str, ...]
    text: str
    nfe: int
    iterations: int
    rows: int
    wall_s: float
    model_s: float
    other_s: float
    stop_reason: str | None
    mean_acceptance_length: float
    per_position_acceptance: tuple[float, ...]
    acceptance_histogram: tuple[int, ...]
    records: tuple[IterationRecord, ...] = field(default=(), repr=False)
    adapter_selected_rows: int = 0
    adapter_evaluated_rows: int = 0

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def recorded_s(self) -> float:
        """Seconds of CUDA graph recording inside the run's iterations, left out of ``wall_s`` (0.0 when its
        shapes were all recorded before its clock started, or off the graph path)."""
        return sum(r.recorded_ms for r in self.records) / 1000

    @property
    def cropped(self) -> int:
        """Cached tokens dropped to fit the model's context over the run (SetDLM's crop; 0 for most runs)."""
        return sum(r.cropped for r in self.records)

    @property
    def tokens_per_nfe(self) -> float:
        return self.tokens / self.nfe if self.nfe else 0.0

    @property
    def time_per_nfe_ms(self) -> float:
        return 1000 * self.wall_s / self.nfe if self.nfe else 0.0

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def max_rows_per_call(self) -> int | None:
        """The most rows of one call after the first iteration (the prefill's excluded); None when the run
        made no call after its first iteration."""
        return max((c.layout.rows for r in self.records[1:] for c in r.calls), default=None)

    def metrics(self) -> dict:
        """JSON-ready summary (no per-iteration records)."""
        return {
            "schedule": self.schedule,
            "block_size": self.block_size,
            "temperature": self.temperature,
            "prompt_len": self.prompt_len,
            "text": self.text,
            "token_ids": list(self.token_ids),
            "tokens": self.tokens,
            "nfe": self.nfe,
            "iterations": self.iterations,
            "rows": self.rows,
            "wall_s": self.wall_s,
            "model_s": self.model_s,
            "other_s": self.other_s,
            "tokens_per_nfe": self.tokens_per_nfe,
            "time_per_nfe_ms": self.time_per_nfe_ms,
            "throughput": self.throughput,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": list(self.per_position_acceptance),
            "acceptance_histogram": list(self.acceptance_histogram),
            "stop_reason": self.stop_reason,
            "cropped": self.cropped,
            "adapter_selected_rows": self.adapter_selected_rows,
            "adapter_evaluated_rows": self.adapter_evaluated_rows,
        }


def _mean_advance(records: list[IterationRecord], verifying: list[IterationRecord]) -> float:
    """Mean A over the iterations after the prefill: verifying iterations (h + 1 each, fewer where cut), or AR's
    one-token iterations (A = 1). 0.0 when there are none (a prefill-only run, block diffusion)."""
    counted = verifying or [r for r in records if SOURCE_AR in r.appended_sources]
    return sum(r.advance for r in counted) / len(counted) if counted else 0.0


def _textual(records: list[IterationRecord]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Tokens and sources of an any-order run by output position, dropped positions removed."""
    filled: dict[int, tuple[int, str]] = {}
    for r in records:
        for j in r.dropped_positions:
            filled.pop(j, None)
        for j, t, s in zip(r.appended_positions, r.appended, r.appended_sources):
            filled[j] = (t, s)
    ordered = [filled[j] for j in sorted(filled)]
    return tuple(t for t, _ in ordered), tuple(s for _, s in ordered)


def summarize(records: list[IterationRecord], schedule: str, block_size: int, temperature: float,
              prompt_len: int, text: str = "") -> RunRecord:
    """Aggregate iteration records into a run record (definitions in the module docstring)."""
    tokens = tuple(t for r in records for t in r.appended)
    sources = tuple(s for r in records for s in r.appended_sources)
    if any(r.appended_positions for r in records):  # any order: the output in textual order (Algorithm 3 line 18)
        tokens, sources = _textual(records)
    width = block_size - 1
    verifying = [r for r in records if r.verifies]
    histogram = [0] * (width + 1)
    reached = [0] * width
    accepted = [0] * width
    for r in verifying:
        # Count what was committed: draft tokens after an EOS, a stop string or the limit were checked
        # but cut (Algorithm 1 lines 7-8), so they are not accepted tokens of the output.
        committed = r.appended_sources.count(SOURCE_DRAFT)
        histogram[min(committed, width)] += 1
        for i in range(min(len(r.old_draft), width)):
            reached[i] += 1
            accepted[i] += i < committed
    model_ms = sum(r.model_ms for r in records)
    other_ms = sum(r.other_ms for r in records)
    return RunRecord(
        schedule=schedule,
        block_size=block_size,
        temperature=temperature,
        prompt_len=prompt_len,
        token_ids=tokens,
        sources=sources,
        text=text,
        nfe=sum(len(r.calls) for r in records),
        iterations=len(records),
        rows=sum(r.rows for r in records),
        adapter_selected_rows=sum(c.adapter_selected for r in records for c in r.calls),
        adapter_evaluated_rows=sum(c.adapter_evaluated for r in records for c in r.calls),
        wall_s=(model_ms + other_ms) / 1000,
        model_s=model_ms / 1000,
        other_s=other_ms / 1000,
        stop_reason=records[-1].stop_reason if records else None,
        mean_acceptance_length=_mean_advance(records, verifying),
        per_position_acceptance=tuple(a / n if n else 0.0 for a, n in zip(accepted, reached)),
        acceptance_histogram=tuple(histogram),
        records=tuple(records),
    )
