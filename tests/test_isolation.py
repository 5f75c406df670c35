"""One visitor's model, precision, threads and compiling never reach another visitor's run.

torch keeps some settings once per process: the default dtype (transformers' ``from_pretrained`` sets it to the
loaded model's dtype while it builds the model), the thread count a new thread starts with and dynamo's stance. A
model or precision change by one visitor loads a model; here such loads, thread changes and compiles run beside other
visitors' runs of every heavy kind (Step, race, generate, benchmark, Explain), and those runs must come out as they do
alone: no error, the same tokens, the same acceptance.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import pytest
import torch

from helpers import tiny_llama

from packed_ss.config import DecodeConfig
from packed_ss.measure import timed_run
from packed_ss.models import DualModeModel

PROMPT = "w1 w2 w3"
SEED = 68  # a scripted drafter's 5th draw at this seed: 0.99977 in float32, 0.0 when drawn in bfloat16


def save(folder, seed: int, layers: int = 2):
    model = tiny_llama(vocab_size=20, seed=seed, logit_scale=3.0, layers=layers)
    model.model.config.mask_token_id = 1
    model.model.float().save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def other_model_dir(tmp_path_factory):
    """A second tiny float32 model (another seed, more layers: longer to build): the model a visitor switches to and
    from."""
    return save(tmp_path_factory.mktemp("other-model"), seed=3, layers=8)


def dtypes(model) -> set:
    """The dtypes of a loaded model's weights (its rotary buffers stay float32 in any precision)."""
    return {p.dtype for p in model.model.parameters()}


@pytest.fixture
def default_dtype_kept():
    """torch's default dtype as the test found it, put back afterwards (a failing test must not leave bfloat16)."""
    before = torch.get_default_dtype()
    yield before
    torch.set_default_dtype(before)


# --- loads beside loads -------------------------------------------------------------------------------------------
LOADS = 24  # float32 loads made while another thread loads bfloat16 models without pause


def test_two_threads_loading_two_precisions_get_each_model_whole_in_its_own(tiny_model_dir, default_dtype_kept):
    """A float32 load built while another thread's bfloat16 load held torch's default dtype came out part
    bfloat16 (its calls failed: "expected m1 and m2 to have the same dtype, but got: float != c10::BFloat16"), and
    the default could stay bfloat16 after both. Loads now take turns."""
    stop, failures = threading.Event(), []

    def other_loads():
        while not stop.is_set():
            try:
                if dtypes(DualModeModel.from_pretrained(str(tiny_model_dir), device="cpu", dtype="bfloat16")) != {
                        torch.bfloat16}:
                    failures.append("a bfloat16 load holds other dtypes")
            except Exception as error:  # noqa: BLE001 - counted
                failures.append(f"{type(error).__name__}: {error}")

    loader = threading.Thread(target=other_loads)
    loader.start()
    mixed = errors = 0
    try:
        for _ in range(LOADS):
            model = DualModeModel.from_pretrained(str(tiny_model_dir), device="cpu", dtype="float32")
            mixed += dtypes(model) != {torch.float32}
            try:
                timed_run(model.share(), [3, 4, 5], DecodeConfig(block_size=4, max_new_tokens=4), "packed")
            except RuntimeError:
                errors += 1
    finally:
        stop.set()
        loader.join()
    assert (mixed, errors, failures) == (0, 0, [])
    assert torch.get_default_dtype() == default_dtype_kept


# --- a load and the compute gate -------------------------------------------------------------------------------------
def test_a_model_load_waits_for_the_gate_turn_in_progress(tiny_model_dir, default_dtype_kept):
    """A visitor's precision change loads a model; the load changes torch's default dtype for the whole process while
    it builds, so it takes a turn of the compute gate: no other visitor's iteration computes meanwhile."""
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    gate = ComputeGate()
    store = ModelStore(str(tiny_model_dir), device="cpu")
    GpuTasks(store, gate)  # gives the store its gate, as a server does
    done = threading.Event()
    loader = threading.Thread(target=lambda: (store.get("", "bfloat16"), done.set()))
    with gate.turn(0.0):  # a visitor's iteration in progress
        loader.start()
        while not gate.waiting and not done.is_set():
            done.wait(0.01)
        assert not done.is_set(), "the model loaded during another request's turn of the gate"
        assert store.loaded() == [] and torch.get_default_dtype() == default_dtype_kept
    loader.join()
    assert done.is_set() and dtypes(store.get("", "bfloat16")) == {torch.bfloat16}


