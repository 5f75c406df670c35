"""One user's step-through run (:class:`StepRun`): the records computed so far and the iteration shown."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace

from packed_ss.engine import decode, scripted_drafter
from packed_ss.records import IterationRecord, RunRecord, summarize

from serve.errors import UserError
from serve.gpu import GpuTasks
from serve.limits import (MAX_ROWS_PER_REQUEST, TIME_LIMIT, ComputeGate, check_work, deadline_after, gated,
                          reference_rows, worst_case_seconds)
from serve.runs import schedule_for
from serve.settings import RunSettings
from serve.timing import TimingLog


# --- stepping -------------------------------------------------------------------------------------------
class StepRun:
    """One user's step-through run: the records computed so far and the iteration shown.

    Locally the engine's generator is advanced one iteration per Step (its adapter keeps the KV cache
    between requests). With ``eager=True`` (ZeroGPU, where no GPU state may outlive a request) the
    first Step computes the whole run in one GPU call (``tasks.records``) and later Steps only move
    through it.

    Attributes:
        settings: what the run decodes. prompt_ids: its token ids.
        records: iterations computed so far. position: iteration shown (0 = none yet).
        first_call_only: the shown iteration is shown up to its first call only (Linear-SS stepped by
            call: the drafting call, before its verification).
        finished: the engine stopped (EOS, limit or stop string). lock: held by a handler using the run.
    Raises: PromptError (a ValueError) on creation for an empty or too long prompt; UserError when the whole
        run's worst case exceeds ``max_rows``, when a scripted drafter's reference (computed at creation, one
        iteration per gate turn) runs past ``max_seconds`` from the clock, or when ``admit`` refuses it.

    ``admit(predicted seconds)``: the asking visitor's heavy slot (:class:`serve.admission.Admission`), held while
    whole runs compute: a scripted drafter's reference run, and an eager run's records (its first Step); ``cost()``:
    the model's call-cost fit that predicts their seconds. Priced as the whole runs they are, one address computes
    one at a time (four first Steps from one address, each a 512-token reference, kept every other visitor
    waiting, issue 54).
    """

    def __init__(self, settings: RunSettings, model, tasks: "GpuTasks | None" = None, eager: bool = False,
                 log: TimingLog | None = None, gate: ComputeGate | None = None, max_rows: int = MAX_ROWS_PER_REQUEST,
                 max_seconds: float | None = None, admit: Callable | None = None, cost: Callable | None = None):
        if eager and tasks is None:
            raise ValueError("an eager StepRun needs the GpuTasks that compute its records")
        self.settings = settings
        self.model = model
        self.prompt_ids = settings.prompt_ids(model)
        # The whole run is bounded like any request (an eager run computes it at once); a Step's turn at
        # the gate weighs one call, so Steps pass ahead of long races between two of their iterations.
        reference = ["ar"] if settings.scripted is not None else []  # a scripted drafter's AR reference run
        runner = schedule_for(model, settings)
        check_work([settings.schedule, *reference], len(self.prompt_ids), settings.config, max_rows,
                   any_order=getattr(model, "any_order", False))
        # No refusal on predicted time: a local Step computes one iteration per click, and an eager run computes
        # the iterations that fit in the time limit and says where it stopped (TIME_LIMIT).
        self.gate = gate
        self.priority = float(runner.max_rows(1, replace(settings.config, max_new_tokens=2)))
        if settings.scripted is None or eager:
            self.adapter = model.share()  # this run's own KV cache
        else:  # the drafter's AR reference: one iteration per turn at the gate, within this request's time limit,
            # each turn weighed as the whole reference run (its worst-case rows), not as a Step: the reference is a
            # full AR run, and a visitor's short request goes ahead of it between two of its iterations
            deadline = deadline_after(max_seconds)
            weight = reference_rows(len(self.prompt_ids), settings.config)
            longer = replace(settings.config, max_new_tokens=settings.config.max_new_tokens + settings.config.block_size)
            seconds = (worst_case_seconds(["ar"], len(self.prompt_ids), longer, cost())
                       if admit is not None and cost is not None else 0.0)
            with admit(seconds) if admit is not None else nullcontext():
                self.adapter = scripted_drafter(model, self.prompt_ids, settings.config, settings.scripted,
                                                settings.config.seed,
                                                lambda records: gated(records, gate, weight, deadline=deadline))
            if deadline is not None and time.monotonic() >= deadline:
                raise UserError(f"the scripted drafter's reference (AR's output) took past this server's time limit "
                                f"of {max_seconds:g} s: lower the new-token limit or the prompt length")
        self.records: list[IterationRecord] = []
        self.position = 0
        self.first_call_only = False
        self.finished = False
        self.eager = eager
        self.log = log
        self.lock = threading.Lock()
        self._iterator = decode(self.adapter, self.prompt_ids, settings.config, settings.schedule)  # validates
        self._tasks = tasks if eager else None
        self._admit, self._cost = admit, cost
        self.max_seconds = max_seconds  # an eager run's time limit from the clock (its records so far are kept)

    @property
    def done(self) -> int:
        """Iterations computed so far."""
        return len(self.records)

    def step(self, by_call: bool = False) -> bool:
        """Show the next iteration, computing it if needed; ``by_call``: an iteration of several calls
        (Linear-SS) is shown one call at a time. Returns False when the run is over."""
        if self.first_call_only:  # the rest of the shown iteration: its verification call
            self.first_call_only = False
            return True
        if not self._advance():
            return False
        self.first_call_only = by_call and len(self.records[self.position - 1].calls) > 1
        return True

    def _advance(self) -> bool:
        if self.position < len(self.records):
            self.position += 1
            return True
        if self.finished:
            return False
        if self._tasks is not None:
            s = self.settings
            whole = [s.schedule, *(["ar"] if s.scripted is not None else [])]  # the run, and its drafter's reference
            seconds = (worst_case_seconds(whole, len(self.prompt_ids), s.config, self._cost(),
                                          any_order=getattr(self.model, "any_order", False))
                       if self._admit is not None and self._cost is not None else 0.0)
            with self._admit(seconds) if self._admit is not None else nullcontext():
                new = self._tasks.records(s.model_ref, self.prompt_ids, s.config, s.schedule, self.priority,
                                          self.max_seconds)
            if new and new[-1].stop_reason is None:  # the time limit ended the run: say so where it stops
                new[-1] = replace(new[-1], stop_reason=TIME_LIMIT)
            self.finished = True
        else:
            new = list(itertools.islice(gated(self._iterator, self.gate, self.priority), 1))
            if not new or new[-1].stop_reason is not None:
                self.finished = True
        if self.log is not None:
            self.log.add(new, self.settings.config.block_size)
        self.records.extend(new)
        if self.position < len(self.records):
            self.position += 1
            return True
        return False

    def back(self) -> None:
        """Show the previous iteration (stays at 0); from a first call only, the previous whole iteration."""
        self.first_call_only = False
        self.position = max(0, self.position - 1)

    def goto(self, index: int) -> None:
        """Show iteration ``index`` (clamped to the iterations computed so far), all of its calls."""
        self.first_call_only = False
        self.position = max(0, min(int(index), len(self.records)))

    @property
    def at_end(self) -> bool:
        """Whether the last computed iteration is shown whole and the run has stopped."""
        return self.finished and self.position == len(self.records) and not self.first_call_only

    def shown_records(self) -> list[IterationRecord]:
        """Iterations 1..position as shown (the last one up to its first call when ``first_call_only``)."""
        shown = self.records[: self.position]
        if self.first_call_only and shown:
            shown[-1] = shown[-1].first_call()
        return shown

    def summary(self) -> RunRecord:
        """Run metrics over the iterations shown (:meth:`shown_records`)."""
        shown = self.shown_records()
        return summarize(shown, self.settings.schedule, self.settings.config.block_size,
                         self.settings.config.temperature, len(self.prompt_ids))
