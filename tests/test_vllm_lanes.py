"""vLLM's own decoding as reference lanes of the benchmark (packed_ss/vllm_lanes.py).

Without vLLM's environment the lanes are left out with one line naming the install command, and the rest of the run
goes on. With it (``bash scripts/make_vllm_env.sh``), vLLM's greedy loop and n-gram speculation decode the embedded
model's prompts to AR's very tokens, and their acceptance comes from vLLM's counters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from packed_ss.bench.plan import BenchConfig, BenchError, Prompt
from packed_ss.bench.run import run_benchmark
from packed_ss.vllm_lanes import INSTALL, VLLM_REFERENCES, checkpoint_folder, env_python, vllm_problem

EMBEDDED = Path(__file__).resolve().parents[1] / "assets" / "model"
PROMPTS = [Prompt("p1", "def fibonacci(n):\n"), Prompt("p2", "import os\n\ndef list_files(path):\n"),
           Prompt("p3", "for i in range(10):\n    for i in range(10):\n")]


def test_without_vllms_environment_its_lanes_are_left_out_with_one_line_and_the_rest_runs(monkeypatch, capsys):
    from helpers import tiny_llama

    monkeypatch.setenv("PACKED_SS_VLLM_PYTHON", "/nonexistent/vllm-python")
    why = vllm_problem()
    assert why.startswith("the vLLM lanes need vLLM's environment") and INSTALL in why and "\n" not in why
    model = tiny_llama(seed=3, logit_scale=3.0)
    config = BenchConfig(schedules=("ar", "vllm-ar", "packed", "vllm-ngram"), max_new_tokens=6, warmup=False,
                         resamples=100)
    result = run_benchmark(model, [Prompt("a", "w1 w2 w3"), Prompt("b", "w4 w5")], config)
    assert set(result.summary["schedules"]) == {"ar", "packed"}
    assert set(result.summary["meta"]["vllm"]["left_out"]) == {"vllm-ar", "vllm-ngram"}
    assert capsys.readouterr().err.count("left out: the vLLM lanes need") == 2
    with pytest.raises(BenchError, match="vllm-ar: the vLLM lanes need"):
        run_benchmark(model, [Prompt("a", "w1 w2 w3")], BenchConfig(schedules=("vllm-ar",), warmup=False))


def test_the_lanes_load_a_local_checkpoint_folder_only(tmp_path):
    from helpers import tiny_llama

    built = tiny_llama(seed=3)
    assert checkpoint_folder(built) is None  # made in memory: nothing for vLLM to load
    built.model.save_pretrained(tmp_path)
    built.model.config._name_or_path = str(tmp_path)
    assert checkpoint_folder(built) == tmp_path.resolve()


def _vllm_here() -> bool:
    return env_python().exists() and vllm_problem() is None


@pytest.mark.slow
@pytest.mark.skipif(not _vllm_here(), reason=f"vLLM's environment is not installed ({INSTALL})")
def test_vllms_greedy_and_ngram_lanes_give_ars_tokens_with_vllms_own_acceptance():
    """Three prompts of the embedded model in float32: vLLM's greedy loop and its n-gram proposer (k = B - 1 = 3)
    give the engine's AR tokens on every prompt; n-gram's acceptance length comes from vLLM's counters."""
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(EMBEDDED, device="cpu", dtype="float32")
    config = BenchConfig(schedules=("ar", "vllm-ar", "vllm-ngram"), default_block_size=4, max_new_tokens=48,
                         resamples=100)
    result = run_benchmark(model, PROMPTS, config)
    summary = result.summary
    lossless = summary["lossless"]["by_schedule"]
    assert all(lossless[name]["compared"] == 3 and lossless[name]["differing"] == 0 for name in ("vllm-ar", "vllm-ngram")), lossless
    assert summary["schedules"]["vllm-ngram"]["mean_acceptance_length"] >= 1.0
    assert summary["meta"]["vllm"]["startup_s"] and not summary["meta"]["vllm"]["left_out"]
    assert set(VLLM_REFERENCES) >= {"vllm-ar", "vllm-ngram"}


def test_an_nld_folder_or_a_folder_without_a_mask_id_is_left_out_with_the_command_that_fixes_it(tmp_path, monkeypatch):
    """vLLM cannot load the NLD format, and Linear-SS in vLLM needs the mask id in config.json: one line each, the
    first naming the export command."""
    import json

    from helpers import write_nld_checkpoint
    from packed_ss.models import DualModeModel
    from packed_ss import vllm_lanes

    monkeypatch.setattr(vllm_lanes, "_imports", lambda python, module: True)
    monkeypatch.setattr(vllm_lanes, "env_python", lambda: Path(__file__))  # any file that exists
    write_nld_checkpoint(tmp_path / "nld")
    nld = DualModeModel.from_pretrained(str(tmp_path / "nld"), device="cpu", dtype="float32")
    why = vllm_problem(nld, "vllm-linear")
    assert "no Nemotron-Labs-Diffusion architecture" in why and "python -m packed_ss.vllm_export" in why
    plain = DualModeModel.from_pretrained(str(EMBEDDED), device="cpu", dtype="float32")
    assert vllm_problem(plain, "vllm-linear") is None
    config = json.loads((EMBEDDED / "config.json").read_text())
    del config["mask_token_id"]
    monkeypatch.setattr(vllm_lanes, "checkpoint_folder", lambda model: tmp_path / "bare")
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text(json.dumps(config))
    assert "no mask_token_id" in vllm_problem(plain, "vllm-linear") and vllm_problem(plain, "vllm-ngram") is None


def test_a_vllm_lane_that_samples_wrongly_at_t_above_0_refuses_it_in_one_line():
    """vLLM 0.32.0's CPU build draws speculative tokens at T > 0 with uninitialised temperatures; only its plain
    loop and the Linear-SS proposer (which corrects it in vLLM's process) may sample; greedy goes for every lane."""
    from packed_ss.vllm_lanes import VllmWorker

    for method, samples in (("ar", True), ("linear", True), ("ngram", False), ("suffix", False)):
        lane = object.__new__(VllmWorker)
        lane.method = method
        assert lane._sampling(0.0) == 0.0
        if samples:
            assert lane._sampling(0.7) == 0.7
        else:
            with pytest.raises(ValueError, match=f"vLLM's {method} lane is greedy only"):
                lane._sampling(0.7)