def test_a_gate_turn_finds_the_process_default_dtype_and_says_when_it_put_it_back(capfd, default_dtype_kept):
    """Whatever left torch's default dtype changed outside a model load, the next iteration at the gate computes
    with the process's own, and the server's log gets one line."""
    from serve.limits import ComputeGate

    gate = ComputeGate()
    torch.set_default_dtype(torch.bfloat16)
    with gate.turn(0.0):
        inside = torch.get_default_dtype()
    assert inside == default_dtype_kept
    log = capfd.readouterr().err
    assert log.count("torch's default dtype was bfloat16 with no model loading; set back to float32") == 1, log


def test_a_scripted_drafter_draws_the_same_whatever_the_default_dtype(default_dtype_kept):
    """The scripted drafter's uniform draws were made in the default dtype: under a bfloat16 default (another
    thread's load) they were other numbers, and the drafts and acceptance of the run changed."""
    from packed_ss.engine import scripted_drafter

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    config = DecodeConfig(block_size=4, max_new_tokens=24, seed=SEED)

    def run():
        record = timed_run(scripted_drafter(model, [3, 4, 5], config, 0.6, config.seed), [3, 4, 5], config, "packed")
        return record.token_ids, [r.h for r in record.records]

    alone = run()
    torch.set_default_dtype(torch.bfloat16)
    try:
        beside_a_load = run()
    finally:
        torch.set_default_dtype(default_dtype_kept)
    assert beside_a_load == alone


def test_display_strings_belong_to_the_model_they_were_made_for_not_to_its_address(tiny_model_dir):
    """The store kept each model's token strings by ``id(model)``: a Step's model pushed out of the store by another
    visitor's loads still made strings, and once it was freed a model of another checkpoint at the same address was
    shown them."""
    from serve.models import ModelStore

    class Words:  # a model as far as display strings go, with a tokenizer of its own
        def __init__(self, word: str):
            self.word = word

        def token_strings(self, ids):
            return [f"{self.word}{i}" for i in ids]

    store = ModelStore(str(tiny_model_dir), device="cpu")
    first = Words("first-")
    assert store.strings_for(first)([3]) == ["first-3"]
    address = id(first)
    del first
    for _ in range(1000):  # CPython hands the freed address to the next object of its size
        other = Words("other-")
        if id(other) == address:
            break
    else:
        pytest.skip("no object was given the freed address")
    assert store.strings_for(other)([3]) == ["other-3"]


# --- threads --------------------------------------------------------------------------------------------------------
def test_a_turn_in_a_new_thread_computes_with_the_servers_count_after_another_thread_set_one():
    """torch gives a new thread the count set last anywhere: after the background compile thread set 1 for itself, a
    later request's thread computed with 1 thread where the server's count was another (the tuner had not measured,
    or measured nothing: torch's count at start-up)."""
    from packed_ss.threads import ThreadTuner
    from serve.limits import ComputeGate

    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the process's count at start-up, here
    try:
        gate = ComputeGate(ThreadTuner(options=(1, 2)))  # nothing measured yet
        seen = []

        def background():  # as serve.background's thread does for itself
            torch.set_num_threads(1)

        def request():
            with gate.turn(0.0):
                seen.append(torch.get_num_threads())

        for work in (background, request):
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
        assert seen == [2]
    finally:
        torch.set_num_threads(before)


def test_a_run_keeps_its_thread_count_when_the_server_chooses_another_between_its_iterations(tiny_model_dir):
    """The tuner measures again when another request finds its choice stale, and each turn applied the count of the
    moment: a run admitted at 2 threads went on at 1 from its next iteration. A run now keeps the count it was
    admitted with; the new one is for the requests admitted after."""
    from packed_ss.threads import ThreadChoice, ThreadTuner
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    tuner = ThreadTuner(options=(1,))  # nothing to measure: the choice below is the server's
    tuner.choice = ThreadChoice(2, {2: 1.0})
    seen: list[int] = []

    class Counted(DualModeModel):
        """The tiny model noting torch's thread count at each call; after its second, the server chooses 1 thread
        (as a measurement made for another request would)."""

        def forward(self, *args, **kwargs):
            seen.append(torch.get_num_threads())
            if len(seen) == 2:
                tuner.choice = ThreadChoice(1, {1: 1.0})
            return super().forward(*args, **kwargs)

        def share(self, compiled=None):
            return Counted(self.model, self.tokenizer, self.mask_token_id, self.eos_token_id)

    base = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    counted = Counted(base.model, base.tokenizer, base.mask_token_id, base.eos_token_id)
    tasks = GpuTasks(ModelStore(str(tiny_model_dir), device="cpu", preloaded={"counted": counted}),
                     ComputeGate(tuner))
    before = torch.get_num_threads()
    try:
        tasks.generate(("counted", ""), [3, 4, 5], DecodeConfig(block_size=4, max_new_tokens=6), "ar")
    finally:
        torch.set_num_threads(before)
    assert len(seen) == 6 and set(seen) == {2}, seen  # the prefill and 5 more calls


