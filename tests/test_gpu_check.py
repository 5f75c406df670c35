"""scripts/gpu_check.py's paper experiment (issue 55, item 2) runs on the CPU with small stand-in shapes: every lane
of the paper (AR, Linear-SS B = 32, Quadratic-SS B = 8, Packed-SS B = 32; capped at 8 here) races on NLD-shaped
random models with the scripted drafter, in float32 and bfloat16, and the section says what it measured."""

import importlib.util
import sys
from pathlib import Path

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
    assert entry["floor_ms"] > 0
    for attention in ("written", "sdpa"):  # each way the native forward attends, on an adapter of its own
        part = entry[attention]
        assert [row["rows"] for row in part["by_rows"]] == [1, 4] and all(row["over_floor"] > 0 for row in part["by_rows"])
        profile = part["eager_profile"]  # on a CPU: the eager call's operators
        assert profile["unit"] == "operators" and profile["per_call"] > 10 and profile["ms_per_call"] > 0, profile
        assert any("linear" in top["name"] or "mm" in top["name"] for top in profile["top"]), profile
    assert any("scaled_dot_product" in top["name"] or "attention" in top["name"]
               for top in entry["sdpa"]["eager_profile"]["top"]) or entry["sdpa"]["eager_profile"]["per_call"] < \
        entry["written"]["eager_profile"]["per_call"]
    assert out["operations_per_layer"]["sdpa"] < out["operations_per_layer"]["compiled_form"]  # the graph path's form
    lines = [line for line in check.summary_lines({"graph_call_cost": out, "environment": {}})
             if line.startswith("graph path")]
    assert len(lines) == 3 and "operations per layer" in lines[0], lines
    assert "small-2L written" in lines[1] and "small-2L sdpa" in lines[2], lines


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
    continuation after a near-tie, recorded the same shapes again and again (session 28). Now each drafting lane
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
