"""The embedded model on a CUDA device: lossless in float32, well-formed runs in bfloat16, exact cache.

Every test is skipped unless ``torch.cuda.is_available()``; the module is skipped when the embedded
model (``assets/model``) has no weights. ``scripts/gpu_check.py`` runs this file on a GPU machine.
"""

from pathlib import Path

import pytest
import torch

from packed_ss import DecodeConfig, generate
from packed_ss.divergence import divergence
from packed_ss.schedules import REGISTRY, SPECULATIVE

EMBEDDED = Path(__file__).resolve().parents[1] / "assets" / "model"
if not (EMBEDDED / "model.safetensors").exists():
    pytest.skip("assets/model has no weights", allow_module_level=True)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\ndef list_files(path):\n",
    "The quick brown fox",
)
NEW_TOKENS = 48


def _load(dtype: str, path: str = "auto"):
    """The embedded model on CUDA: by default on the graph path (the native forward, its calls replayed as CUDA
    graphs); ``path="transformers"``: transformers' forward, eager."""
    from packed_ss.models import DualModeModel

    return DualModeModel.from_pretrained(EMBEDDED, device="cuda", dtype=dtype, path=path)


@pytest.fixture(scope="module")
def cuda_float32():
    """The embedded model on CUDA in float32."""
    return _load("float32")


@pytest.fixture(scope="module")
def cuda_bfloat16():
    """The embedded model on CUDA in bfloat16."""
    return _load("bfloat16")


def assert_lossless(model, block_size: int, path: str = "") -> None:
    """Every speculative schedule gives AR's tokens and stop reason on :data:`PROMPTS` (a failure names the first
    difference and AR's margin there)."""
    config = DecodeConfig(block_size=block_size, max_new_tokens=NEW_TOKENS)
    for text in PROMPTS:
        prompt = model.encode(text)
        ar = generate(model, prompt, config, "ar")
        for name in SPECULATIVE:
            run = generate(model, prompt, config, name)
            found = divergence(model, prompt, ar.token_ids, run.token_ids)
            if found is not None:
                pytest.fail(f"{name} (B={block_size}){path} differs from AR on {text!r}: {found.verdict()}")
            assert run.stop_reason == ar.stop_reason


@pytest.mark.parametrize("block_size", [4, 8])
def test_float32_speculative_schedules_equal_ar(cuda_float32, block_size):
    assert_lossless(cuda_float32, block_size)


def test_the_default_on_cuda_is_the_graph_path(cuda_float32):
    assert cuda_float32.path == "native" and cuda_float32.graphs, cuda_float32.compile_note
    assert cuda_float32.path_note is None


@pytest.mark.parametrize("block_size", [4, 8])
def test_float32_speculative_schedules_equal_ar_on_transformers_forward(block_size):
    model = _load("float32", path="transformers")
    assert model.path == "transformers" and not model.compiled
    assert_lossless(model, block_size, " on transformers' forward")


