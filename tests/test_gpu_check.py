"""scripts/gpu_check.py's paper experiment (issue 55, item 2) runs on the CPU with small stand-in shapes: every lane
of the paper (AR, Linear-SS B = 32, Quadratic-SS B = 8, Packed-SS B = 32; capped at 8 here) races on NLD-shaped
random models with the scripted drafter, in float32 and bfloat16, and the section says what it measured."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_the_paper_experiment_runs_on_a_cpu_and_reports_every_lane_on_both_forwards():
    check = load_script()
    sizes = check.Sizes(quick=True)
    sizes.paper_shapes = {"small-2L": check.NLD_QUICK_SHAPE}
    sizes.paper_prompts = check.PROMPTS[:1]
    sizes.paper_tokens = 12
    seen = []
    out = check.paper_experiment(check.Models("cpu"), sizes, check.Budget(600.0), "cpu", progress=seen.append)
    assert list(out["runs"]) == ["small-2L, bfloat16", "small-2L, float32"] and len(seen) == 6
    assert "no CUDA device" in out["forwards"]["graphs"]
    for entry in out["runs"].values():
        assert entry["graphs"]["path"] == "native" and entry["transformers"]["path"] == "transformers", entry
        assert entry["graphs"]["graphs"] is False  # on a CPU: the graph path's code, eager
        for forward in ("graphs", "transformers"):
            lanes = entry[forward]["lanes"]
            assert set(lanes) == {"ar", "linear", "quadratic", "packed"}, entry
            assert all(lane["same_tokens_as_ar"] in ("1/1", "0/1") for lane in lanes.values())
            assert lanes["ar"]["same_tokens_as_ar"] == "1/1" and lanes["ar"]["tokens_per_nfe"] == 1.0
            assert lanes["packed"]["tokens_per_nfe"] > 1.0 and lanes["packed"]["model_ms_per_iteration"] > 0
            assert entry[forward]["ratios"]["packed/linear"]["estimate"] > 0
        assert set(entry["graphs_over_transformers"]) == {"ar", "linear", "quadratic", "packed"}
    report = {"paper_experiment": out, "environment": {}}
    lines = [line for line in check.summary_lines(report) if line.startswith("paper")]
    assert len(lines) == 6 and all("tok/NFE" in line or "graphs/transformers" in line for line in lines), lines


def test_the_graph_call_cost_section_runs_on_a_cpu_and_says_no_graphs_ran():
    check = load_script()
    sizes = check.Sizes(quick=True)
    sizes.paper_shapes = {"small-2L": check.NLD_QUICK_SHAPE}
    sizes.cost_rows = (1, 4)
    out = check.graph_call_cost(check.Models("cpu"), sizes, check.Budget(600.0), "cpu")
    entry = out["small-2L"]
    assert entry["graphs"] is False and "no CUDA device" in entry["note"], entry
    assert entry["floor_ms"] > 0 and entry["compute_ms_per_row"] > 0 and entry["spec_gflops"] is None
    for attention in ("written", "sdpa"):  # each way the native forward attends, on an adapter of its own
        part = entry[attention]
        assert [row["rows"] for row in part["by_rows"]] == [1, 4] and all(row["over_floor"] > 0 for row in part["by_rows"])
        assert part["graphs"] is False and part["shapes"] == [] and "eager_profile" not in part
    assert out["operations_per_layer"]["sdpa"] < out["operations_per_layer"]["compiled_form"]  # the graph path's form
    profiles = check.kernel_profiles(check.Models("cpu"), sizes, check.Budget(600.0), "cpu")
    for attention in ("written", "sdpa"):
        profile = profiles["small-2L"][attention]  # on a CPU: the eager call's operators
        assert profile["unit"] == "operators" and profile["per_call"] > 10 and profile["ms_per_call"] > 0, profile
        assert any("linear" in top["name"] or "mm" in top["name"] for top in profile["top"]), profile
    assert any("scaled_dot_product" in top["name"] or "attention" in top["name"]
               for top in profiles["small-2L"]["sdpa"]["top"]) or profiles["small-2L"]["sdpa"]["per_call"] < \
        profiles["small-2L"]["written"]["per_call"]
    lines = [line for line in check.summary_lines({"graph_call_cost": out, "kernel_profile": profiles,
                                                    "environment": {}})
             if line.startswith(("graph path", "kernel profile"))]
    assert len(lines) == 5 and "operations per layer" in lines[0], lines
    assert "small-2L written" in lines[1] and "small-2L sdpa" in lines[2], lines
    assert lines[3].startswith("kernel profile small-2L written") and "operators" in lines[3], lines


class FirstCaptureFails:
    """A recorder (tests/test_graphs.py's HostRecorder) whose captures after the first ``succeed`` run out of GPU
    memory: what an 8B shape's capture met on a GPU."""

    succeed = 0

    def __init__(self):
        from test_graphs import HostRecorder

        self._host, self.seen = HostRecorder(), 0
        self.adapters = self._host.adapters

    @staticmethod
    def problem(device) -> None:
        return None

    def record(self, call, device):
        import torch

        self.seen += 1
        if self.seen > self.succeed:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self._host.record(call, device)

    @staticmethod
    def release() -> None:
        pass


def graph_calls_on_the_cpu(monkeypatch, recorder, replay_ms=None):
    """Every DualModeModel on the native path asked for compiled calls replays graphs through ``recorder`` (a
    class), and gpu_check builds its NLD-shaped models so."""
    from packed_ss.models.adapter import DualModeModel
    from packed_ss.models.graphs import GraphCalls

    class Calls(GraphCalls):
        recorder_class = recorder

        def replay_ms(self, repeats: int = 10) -> dict:  # CUDA events: none on a CPU
            return {} if replay_ms is None else replay_ms

    made = DualModeModel._calls

    def calls(self, compiled):
        if self.path != "native" or not compiled:
            return made(self, compiled)
        return Calls(self.model, self.supports_deferred_rows, compiled)

    monkeypatch.setattr(DualModeModel, "_calls", calls)


@pytest.mark.filterwarnings("ignore:CUDA graphs off")
def test_the_graph_call_cost_section_reports_what_ran_after_the_calls(monkeypatch):
    """The section wrote graphs and note before any call, so a capture that ran out of memory mid-section was reported
    as graph-path timings with graphs true and no note. Read after the calls: eager, and why."""
    check = load_script()
    build = check.nld_shaped_model
    monkeypatch.setattr(check, "nld_shaped_model", lambda device, shape, tokenizer, dtype, path, compiled:
                        build(device, shape, tokenizer, dtype, path=path, compiled=True))
    sizes = check.Sizes(quick=True)
    sizes.paper_shapes = {"small-2L": check.NLD_QUICK_SHAPE}
    sizes.cost_rows = (1, 4)
    graph_calls_on_the_cpu(monkeypatch, FirstCaptureFails)
    entry = check.graph_call_cost(check.Models("cpu"), sizes, check.Budget(600.0), "cpu")["small-2L"]
    assert entry["graphs"] is False and "out of GPU memory while recording" in entry["note"], entry
    for attention in ("written", "sdpa"):
        part = entry[attention]
        assert part["graphs"] is False and "out of GPU memory while recording" in part["note"], part
        assert part["shapes"] == [] and all(row["median_ms"] > 0 for row in part["by_rows"])  # timed, eagerly

    class Captures(FirstCaptureFails):
        succeed = 10 ** 6

    graph_calls_on_the_cpu(monkeypatch, Captures)  # every capture succeeds: graphs, and the shapes replayed
    entry = check.graph_call_cost(check.Models("cpu"), sizes, check.Budget(600.0), "cpu")["small-2L"]
    assert entry["graphs"] is True and entry["note"] is None, entry
    assert all(entry[attention]["graphs"] and entry[attention]["shapes"] for attention in ("written", "sdpa"))


@pytest.mark.filterwarnings("ignore:CUDA graphs off")
def test_the_paper_lanes_report_a_capture_failure_in_their_runs(monkeypatch):
    """Captures that run out of memory after a first one was recorded (mid-run): those shapes' calls run eagerly and
    the lanes finish with AR's tokens; the report names the shapes that ran eagerly and why (it said graphs true and
    no note, read before the first call)."""
    from helpers import tiny_llama

    from packed_ss import DecodeConfig, generate

    check = load_script()

    class SecondCaptureFails(FirstCaptureFails):
        succeed = 1

    graph_calls_on_the_cpu(monkeypatch, SecondCaptureFails)
    model = tiny_llama(seed=6, logit_scale=3.0, compiled=True)
    assert model.graphs, model.compile_note
    eager = tiny_llama(seed=6, logit_scale=3.0)
    sizes = check.Sizes(quick=True, quality=0.5)
    sizes.paper_prompts, sizes.paper_tokens = ("w1 w2 w3",), 12
    scripts = [generate(eager, eager.encode(text), DecodeConfig(block_size=8, max_new_tokens=20), "ar").token_ids
               for text in sizes.paper_prompts]
    report, _ = check.paper_lanes(model, scripts, sizes, check.Budget(600.0))
    assert "out of GPU memory while recording" in report["note"] and report["eager_shapes"], report
    assert all(lane["same_tokens_as_ar"] == "1/1" for lane in report["lanes"].values()), report["lanes"]


def test_what_ran_counts_captures_and_replays_where_the_calls_count_them():
    check = load_script()

    class Calls:
        def __init__(self, shapes, captures=None, replays=None):
            self.shapes, self.captures, self.replays = shapes, captures, replays

    class Adapter:
        def __init__(self, static, graphs=True, note=None):
            self.static, self.graphs, self.compile_note = static, graphs, note

    counted = [Adapter(Calls([(8, 256)], 1, 5)), Adapter(Calls([(8, 256), (16, 256)], 2, 7))]
    assert check.what_ran(*counted) == {"graphs": True, "note": None, "shapes": [[8, 256], [16, 256]],
                                        "eager_shapes": [], "captures": 3, "replays": 12}
    off = Adapter(Calls([]), graphs=False, note="CUDA graphs off (x)")
    assert check.what_ran(counted[0], off) == {"graphs": False, "note": "CUDA graphs off (x)", "shapes": [[8, 256]],
                                               "eager_shapes": [], "captures": None, "replays": None}


def test_only_runs_the_sections_named_and_refuses_an_unknown_one(tmp_path, capsys):
    import json

    import pytest

    check = load_script()
    with pytest.raises(SystemExit) as refused:
        check.main(["--device", "cpu", "--quick", "--only", "graph_cost"])
    assert refused.value.code == 2 and "unknown section(s) graph_cost" in capsys.readouterr().err
    out = tmp_path / "check.json"
    assert check.main(["--device", "cpu", "--quick", "--only", "race", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"script", "elapsed_s", "environment", "race"}, sorted(report)
    assert set(report["race"]["schedules"]) == {"ar", "linear", "quadratic", "packed"}


def test_the_paper_lanes_make_one_adapter_per_lane_whatever_the_number_of_prompts(monkeypatch):
    """On the graph path every adapter records its own graphs: a drafter adapter per prompt and lane, and one per
    continuation after a near-tie, recorded the same shapes again and again. Now each drafting lane
    and the continuations have one adapter for the whole section."""
    from helpers import tiny_llama

    from packed_ss import DecodeConfig, generate
    from packed_ss.models.adapter import DualModeModel

    check = load_script()
    model = tiny_llama(seed=6, logit_scale=3.0)
    made = []
    share = DualModeModel.share
    monkeypatch.setattr(DualModeModel, "share", lambda self, *a, **k: made.append(1) or share(self, *a, **k))
    for prompts in (("w1 w2 w3",), ("w1 w2 w3", "w4 w5", "w6 w2")):
        made.clear()
        sizes = check.Sizes(quick=True, quality=0.5)
        sizes.paper_prompts, sizes.paper_tokens = prompts, 12
        scripts = [generate(model, model.encode(text), DecodeConfig(block_size=8, max_new_tokens=20), "ar").token_ids
                   for text in prompts]
        report, lanes = check.paper_lanes(model, scripts, sizes, check.Budget(600.0))
        assert len(made) == 4, (prompts, len(made))  # Linear-, Quadratic- and Packed-SS, and the continuations
        assert all(len(runs) == len(prompts) for runs in lanes.values())
        assert report["lanes"]["ar"]["same_tokens_as_ar"] == f"{len(prompts)}/{len(prompts)}"


def test_the_paper_experiment_runs_both_shapes_in_bfloat16_before_float32_and_takes_a_quality(monkeypatch, tmp_path,
                                                                                                 capsys):
    """A budget that runs out drops float32 first; a model that cannot be built is data, and the rest still runs."""
    import json

    import pytest

    check = load_script()
    built = []

    def refuse(device, shape, tokenizer, dtype, **kwargs):
        built.append((shape["num_hidden_layers"], dtype))
        raise RuntimeError("CUDA out of memory (stand-in)")

    monkeypatch.setattr(check, "nld_shaped_model", refuse)
    out = tmp_path / "check.json"
    assert check.main(["--device", "cpu", "--quick", "--only", "paper_experiment", "--quality", "0.9",
                       "--out", str(out)]) == 0
    report = json.loads(out.read_text())["paper_experiment"]
    assert report["quality"] == 0.9
    assert list(report["runs"]) == ["small-2L, bfloat16", "small-3L, bfloat16", "small-2L, float32",
                                    "small-3L, float32"]
    assert built == [(2, "bfloat16"), (3, "bfloat16"), (2, "float32"), (3, "float32")]
    assert all("out of memory" in entry["error"] for entry in report["runs"].values())
    with pytest.raises(SystemExit) as refused:
        check.main(["--device", "cpu", "--quick", "--quality", "1.5"])
    assert refused.value.code == 2 and "--quality must be in [0, 1]" in capsys.readouterr().err


def test_the_cuda_tests_keep_what_they_printed_when_they_time_out(tmp_path):
    """The CUDA tests' section kept no output when it timed out (subprocess.run with a timeout): the child's output
    goes to a log as it comes, and after the timeout it is interrupted (pytest then prints where it was)."""
    check = load_script()
    log = tmp_path / "child.log"
    child = "print('reached the slow part'); import time; time.sleep(60); print('never')"
    done = check.run_captured([sys.executable, "-c", child], timeout_s=3.0, log=log)
    assert done["timed_out"] is True and done["exit_code"] is None, done
    assert "reached the slow part" in done["output_tail"] and "never" not in done["output_tail"], done
    assert "KeyboardInterrupt" in done["output_tail"]  # interrupted, not killed: where it was is printed
    assert "reached the slow part" in log.read_text()
    finished = check.run_captured([sys.executable, "-c", "print('done')"], timeout_s=60.0, log=log)
    assert finished == {**finished, "exit_code": 0, "timed_out": False, "output_tail": "done"}


def test_the_cuda_tests_run_in_one_process_on_a_budget_of_their_own(monkeypatch, tmp_path):
    """Three xdist workers for one module, and about 95 s taken from the sections' budget: now one process, -x,
    the slowest durations, --cuda-tests-s seconds, and the sections' budget starts after them."""
    import json

    check = load_script()
    seen = []

    def captured(command, timeout_s, log):
        seen.append((command, timeout_s, log))
        return {"exit_code": 0, "timed_out": False, "wall_s": 1.0, "output_tail": "== 3 passed in 1.00s ==",
                "log": str(log)}

    monkeypatch.setattr(check, "run_captured", captured)
    out = tmp_path / "check.json"
    assert check.main(["--device", "cpu", "--quick", "--only", "cuda_tests", "--cuda-tests-s", "42",
                       "--out", str(out)]) == 0
    command, timeout_s, log = seen[0]
    assert timeout_s == 42.0 and log == tmp_path / "check.cuda_tests.log"
    assert command[command.index("-p") + 1] == "no:xdist" and "-x" in command and "--durations=15" in command
    assert command[-1] == "tests/test_cuda.py" and not any(arg.startswith("-n") for arg in command)
    report = json.loads(out.read_text())["cuda_tests"]
    assert report["summary"] == "== 3 passed in 1.00s ==" and report["timeout_s"] == 42.0
    tail = ["tests/test_cuda.py::test_a PASSED [ 50%]", "tests/test_cuda.py::test_b ", "!!! KeyboardInterrupt !!!"]
    assert check._running(tail) == "tests/test_cuda.py::test_b"  # a timeout's summary names the test it was in
    budget = check.Budget(10.0)
    budget.set_aside(5.0)  # 5 s spent on the CUDA tests are not the sections'
    assert 14.0 < budget.left() <= 15.0


def test_the_kernel_profile_runs_after_every_timing(monkeypatch, tmp_path):
    """The eager kernel profile ran between the two attentions' timings it is compared with: now it is the last
    section."""
    check = load_script()
    order = []
    monkeypatch.setattr(check, "call_costs", lambda model, sizes, budget: order.append("timed") or {"by_rows": []})
    monkeypatch.setattr(check, "race", lambda *args, **kwargs: order.append("race") or {})
    monkeypatch.setattr(check, "kernel_profile", lambda model, sizes, attention: order.append("profile") or {})
    out = tmp_path / "check.json"
    assert check.main(["--device", "cpu", "--quick", "--only", "kernel_profile,graph_call_cost,race",
                       "--out", str(out)]) == 0
    assert order.count("profile") == 4 and order.count("timed") == 4 and "race" in order, order
    assert max(i for i, what in enumerate(order) if what != "profile") < order.index("profile"), order
