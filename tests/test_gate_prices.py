"""Work at the compute gate is priced by what it computes (issue 54, item 1): a scripted drafter's AR reference
run, computed inside a first Step, waits behind another visitor's short request between two of its iterations,
as any long run does. Measured as gate turns, never as times."""

import threading
import time

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode
from packed_ss.models import DualModeModel
from serve.limits import ComputeGate, gated, reference_rows, worst_case_rows
from serve.settings import make_settings
from serve.step import StepRun

from helpers import tiny_llama

PROMPT = " ".join(f"w{i % 15 + 1}" for i in range(200))  # a long prompt: the short request's rows are many


class Slow(DualModeModel):
    """The tiny model, 20 ms of sleep in every call: the reference runs last long enough to be overtaken, and a
    thread that has just had its turn asks for the next one long before another turn ends, however busy the
    machine."""

    def forward(self, *args, **kwargs):
        time.sleep(0.02)
        return super().forward(*args, **kwargs)

    def share(self):
        return Slow(self.model, self.tokenizer, self.mask_token_id, self.eos_token_id)


def test_a_scripted_drafters_reference_run_gives_way_to_a_short_request():
    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    model = Slow(base.model, base.tokenizer, base.mask_token_id, None)
    gate = ComputeGate()
    settings = make_settings("slow", PROMPT, "packed", 8, 0, 0, 1, 0, 64, False, "", "scripted", 0.9)
    ids = settings.prompt_ids(model)
    short = DecodeConfig(block_size=8, max_new_tokens=4)
    short_rows = float(worst_case_rows(["ar"], len(ids), short)[0][2])
    assert reference_rows(len(ids), settings.config) > short_rows  # the reference is the larger work
    created = []
    first_steps = [threading.Thread(target=lambda: created.append(StepRun(settings, model, gate=gate)))
                   for _ in range(2)]  # two visitors' first Steps: one reference always waits for the gate
    for thread in first_steps:
        thread.start()
    try:
        while gate.activity()[0] < 6:  # the reference runs are under way
            time.sleep(0.01)
        owner = object()
        with gate.watch(owner) as others:
            made = list(gated(decode(model.share(), ids, short, "ar"), gate, short_rows, owner=owner))
            overtaken_by = others()
        assert len(made) >= 4
        # Before each of the short request's turns (its iterations and the turn that finds the run over) at most one
        # reference iteration, the one under way when it asked; before, a reference weighed a 2-token Step and the
        # two took every turn until they were done (over 100 here).
        assert overtaken_by <= len(made) + 1, overtaken_by
    finally:
        for thread in first_steps:
            thread.join()
    assert len(created) == 2 and all(run.adapter.reference for run in created)  # the Steps still got their drafters


def test_one_address_computes_one_scripted_reference_at_a_time():
    """Reported: four first Steps from one address, each computing a 512-token AR reference, held all four Step
    places and kept other visitors waiting. A reference run is now admitted as the heavy work it is, priced by its
    predicted seconds: while the address has a heavy request running, its next first Step is refused in one line;
    a Step without a scripted drafter (one iteration) is let in, and so is another address's."""
    import pytest

    from packed_ss.cost import CallCost
    from serve.admission import Admission
    from serve.errors import UserError

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    admission = Admission(light_s=0.0)  # every priced reference counts as heavy here, whatever the machine's speed
    asked = []

    def admit_for(visitor):
        def admit(seconds):
            asked.append(seconds)
            return admission.admit(visitor, seconds)
        return admit

    fit = CallCost(tau_ms=1.0, delta_ms=0.1)
    scripted = make_settings("tiny", PROMPT, "packed", 8, 0, 0, 1, 0, 64, False, "", "scripted", 0.9)
    with admission.admit("203.0.113.9", 10.0):  # the address's race, or its first reference, is computing
        with pytest.raises(UserError, match="already have a heavy request"):
            StepRun(scripted, model, admit=admit_for("203.0.113.9"), cost=lambda: fit)
        assert asked and asked[-1] > 0  # priced by its reference run's predicted seconds
        plain = make_settings("tiny", PROMPT, "packed", 8, 0, 0, 1, 0, 64, False, "", "", 0.0)
        StepRun(plain, model, admit=admit_for("203.0.113.9"), cost=lambda: fit)  # no reference: nothing to admit
        other = StepRun(scripted, model, admit=admit_for("198.51.100.7"), cost=lambda: fit)
        assert other.adapter.reference  # another address's first Step is served
    assert admission.heavy_running == 0  # every slot given back


def test_an_eager_first_step_is_admitted_as_its_whole_run():
    """On ZeroGPU a first Step computes the whole run (and a scripted drafter's reference) in one GPU call: the same
    gap as the reference run's, closed the same way: priced by the whole run, one per address at a time."""
    import pytest

    from packed_ss.cost import CallCost
    from serve.admission import Admission
    from serve.errors import UserError

    class Tasks:  # computes nothing: the admission is what is looked at
        def records(self, *args):
            computed.append(args)
            return []

    computed, asked = [], []
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    admission = Admission(light_s=0.0)

    def admit(seconds):
        asked.append(seconds)
        return admission.admit("203.0.113.9", seconds)

    settings = make_settings("tiny", PROMPT, "packed", 8, 0, 0, 1, 0, 64, False, "", "", 0.0)
    run = StepRun(settings, model, tasks=Tasks(), eager=True, admit=admit, cost=lambda: CallCost(1.0, 0.1))
    with admission.admit("203.0.113.9", 10.0):  # the address's race is computing
        with pytest.raises(UserError, match="already have a heavy request"):
            run.step()
        assert not computed and asked and asked[-1] > 0
    run.step()  # its slot is free again: the run is computed
    assert len(computed) == 1 and admission.heavy_running == 0