@pytest.mark.parametrize("attention", ["written", "sdpa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_graph_path_logits_equal_transformers_forward(dtype, attention):
    """A prefill, then verify calls of 1 and 8 rows at growing lengths, on both forwards: float32 to rounding;
    bfloat16 and float16 within 3% of the logits' largest magnitude (the two forwards round in different kernels).
    Each way the graph path can attend: SDPA runs the memory-efficient kernel (or the math one: sdpa_backends pins
    them, never cuDNN's), whose outputs this checks too."""
    from packed_ss.layout import prefill_layout, verify_layout

    graphs, reference = _load(dtype), _load(dtype, path="transformers")
    graphs.static.graph_attention = attention  # before any call: its graphs are recorded attending so
    got = {}
    for model in (graphs, reference):
        model.reset(300, block_size=8)
        first = prefill_layout(list(range(3, 40)), 0, model.mask_token_id)
        outputs = [model.forward(first, first.verify_rows).logits]
        for step in range(4):
            length = model.cache_length
            layout = verify_layout([5 + step], [6] * (7 if step % 2 else 0), length)
            outputs.append(model.forward(layout, layout.verify_rows).logits.float().cpu())
        got[id(model)] = outputs[1:]
    assert graphs.graphs and graphs.static.shapes, graphs.compile_note
    for a, b in zip(got[id(graphs)], got[id(reference)], strict=True):
        if dtype == "float32":
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)
        else:
            assert (a - b).abs().max() <= 0.03 * b.abs().max(), ((a - b).abs().max(), b.abs().max())


@pytest.mark.parametrize("block_size", [4, 8])
def test_bfloat16_graph_path_leaves_ar_only_at_near_ties(cuda_bfloat16, block_size):
    """In bfloat16 a lossless schedule may leave AR's output where AR's top two logits (from a no-cache forward in
    the same dtype) are within the dtype's near-tie threshold; anywhere else it is a bug."""
    model = cuda_bfloat16
    assert model.graphs, model.compile_note
    config = DecodeConfig(block_size=block_size, max_new_tokens=NEW_TOKENS)
    for text in PROMPTS:
        prompt = model.encode(text)
        ar = generate(model, prompt, config, "ar")
        for name in SPECULATIVE:
            found = divergence(model, prompt, ar.token_ids, generate(model, prompt, config, name).token_ids)
            assert found is None or found.near_tie, f"{name} (B={block_size}) on {text!r}: {found.verdict()}"


def test_a_collected_adapters_graphs_serve_the_next_adapter():
    """The next adapter's run of the same capacity takes the cache a collected adapter left, with its CUDA graphs
    (graphs.SpareCaches), from an emptied length: the same tokens, and no new recording."""
    import gc

    model = _load("float32")
    prompt, config = model.encode(PROMPTS[0]), DecodeConfig(block_size=8, max_new_tokens=NEW_TOKENS)
    first = model.share()
    want = generate(first, prompt, config, "packed").token_ids
    cache, recorded = first.static.cache, list(first.static.shapes)
    del first
    gc.collect()
    second = model.share()
    assert generate(second, prompt, config, "packed").token_ids == want
    assert second.static.cache is cache and second.static.shapes == recorded and second.static.compile_s == 0.0


@pytest.mark.parametrize("name", list(REGISTRY))
def test_bfloat16_runs_are_well_formed(cuda_bfloat16, name):
    model = cuda_bfloat16
    config = DecodeConfig(block_size=8, max_new_tokens=NEW_TOKENS)
    for text in PROMPTS:
        run = generate(model, model.encode(text), config, name)
        assert run.stop_reason in ("eos", "limit")
        assert 1 <= run.tokens <= NEW_TOKENS
        assert all(0 <= t < len(model.tokenizer) for t in run.token_ids)
        assert model.mask_token_id not in run.token_ids
        times = [call.model_ms for record in run.records for call in record.calls]
        assert len(times) == run.nfe and all(ms > 0 for ms in times)


def test_float32_cache_after_packed_run_equals_a_fresh_forward(cuda_float32):
    from transformers import DynamicCache

    model = cuda_float32
    prompt = model.encode(PROMPTS[0])
    run = generate(model, prompt, DecodeConfig(block_size=8, max_new_tokens=NEW_TOKENS), "packed")
    ids = prompt + list(run.token_ids)
    cached = model.cache_length
    assert cached == len(ids) - 1  # the verified prefix minus its last token
    reference = DynamicCache(config=model.model.config)
    with torch.no_grad():
        model.model(input_ids=torch.tensor([ids[:cached]], device=model.device), past_key_values=reference,
                    use_cache=True)
    for (keys, values), ref_layer in zip(model.cached_kv(), reference.layers, strict=True):
        torch.testing.assert_close(keys, ref_layer.keys, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(values, ref_layer.values, atol=1e-4, rtol=1e-4)


# --- the graph path (issue 55): native calls replayed as CUDA graphs ----------------------------------------------
def _graph_model(dtype: str = "float32"):
    from packed_ss.models import DualModeModel

    return DualModeModel.from_pretrained(EMBEDDED, device="cuda", dtype=dtype, path="native", compiled=True)


@pytest.mark.parametrize("attention", ["written", "sdpa"])
@pytest.mark.parametrize("block_size", [4, 8])
def test_graph_path_schedules_equal_ar_in_float32(block_size, attention):
    model = _graph_model()
    model.static.graph_attention = attention  # before any call: its graphs are recorded attending so
    assert model.path == "native" and model.compiled, model.compile_note
    assert_lossless(model, block_size, " on graphs")
    assert model.compiled and model.static.shapes, model.compile_note  # graphs were recorded and kept


def test_graph_replays_equal_eager_calls_at_growing_lengths_and_after_rollback():
    from packed_ss.layout import prefill_layout, verify_layout

    graphs, eager = _graph_model(), _graph_model().share(compiled=False)
    for model in (graphs, eager):
        model.reset(300, block_size=8)
        first = prefill_layout(list(range(3, 40)), 0, model.mask_token_id)
        model.forward(first, first.verify_rows)
    outputs = {}
    for model in (graphs, eager):
        got = []
        for step in range(6):  # growing cache lengths, then a rollback and the same call again
            length = model.cache_length
            layout = verify_layout([5], [6] * 7, length)
            got.append(model.forward(layout, layout.verify_rows).logits.float().cpu())
            if step == 3:
                model.rollback(length)
        outputs[id(model)] = got
    for a, b in zip(outputs[id(graphs)], outputs[id(eager)]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    # another capacity: a new cache and its own graphs (the first cache goes to the network's spares)
    again = []
    for model in (graphs, eager):
        model.reset(1000, block_size=8)
        first = prefill_layout(list(range(3, 40)), 0, model.mask_token_id)
        model.forward(first, first.verify_rows)
        layout = verify_layout([5], [6] * 7, model.cache_length)
        again.append(model.forward(layout, layout.verify_rows).logits.float().cpu())
    assert graphs.graphs and graphs.static.capacity == 1024, graphs.compile_note
    torch.testing.assert_close(again[0], again[1], rtol=1e-4, atol=1e-4)


def test_the_drafter_lora_on_graphs_equals_transformers_forward_with_peft(nld_dir):
    """The tiny NLD checkpoint with its drafter LoRA in float32 on CUDA: a gated, an ungated and an adapter-off call
    replayed from graphs give transformers' logits with peft's LoRA and the row-gate hooks."""
    from test_graphs import _lora_calls

    from packed_ss.models import DualModeModel

    load = dict(device="cuda", dtype="float32", drafter_lora="linear_spec_lora")
    graphs = DualModeModel.from_pretrained(nld_dir, **load)
    reference = DualModeModel.from_pretrained(nld_dir, path="transformers", **load)
    assert graphs.path == "native" and graphs.graphs, graphs.compile_note
    for a, b in zip(_lora_calls(graphs), _lora_calls(reference), strict=True):
        torch.testing.assert_close(a.float().cpu(), b.float().cpu(), rtol=1e-4, atol=1e-3)
    assert any(key[3] for key in graphs.static._graphs)  # the gated calls replayed graphs of their own


@pytest.mark.parametrize("attention,bound", [("sdpa", 27), ("written", 32)])
def test_a_graph_path_layer_launches_about_the_kernels_counted_on_the_host(attention, bound):
    """packed_ss.models.op_count counts a layer of the graph path's form on the host (21 operators with sdpa, 26
    written out, bfloat16). On CUDA: a 2-layer model's kernels less a 1-layer model's, for one eager call of 16 rows
    in that form. The bound allows cuBLAS a split-K reduction per GEMM and two more; rms_norm or SDPA falling back
    to their many-kernel forms (the math backend, the composite norm) would exceed it."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from transformers import LlamaConfig, LlamaForCausalLM

    from packed_ss.models.native import native_decoder

    kernels = []
    for layers in (1, 2):
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                             num_attention_heads=8, num_key_value_heads=2, head_dim=32)
        decoder = native_decoder(LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval())
        rows, capacity = 16, 256
        cache = torch.zeros(layers, 2, 2, capacity, 32, dtype=torch.bfloat16, device="cuda")
        ids = torch.arange(rows, device="cuda")
        positions = 40 + ids  # the rows' cache slots too
        bias = torch.zeros(rows, capacity, device="cuda")
        with torch.no_grad():
            decoder(ids, positions, bias, cache, False, None, attention, None, positions)  # untimed: set-up kernels
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as found:
                decoder(ids, positions, bias, cache, False, None, attention, None, positions)
                torch.cuda.synchronize()
        kernels.append(sum(e.count for e in found.key_averages() if e.device_type == DeviceType.CUDA))
    assert kernels[0] > 0 and kernels[1] > kernels[0], kernels  # a profiler that recorded nothing proves nothing
    assert kernels[1] - kernels[0] <= bound, kernels


@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_setdlm_on_the_graph_path_decodes_as_transformers_forward(tmp_path, order):
    """A Qwen3 network with a tied head and q/k norms (the SetDLM fixture) on CUDA in float64 (no near-ties, so
    the confidence order cannot break a tie the other way): every any-order schedule gives transformers' tokens on
    the graph path, past SetDLM's context (the left crop)."""
    from helpers import write_setdlm_checkpoint
    from test_setdlm import PROMPT

    from packed_ss.models import DualModeModel

    write_setdlm_checkpoint(tmp_path)
    graphs = DualModeModel.from_pretrained(tmp_path, device="cuda", dtype="float64")
    reference = DualModeModel.from_pretrained(tmp_path, device="cuda", dtype="float64", path="transformers")
    assert graphs.path == "native" and graphs.graphs, graphs.compile_note
    config = DecodeConfig(block_size=5, max_new_tokens=60, order=order)
    for name in ["ar", *SPECULATIVE, "diffusion"]:
        want = generate(reference, PROMPT, config, name)
        assert generate(graphs, PROMPT, config, name).token_ids == want.token_ids, (name, order)
    assert graphs.graphs and graphs.static.shapes, graphs.compile_note


# --- the graph path's edges (issue 64): long caches, sampling, a capture out of memory ----------------------------
def _random_llama(positions: int = 4096, dtype: torch.dtype = torch.float32):
    """A randomly initialised 2-layer Llama network on CUDA with ``positions`` positions, on the graph path."""
    from helpers import tiny_tokenizer
    from transformers import LlamaConfig, LlamaForCausalLM

    from packed_ss.models import DualModeModel

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=positions,
                         tie_word_embeddings=False)
    network = LlamaForCausalLM(config).to("cuda", dtype).eval()
    return DualModeModel(network, tiny_tokenizer(256), mask_token_id=1, eos_token_id=None, path="native",
                         compiled=True)


@pytest.mark.parametrize("attention", ["written", "sdpa"])
def test_graph_replays_equal_eager_calls_past_2048_cached_keys(attention):
    """A cache of capacity 2304 holding 2100-2150 tokens: each replayed verify call's logits (float32) equal the eager
    call's, for either attention (kernels may tile differently past 2048 keys)."""
    from packed_ss.layout import prefill_layout, verify_layout

    graphs = _random_llama()
    eager = graphs.share(compiled=False)
    got = {}
    for model in (graphs, eager):
        model.static.graph_attention = attention  # before any call: its graphs are recorded attending so
        model.reset(2304, block_size=8)
        assert model.static.capacity >= 2304
        first = prefill_layout([3 + i % 250 for i in range(2100)], 0, model.mask_token_id)
        model.forward(first, first.verify_rows)
        outputs = []
        for step in range(6):
            layout = verify_layout([5 + step], [6 + step] * 7, model.cache_length)
            outputs.append(model.forward(layout, layout.verify_rows).logits.float().cpu())
        assert model.cache_length > 2048
        got[id(model)] = outputs
    assert graphs.graphs and graphs.static.shapes, graphs.compile_note
    assert all(capacity >= 2304 for _, capacity in graphs.static.shapes), graphs.static.shapes
    for a, b in zip(got[id(graphs)], got[id(eager)], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_sampled_runs_on_graphs_equal_eager_runs_at_the_same_seed():
    """T > 0: the embedded model in float64 (no near-ties between the two paths' roundings), each schedule's sampled
    tokens at a seed on the graph path equal the eager native calls' at that seed."""
    from packed_ss.models import DualModeModel

    graphs = DualModeModel.from_pretrained(EMBEDDED, device="cuda", dtype="float64", path="native", compiled=True)
    eager = graphs.share(compiled=False)
    for seed in (0, 1):
        config = DecodeConfig(block_size=8, max_new_tokens=NEW_TOKENS, temperature=1.0, seed=seed)
        for text in PROMPTS[:2]:
            prompt = graphs.encode(text)
            for name in ["ar", *SPECULATIVE]:
                want = generate(eager, prompt, config, name).token_ids
                assert generate(graphs, prompt, config, name).token_ids == want, (name, seed, text)
    assert graphs.graphs and graphs.static.shapes, graphs.compile_note


def test_a_recording_out_of_gpu_memory_falls_back_to_eager_calls_and_leaves_the_allocator_usable():
    """A real out of memory: the process's memory fraction set to what torch's allocator holds already, so that the
    recording (its warm-up on the capture stream or the capture into the graphs' pool, neither of which can use the
    blocks cached for the default stream) cannot get memory, while the eager calls reuse the blocks an identical
    eager run left. After a second try, that shape's calls run eagerly: the run completes with that run's tokens,
    the note says why, and afterwards the allocator empties its cache and serves a fresh allocation."""
    model = _graph_model()
    prompt, config = model.encode(PROMPTS[0]), DecodeConfig(block_size=8, max_new_tokens=NEW_TOKENS)
    want = generate(model.share(compiled=False), prompt, config, "packed").token_ids  # its blocks stay cached
    model.reset(len(prompt) + NEW_TOKENS, block_size=8)  # the run's cache (one capacity step), before the limit
    cache = model.static.cache
    torch.cuda.synchronize()
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        torch.cuda.set_per_process_memory_fraction(torch.cuda.memory_reserved() / total)
        run = generate(model, prompt, config, "packed")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert model.static.cache is cache  # the run's own cache, allocated before the limit
    assert run.token_ids == want
    assert "out of GPU memory" in (model.compile_note or ""), model.compile_note
    assert getattr(model.static._recorder, "too_large", None), "the shape that ran out of memory is served eagerly"
    torch.cuda.empty_cache()
    fresh = torch.ones(64 << 20, device="cuda")  # 256 MiB
    assert fresh.sum().item() == 64 << 20


def test_a_model_loaded_for_one_visitor_records_its_graphs_at_the_gate_while_another_computes():
    """Real captures beside real calls: a server's visitor loads the embedded model in bfloat16 (its warm-up records
    graphs) while another visitor's runs compute on the float32 one the whole time. Every capture takes a turn of the
    compute gate, so neither fails ("operation not permitted when stream is capturing"), both keep their graphs, and
    the visitor's tokens stay those of its first run."""
    import threading

    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    store = ModelStore(str(EMBEDDED), device="cuda", dtype="float32")
    tasks = GpuTasks(store, ComputeGate())
    first = store.get("")
    assert first.graphs, first.compile_note
    prompt, config = first.encode(PROMPTS[0]), DecodeConfig(block_size=8, max_new_tokens=24)
    want = tasks.generate(("", ""), prompt, config, "packed").token_ids
    done, errors, runs = threading.Event(), [], []

    def visitor():
        try:
            while not done.is_set():
                runs.append(tasks.generate(("", ""), prompt, config, "packed").token_ids)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    other = threading.Thread(target=visitor)
    other.start()
    try:
        loaded = store.get("", "bfloat16")
    finally:
        done.set()
        other.join()
    assert not errors, errors
    assert runs and all(tokens == want for tokens in runs)
    assert loaded.graphs and first.graphs and loaded.compile_note is None, loaded.compile_note
    run = tasks.generate(("", "bfloat16"), prompt, config, "packed")
    assert run.recorded_s == 0.0 and run.tokens > 0  # its shapes were recorded before its clock