# --- compiling ------------------------------------------------------------------------------------------------------
class HeldCompiler:
    """A stand-in for ``torch.compile``: the function it returns runs the eager one. The first call made in a thread
    named in ``holds`` reports there and waits until told to go on; every call notes whether dynamo's stance (one per
    process) skipped guard checks when it began and, when held, when it went on."""

    def __init__(self):
        self.holds: dict[int, tuple[threading.Event, threading.Event]] = {}  # thread -> (inside, go on)
        self.met: dict[int, list[bool]] = {}

    def __call__(self, function, **options):
        from torch._dynamo.eval_frame import _is_skip_guard_eval_unsafe_stance

        def compiled(*args, **kwargs):
            me = threading.get_ident()
            self.met.setdefault(me, []).append(_is_skip_guard_eval_unsafe_stance())
            if me in self.holds:
                inside, go_on = self.holds.pop(me)
                inside.set()
                go_on.wait(60)
                self.met[me].append(_is_skip_guard_eval_unsafe_stance())
            return function(*args, **kwargs)

        return compiled


def test_a_call_compiling_a_new_shape_never_meets_another_calls_unsafe_stance(monkeypatch):
    """A compiled call of a shape compiled before runs under dynamo's ``skip_guard_eval_unsafe`` stance, which is one
    per process: a model compiling a new shape in another thread meanwhile (Explain's background compile beside a
    visitor's compiled calls) trusted the guards of variants made for other shapes. That stance is now held only
    while no thread compiles; a call meanwhile checks every guard."""
    compiler = HeldCompiler()
    monkeypatch.setattr(torch, "compile", compiler)
    known, fresh = tiny_llama(vocab_size=20, seed=2, compiled=True), tiny_llama(vocab_size=20, seed=3, compiled=True)
    config = DecodeConfig(block_size=4, max_new_tokens=6)
    timed_run(known.share(), [3, 4, 5], config, "packed")  # its shapes are compiled now
    events = {name: (threading.Event(), threading.Event()) for name in ("compiling", "known")}
    threads = {}

    def held(name, model):
        def run():
            threads[name] = threading.get_ident()
            compiler.holds[threading.get_ident()] = events[name]
            timed_run(model.share(), [3, 4, 5], config, "packed")

        thread = threading.Thread(target=run)
        thread.start()
        assert events[name][0].wait(60)
        return thread

    compiling = held("compiling", fresh)  # inside its first compile: a new shape
    known_calls = held("known", known)  # inside a call of a shape compiled before
    events["compiling"][1].set()
    compiling.join()
    events["known"][1].set()
    known_calls.join()
    # its first call, a new shape: when it began and when it went on while the other call was inside (the thread's
    # later calls of the shape it compiled hold the stance themselves)
    assert compiler.met[threads["compiling"]][:2] == [False, False], compiler.met[threads["compiling"]]
    assert known.share().compiled and fresh.share().compiled


# --- one visitor changing model and precision while the others compute ---------------------------------------------
ROUNDS = 8  # runs of each heavy kind, each compared with the same run made alone
SWITCHES = 400  # at most this many model or precision changes of the visitor who thrashes meanwhile (two models held:
# most of them load one)


