"""llama.cpp as a reference lane (packed_ss.llamacpp): the GGUF writer's tensor check everywhere; the lanes
themselves where the optional llama-cpp-python is installed."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from packed_ss.llamacpp import (_halves_order, _pairs_order, gguf_mismatches, gguf_problem, llamacpp_generate,
                                llamacpp_problem, write_gguf)

gguf = pytest.importorskip("gguf", reason="the gguf package (requirements.txt) is not installed")


def _gqa_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return LlamaForCausalLM(config).eval()


def test_the_query_and_key_row_order_round_trips():
    weight = np.arange(4 * 8 * 3, dtype=np.float32).reshape(32, 3)
    pairs = _pairs_order(weight, heads=4)
    assert not np.array_equal(pairs, weight) and np.array_equal(_halves_order(pairs, heads=4), weight)
    # head 0 holds rows 0-7: halves (0-3 | 4-7) become adjacent pairs (0, 4), (1, 5), ...
    assert pairs[:8, 0].tolist() == weight[[0, 4, 1, 5, 2, 6, 3, 7], 0].tolist()


@pytest.mark.parametrize("which", ["shipped", "gqa"])
def test_the_gguf_file_holds_every_tensor_of_the_checkpoint(which, tmp_path):
    if which == "shipped":
        from conftest import EMBEDDED
        from packed_ss.models import DualModeModel

        network = DualModeModel.from_pretrained(EMBEDDED, device="cpu").model
    else:
        network = _gqa_llama()
    path = write_gguf(network, tmp_path / "m.gguf")
    assert gguf_mismatches(network, path) == []
    reader = gguf.GGUFReader(str(path))
    assert len(reader.tensors) == len(network.state_dict())
    assert {t.tensor_type for t in reader.tensors} == {gguf.GGMLQuantizationType.F32}
    with torch.no_grad():  # a changed checkpoint no longer matches the file, and the check names the tensor
        network.model.layers[1].self_attn.k_proj.weight[0, 0] += 1e-3
    assert gguf_mismatches(network, path) == ["model.layers.1.self_attn.k_proj.weight: differs"]


def test_a_checkpoint_llamas_architecture_does_not_describe_is_refused_in_one_line(nld_dir, tmp_path):
    from packed_ss.models import DualModeModel

    nld = DualModeModel.from_pretrained(nld_dir, device="cpu")
    assert "model type 'ministral3'" in gguf_problem(nld.model)
    with pytest.raises(ValueError, match="handles Llama checkpoints"):
        write_gguf(nld.model, tmp_path / "x.gguf")


def test_without_llama_cpp_python_the_lanes_are_one_line_naming_the_extra(monkeypatch, tiny_model_dir, tmp_path,
                                                                            capsys):
    from packed_ss.bench.cli import main

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as if it were not installed
    assert "requirements-llamacpp.txt" in llamacpp_problem()
    code = main(["--model", str(tiny_model_dir), "--prompts", "humaneval", "--limit", "1", "--max-new-tokens", "4",
                 "--schedules", "ar,llamacpp-ar", "--out", str(tmp_path / "out")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "pip install -r requirements-llamacpp.txt" in err[0], err


needs_llamacpp = pytest.mark.skipif(llamacpp_problem() is not None,
                                    reason="llama-cpp-python is not installed (pip install -r requirements-llamacpp.txt)")


@needs_llamacpp
def test_llamacpps_greedy_and_lookup_loops_give_ars_tokens(embedded_model):
    from packed_ss import DecodeConfig, generate
    from packed_ss.models import DualModeModel

    model = DualModeModel.from_pretrained(embedded_model.model.name_or_path, device="cpu")  # float32, as written
    for text in ("def fib(n):\n", "import os\n\n\nclass Walker:\n    def __init__(self, root):\n"):
        prompt = model.encode(text)
        ar = generate(model, prompt, DecodeConfig(max_new_tokens=48), "ar").token_ids
        plain = llamacpp_generate(model, prompt, 48, "llamacpp-ar", 8)
        lookup = llamacpp_generate(model, prompt, 48, "llamacpp-lookup", 8)
        assert plain.token_ids == ar and plain.nfe == len(ar)
        assert lookup.token_ids == ar and lookup.nfe <= len(ar)


@needs_llamacpp
def test_the_benchmark_reports_the_llamacpp_lanes_beside_ar(tmp_path):
    import json

    from conftest import EMBEDDED
    from packed_ss.bench.cli import main

    out = tmp_path / "out"
    code = main(["--model", str(EMBEDDED), "--prompts", "humaneval", "--limit", "2", "--max-new-tokens", "12",
                 "--schedules", "ar,llamacpp-ar,llamacpp-lookup", "--out", str(out), "--resamples", "200"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    lossless = summary["lossless"]["by_schedule"]
    for lane in ("llamacpp-ar", "llamacpp-lookup"):
        assert lossless[lane]["compared"] == 2 and lossless[lane]["differing"] == 0, lossless[lane]
