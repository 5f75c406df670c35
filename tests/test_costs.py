"""The time estimates follow the latest fit of the model (issue 30, item 1): a fresh measurement replaces the fit,
a request that ran much slower or faster than its fit rescales it, and no request is refused for its predicted time
(the clock cuts it off instead), so the defaults run on a loaded machine."""

import dataclasses
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from helpers import tiny_llama

from packed_ss.cost import CallCost
from packed_ss.layout import prefill_layout
from packed_ss.models import DualModeModel
from packed_ss.records import CallRecord

LIMIT_S = 20.0  # the app's default time limit (serve.limits.MAX_SECONDS_PER_REQUEST)


def _records(call_ms: float, calls: int, rows: int = 4) -> list:
    """``calls`` iterations (what the book reads of an IterationRecord: its calls) of one call of ``rows`` rows
    with no cached keys, each taking ``call_ms``."""
    layout = prefill_layout(list(range(2, 2 + rows)), 0, 1)
    return [SimpleNamespace(calls=(CallRecord(layout, call_ms),))] * calls


def _book(fit: CallCost):
    from serve.costs import CostBook

    probes = []

    def probe(model_ref, fresh, alive=None):
        probes.append(fresh)
        return fit

    return CostBook(probe), probes


def test_the_first_use_measures_and_a_fresh_measurement_replaces_the_fit():
    book, probes = _book(CallCost(2.0, 0.1))
    assert book.entry(("m", "")) is None
    assert book.fit(("m", "")) == CallCost(2.0, 0.1) and probes == [False]
    assert book.fit(("m", "", 0.8)) == CallCost(2.0, 0.1) and probes == [False]  # a scripted drafter: same network
    entry = book.remeasure(("m", ""), "re-measured by Explain's Measure")
    assert probes == [False, True] and book.entry(("m", "")).source == "re-measured by Explain's Measure"
    assert entry.fit == CallCost(2.0, 0.1)


@pytest.mark.parametrize("measured_ms, moves", [(30.0, True), (0.5, True), (3.0, False), (2.0, False)])
def test_a_request_that_ran_much_slower_or_faster_than_its_fit_rescales_it(measured_ms, moves):
    from serve.costs import predicted_ms

    fit = CallCost(2.0, 0.0)  # 2 ms a call
    book, _ = _book(fit)
    book.fit(("m", ""))
    ratio = book.observe(("m", ""), _records(measured_ms, 10))
    assert ratio == pytest.approx(measured_ms / 2.0)
    now = book.fit(("m", ""))
    if moves:
        assert now.tau_ms == pytest.approx(measured_ms) and "rescaled" in book.entry(("m", "")).source
        assert predicted_ms(now, _records(measured_ms, 10))[:2] == pytest.approx((10 * measured_ms,) * 2)
    else:
        assert now == fit and book.entry(("m", "")).source == "measured at first use"


def test_too_few_calls_move_nothing():
    book, _ = _book(CallCost(2.0, 0.0))
    book.fit(("m", ""))
    assert book.observe(("m", ""), _records(50.0, 3)) is None and book.fit(("m", "")).tau_ms == 2.0


class SlowCalls(DualModeModel):
    """The tiny model, each call ``delay_s`` slower in its own measured model time (a loaded machine)."""

    delay_s = 0.0

    def forward(self, *args, **kwargs):
        time.sleep(self.delay_s)
        out = super().forward(*args, **kwargs)
        return dataclasses.replace(out, model_ms=out.model_ms + self.delay_s * 1000)

    def share(self, compiled=None):
        twin = SlowCalls(self.model, self.tokenizer, self.mask_token_id, self.eos_token_id)
        twin.delay_s = self.delay_s
        return twin


def _tasks(fit: CallCost, delay_s: float = 0.0):
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)  # no EOS: runs go to their limit
    base.model.call_cost_fit = fit  # what the first fit said
    model = SlowCalls(base.model, base.tokenizer, base.mask_token_id, None)
    model.delay_s = delay_s
    return GpuTasks(ModelStore(preloaded={"slow": model}), ComputeGate()), model