def heavy_kinds(server, prompt_file) -> dict:
    """Every heavy kind of request, as the app's handlers make it, at float32 on the default model: name -> a
    function returning what the run produced (tokens and acceptance, which no precision change may touch)."""
    from serve.benchmark import UPLOAD, run_small_benchmark
    from serve.race import run_race
    from serve.runs import run_generate
    from serve.settings import RequestValues
    from serve.step import StepRun

    def settings(**changes):
        values = dict(prompt=PROMPT, block_size=4, max_new_tokens=12, precision="float32", **changes)
        return server.settings(RequestValues(**values))

    def iterations(records) -> list:
        return [(tuple(r.appended), r.h) for r in records]

    def step():
        chosen = settings(temperature=0.7, seed=3)
        run = StepRun(chosen, server.store.get(*chosen.model_ref[:2]), tasks=server.tasks, gate=server.gate)
        while run.step():
            pass
        return iterations(run.records)

    def race():  # a scripted drafter: its draws are made here
        result = run_race(server.tasks, settings(drafter="scripted", drafter_quality=0.6, seed=SEED))
        return [(lane.schedule, tuple(lane.token_ids), lane.metrics["mean_acceptance_length"]) for lane in result.lanes]

    def generate():
        run = run_generate(server.tasks, settings(schedule="quadratic", temperature=0.9, seed=4))
        return tuple(run.token_ids), iterations(run.records)

    def benchmark():
        _, _, paths = run_small_benchmark(server.store.get, "", UPLOAD, prompt_file, 1, ["ar", "packed"], "4", 12, 0.0,
                                          1, 0, turn=lambda: server.gate.turn(float(server.max_rows)))
        rows = next(p for p in paths if p.endswith("examples.csv"))
        lines = [line.split(",") for line in open(rows, encoding="utf-8").read().splitlines()]
        columns = {name: i for i, name in enumerate(lines[0])}
        return [(row[columns["schedule"]], row[columns["token_hash"]], row[columns["nfe"]]) for row in lines[1:]]

    def explain():  # Explain's Measure: its short runs
        chosen = settings()
        ids = chosen.prompt_ids(server.store.get(*chosen.model_ref[:2]))
        return [(b, iterations(records)) for b, records in server.tasks.calibration(chosen.model_ref, ids, (4,), 8)]

    return {"step": step, "race": race, "generate": generate, "benchmark": benchmark, "explain": explain}


def thrash(server, other: str, going_on: Callable[[], bool], switches: int = SWITCHES) -> list[str]:
    """A visitor's /generate requests, each with another model or precision than the one before, while
    ``going_on()`` and at most ``switches`` of them; returns the errors its own requests met."""
    from serve.runs import run_generate
    from serve.settings import RequestValues

    choices = [("", "bfloat16"), (other, "float32"), ("", ""), (other, "bfloat16"), (other, "")]
    errors = []
    for k in range(switches):
        if not going_on():
            break
        model, precision = choices[k % len(choices)]
        try:
            run_generate(server.tasks, server.settings(RequestValues(model, PROMPT, "packed", 4, max_new_tokens=2,
                                                                     precision=precision)))
        except Exception as error:  # noqa: BLE001 - counted
            errors.append(f"{type(error).__name__}: {error}")
    return errors


def test_a_visitor_changing_model_and_precision_changes_no_other_visitors_run(tiny_model_dir, other_model_dir,
                                                                             tmp_path, default_dtype_kept):
    """One visitor switches model and precision without pause while the others run every heavy kind: 0 errors and
    0 runs that differ from the same run alone (a float32 load beside a bfloat16 one came out part bfloat16, and
    its calls failed with "expected m1 and m2 to have the same dtype")."""
    from serve.server import Server

    server = Server(str(tiny_model_dir), allowed=[other_model_dir], models_held=1, max_seconds=None, threads=1)
    prompt_file = tmp_path / "prompts.jsonl"
    prompt_file.write_text(json.dumps({"prompt": PROMPT}) + "\n", encoding="utf-8")
    kinds = heavy_kinds(server, str(prompt_file))
    alone = {name: run() for name, run in kinds.items()}
    errors, mismatches = [], []

    def victim(name, run):
        for _ in range(ROUNDS):
            try:
                if run() != alone[name]:
                    mismatches.append(name)
            except Exception as error:  # noqa: BLE001 - counted
                errors.append(f"{name}: {type(error).__name__}: {error}")

    victims = [threading.Thread(target=victim, args=item) for item in kinds.items()]
    for thread in victims:
        thread.start()
    thrasher_errors = thrash(server, other_model_dir, lambda: any(thread.is_alive() for thread in victims))
    for thread in victims:
        thread.join()
    assert (errors, mismatches, thrasher_errors) == ([], [], [])
    assert torch.get_default_dtype() == default_dtype_kept