def test_after_a_slow_first_fit_the_default_step_and_race_run_and_the_fit_follows_the_measurement():
    """The fit says 400 ms a call (measured while something else took the cores); the model is fast now. The
    default Step (128 tokens) and race are admitted and finish within the limit, and the first request's
    measurement brings the estimate down."""
    from serve.limits import worst_case_seconds
    from serve.race import run_race
    from serve.runs import run_generate
    from serve.settings import make_settings
    from serve.step import StepRun

    tasks, model = _tasks(CallCost(tau_ms=400.0, delta_ms=0.0))
    settings = make_settings("slow", "w1 w2 w3", "packed", 8, 0, 0, 1, 0, 128)
    slow_estimate = worst_case_seconds(["packed"], 4, settings.config, tasks.cost(settings.model_ref))
    assert slow_estimate > LIMIT_S  # what refused the default Step before

    run = StepRun(settings, model, tasks=tasks, gate=tasks.gate, max_seconds=LIMIT_S)
    assert run.step() and run.done == 1
    start = time.monotonic()
    first = run_race(tasks, settings, max_seconds=LIMIT_S)
    assert time.monotonic() - start < LIMIT_S + 10 and first.stopped_at is None and not first.cut_off
    entry = tasks.costs.entry(settings.model_ref)
    assert "rescaled" in entry.source and "faster" in entry.source and entry.fit.tau_ms < 40.0
    assert worst_case_seconds(["packed"], 4, settings.config, entry.fit) < slow_estimate / 10
    again = run_race(tasks, settings, max_seconds=LIMIT_S)
    assert not again.cut_off and again.stopped_at is None
    done = run_generate(tasks, settings, max_seconds=LIMIT_S)
    assert done.tokens == 128


def test_calls_that_turn_slow_raise_the_estimate():
    from serve.runs import run_generate
    from serve.settings import make_settings

    tasks, model = _tasks(CallCost(tau_ms=0.3, delta_ms=0.0), delay_s=0.01)
    settings = make_settings("slow", "w1 w2 w3", "ar", 8, 0, 0, 1, 0, 16)
    tasks.cost(settings.model_ref)
    run_generate(tasks, settings, max_seconds=LIMIT_S)
    entry = tasks.costs.entry(settings.model_ref)
    assert "slower" in entry.source and entry.fit.tau_ms > 5.0  # about the 10 ms each call now takes


def test_explains_measure_refits_the_estimates(tiny_model_dir):
    from serve.gpu import GpuTasks
    from serve.models import ModelStore
    from serve.runs import calibrate
    from serve.settings import make_settings
    from serve.timing import TimingLog

    tasks = GpuTasks(ModelStore(str(tiny_model_dir)))
    settings = make_settings("", "w1 w2 w3", "packed", 4, 0, 0, 1, 0, 8)
    model = tasks.store.get("")
    model.model.call_cost_fit = CallCost(tau_ms=999.0, delta_ms=0.0)  # a stale, slow fit
    assert tasks.cost(settings.model_ref).tau_ms == 999.0
    calibrate(tasks, settings, TimingLog(), block_sizes=(4,), new_tokens=4)
    entry = tasks.costs.entry(settings.model_ref)
    assert entry.source == "re-measured by Explain's Measure" and entry.fit.tau_ms < 999.0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores: one burning, one serving")
def test_a_loaded_server_still_admits_and_completes_the_default_step(tiny_model_dir):
    """A CPU-burning process beside the app (bounded to 120 s; killed at the end): the default Step (128 new
    tokens, Packed-SS, B = 8) is admitted and steps to its end through the page's own event."""
    import app
    from helpers import page_event, serve

    burner = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 120\nwhile time.time() < end: "
                               "pass"])
    try:
        for url in serve(app.build_demo(str(tiny_model_dir))):
            values = ["", "w1 w2 w3", "packed", 8, 0, 0, 1, 0, 128, False, "", "model", 0.8, "ltr", False]
            kind, outputs = page_event(url, "step", values, session="loaded")
            assert kind == "complete" and 'data-iteration="1"' in outputs[1] and "pss-error" not in str(outputs)
            for clicks in range(1, 200):  # each Step computes one iteration
                kind, outputs = page_event(url, "step", values, session="loaded")
                assert kind == "complete" and "pss-error" not in str(outputs[-1]), outputs[-1]
                if "The run has ended" in str(outputs[-1]):
                    break
            assert "The run has ended (limit)" in str(outputs[-1]) and clicks < 199, outputs[-1]
    finally:
        burner.kill()
        burner.wait()
