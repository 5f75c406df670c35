"""The native forward (packed_ss.models.native) against transformers' on every family it serves, and where it
falls back to transformers' forward."""

from __future__ import annotations

import pytest
import torch

from helpers import tiny_llama, tiny_tokenizer
from packed_ss import DecodeConfig, generate
from packed_ss.layout import packed_layout, prefill_layout, quadratic_layout, verify_layout
from packed_ss.models import DualModeModel
from packed_ss.models.errors import ModelLoadError
from packed_ss.models.native import COMPILE_OPTIONS, TUNED_DTYPES, native_problem


def _tiny(kind: str, seed: int = 0):
    """A random float64 network of a served type: GQA, biases on q/k/v (qwen2), per-head q/k norms (qwen3)."""
    import transformers

    torch.manual_seed(seed)
    shared = dict(vocab_size=24, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False)
    config = {"llama": lambda: transformers.LlamaConfig(**shared),
              "mistral": lambda: transformers.MistralConfig(**shared, sliding_window=None),
              "qwen2": lambda: transformers.Qwen2Config(**shared, use_sliding_window=False),
              "qwen3": lambda: transformers.Qwen3Config(**shared, head_dim=8, use_sliding_window=False)}[kind]()
    config._attn_implementation = "sdpa"
    model = transformers.AutoModelForCausalLM.from_config(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0, 0.5)  # freshly made biases are zero: make them count
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
        model.lm_head.weight.mul_(3.0)
    return model, tiny_tokenizer(24)


def _pair(model, tokenizer, mask_id=1, eos=0, bos=None):
    native = DualModeModel(model, tokenizer, mask_id, eos, bos, path="native")
    reference = DualModeModel(model, tokenizer, mask_id, eos, bos, path="transformers")
    assert native.path == "native" and reference.path == "transformers"
    return native, reference


def _same_calls(native, reference, prompt: list[int], tolerance: float):
    """The same call sequence on both adapters (prefill with masks, Packed-SS, a rollback, Quadratic-SS with deferred
    branch rows, a verification with an uncached tail, a cache growth): logits, deferred states and caches agree."""
    mask = native.mask_token_id
    tol = dict(rtol=tolerance, atol=tolerance)

    def both(layout, rows, deferred=()):
        a, b = native.forward(layout, rows, deferred), reference.forward(layout, rows, deferred)
        torch.testing.assert_close(a.logits, b.logits, **tol)
        if deferred:
            torch.testing.assert_close(native.head(a.deferred).logits, reference.head(b.deferred).logits, **tol)
        for (ka, va), (kb, vb) in zip(native.cached_kv(), reference.cached_kv()):
            torch.testing.assert_close(ka, kb, **tol)
            torch.testing.assert_close(va, vb, **tol)
        return a

    for model in (native, reference):
        model.reset(len(prompt) + 8, block_size=4)  # small: the last call grows the cache
    layout = prefill_layout(prompt, 4, mask)
    both(layout, layout.verify_rows + layout.draft_rows)
    for model in (native, reference):
        model.rollback(len(prompt) - 1)
    cached = len(prompt) - 1
    layout = packed_layout(prompt[-1], [5, 6, 7], 3, cached, mask)
    both(layout, layout.verify_rows + layout.draft_rows)
    for model in (native, reference):
        model.rollback(cached + 2)  # h = 1 accepted
    cached += 2
    layout = quadratic_layout(6, [8, 9, 10], 3, cached, mask)
    both(layout, layout.verify_rows, layout.branch_rows[2])
    for model in (native, reference):
        model.rollback(cached + 1)
    cached += 1
    tail = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    layout = verify_layout(tail, [3, 4], cached)
    both(layout, layout.verify_rows)
    assert native.cache_length == reference.cache_length == cached + len(tail) + 2


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2", "qwen3"])
def test_native_calls_equal_transformers_on_each_served_type(kind):
    model, tokenizer = _tiny(kind)
    assert native_problem(model) is None
    native, reference = _pair(model, tokenizer)
    _same_calls(native, reference, [2, 3, 4, 5, 6, 7, 8], 1e-10)


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("attention", ["written", "sdpa"])
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_each_call_form_equals_transformers(kind, attention, in_place):
    """Both call forms: keys and values written into the cache inside the call, each layer attending over the cache
    alone (eager calls; every call of the graph path, issue 55), or the cache only read, the call's own keys
    attended apart (torch.compile's calls). Same call sequence as above: logits, deferred rows and caches agree with
    transformers' forward. (The graph path's fused RMSNorm: the test below.)"""
    model, tokenizer = _tiny(kind, seed=1)
    native, reference = _pair(model, tokenizer)
    native.static.in_place, native.static.attention = in_place, attention
    _same_calls(native, reference, [2, 3, 4, 5, 6, 7, 8], 1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_fused_rmsnorm_rounds_as_transformers_does(dtype):
    """transformers rounds the normalised hidden state to the model's dtype before the weight multiplies it; so does
    the fused form. On the CPU torch's rms_norm runs the same operations, so the logits are bitwise the same (a
    weight passed into rms_norm would be multiplied before the rounding: other bits in half precision)."""
    from packed_ss.models.native import native_decoder

    model, _ = _tiny("qwen3", seed=2)
    model = model.to(dtype)
    decoder = native_decoder(model)
    ids, positions = torch.tensor([3, 4, 5, 6, 7]), torch.arange(5)
    bias = torch.triu(torch.full((5, 5), float("-inf")), 1)
    cache = torch.zeros(2, 2, 2, 8, 8, dtype=dtype)
    found = []
    for fused in (False, True):
        decoder.fused_norm = fused
        with torch.no_grad():
            found.append(decoder(ids, positions, bias, cache)[0])
    assert torch.equal(found[0], found[1])


def test_native_calls_equal_transformers_on_the_nld_format(nld_dir):
    """Ministral3 (NLD's layout): yarn RoPE, GQA and Llama-4 query scaling, which this fixture starts at position
    64: the prompt crosses it."""
    loaded = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64")
    assert loaded.path == "native" and loaded.path_note is None
    native, reference = _pair(loaded.model, loaded.tokenizer, loaded.mask_token_id, loaded.eos_token_id,
                              loaded.bos_token_id)
    prompt = [1] + [20 + i % 60 for i in range(70)]
    _same_calls(native, reference, prompt, 1e-10)


def test_native_calls_equal_transformers_on_the_shipped_model():
    """The embedded model in its own float32: sums run in another order, so agreement is to float32 rounding."""
    from conftest import EMBEDDED

    native = DualModeModel.from_pretrained(EMBEDDED, device="cpu")
    assert native.path == "native" and native.dtype == torch.float32
    reference = DualModeModel(native.model, native.tokenizer, native.mask_token_id, native.eos_token_id,
                              path="transformers")
    _same_calls(native, reference, native.encode("def add(a, b):\n    return a + b\n\n\ndef mul(a, b):"), 2e-4)


@pytest.mark.parametrize("name", ["ar", "linear", "quadratic", "packed", "packed-mixed", "partial", "lookup"])
def test_every_schedule_on_the_native_path_gives_transformers_paths_tokens(embedded_model, name):
    reference = DualModeModel(embedded_model.model, embedded_model.tokenizer, embedded_model.mask_token_id,
                              embedded_model.eos_token_id, path="transformers")
    assert embedded_model.path == "native"
    prompt = embedded_model.encode("import os\n\n\ndef walk(path):\n")
    config = DecodeConfig(block_size=5, max_new_tokens=40)
    ar = generate(reference, prompt, config, "ar").token_ids
    assert generate(embedded_model, prompt, config, name).token_ids == ar
    assert generate(reference, prompt, config, name).token_ids == ar


@pytest.mark.slow
def test_the_compiled_native_path_in_float32_tunes_its_gemms_and_gives_the_eager_paths_tokens():
    """float32 is compiled with COMPILE_OPTIONS (frozen weights, GEMMs chosen by measurement): AR's tokens equal the
    eager native path's, with one shape (decode calls of one row). Every schedule on the compiled native path is
    checked in float64 by test_static (one compiled shape costs seconds of compiling, so one shape here)."""
    import torch._inductor.config

    with torch._inductor.config.patch(COMPILE_OPTIONS):  # every setting is one inductor knows
        pass
    eager = tiny_llama(seed=4, logit_scale=3.0)
    eager.model.float()
    compiled = DualModeModel(eager.model, eager.tokenizer, 1, 0, compiled=True)
    assert compiled.path == "native" and compiled.compiled and next(compiled.model.parameters()).dtype in TUNED_DTYPES
    prompt = [2, 3, 4, 5, 6, 7]
    config = DecodeConfig(block_size=4, max_new_tokens=16)
    assert generate(compiled, prompt, config, "ar").token_ids == generate(eager, prompt, config, "ar").token_ids
    assert compiled.compiled and compiled.compile_note is None
    assert {rows for rows, _ in compiled.static.shapes} == {1}


def test_the_dynamic_cache_keeps_transformers_forward_and_an_any_order_model_or_a_drafter_lora_does_not(
        nld_dir, tiny_any_order_dir):
    with_lora = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64", drafter_lora="linear_spec_lora")
    assert with_lora.path == "native" and with_lora.path_note is None  # the native forward applies the adapter
    projection = with_lora.model.model.layers[0].self_attn.o_proj
    projection.lora_dropout["drafter"] = torch.nn.Dropout(0.1)  # a LoRA the native forward does not compute
    assert "DoRA, biases or dropout" in native_problem(with_lora.model)
    any_order = DualModeModel.from_pretrained(tiny_any_order_dir, device="cpu")
    assert any_order.path == "native" and any_order.path_note is None  # its layouts are masks and positions too
    dynamic = DualModeModel.from_pretrained(nld_dir, device="cpu", cache="dynamic")
    assert dynamic.path == "transformers" and "dynamic cache" in dynamic.path_note
    chosen = DualModeModel.from_pretrained(nld_dir, device="cpu", path="transformers")
    assert chosen.path == "transformers" and chosen.path_note is None  # asked for: nothing to explain
    with pytest.raises(ModelLoadError, match="--path must be one of auto, native, transformers"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", path="fast")


def test_a_model_type_it_does_not_serve_is_named():
    import transformers

    config = transformers.GPT2Config(vocab_size=24, n_embd=32, n_layer=1, n_head=4)
    assert "model type 'gpt2' has no native forward" in native_problem(transformers.GPT2LMHeadModel(config))


def test_the_cli_says_in_one_line_why_the_native_forward_is_not_used(nld_dir, capsys):
    from packed_ss.cli import main

    code = main(["generate", "--model", str(nld_dir), "--cache", "dynamic", "--prompt", "w5 w6",
                 "--max-new-tokens", "4", "--schedule", "packed"])
    err = capsys.readouterr().err
    assert code == 0 and err.count("transformers' forward: the dynamic cache is transformers' own") == 1
    code = main(["generate", "--model", str(nld_dir), "--cache", "dynamic", "--prompt", "w5 w6", "--path", "native"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "native forward cannot serve this model" in err[0]


def test_the_fused_projections_are_held_once():
    """The native forward's fused q|k|v and gate|up matrices were copies (the projection weights twice in memory);
    now the network's own q, k, v, gate and up weights are views of them, and transformers' forward still gives the
    same logits."""
    import torch

    from helpers import tiny_llama
    from packed_ss.models.native import native_decoder

    model = tiny_llama(seed=3, path="transformers")
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        before = model.model(ids).logits
    decoder = native_decoder(model.model)
    for layer, fused in zip(model.model.model.layers, decoder.layers):
        storage = fused.qkv.untyped_storage().data_ptr()
        attention = layer.self_attn
        assert all(p.weight.untyped_storage().data_ptr() == storage
                   for p in (attention.q_proj, attention.k_proj, attention.v_proj))
        assert all(p.weight.untyped_storage().data_ptr() == fused.gate_up.untyped_storage().data_ptr()
                   for p in (layer.mlp.gate_proj, layer.mlp.up_proj))
    with torch.no_grad():
        after = model.model(ids).logits
    assert torch.equal(before, after)


def test_without_a_cuda_device_graph_calls_say_why_and_run_eagerly():
    """The graph path (issue 55) on a model that is not on a CUDA device: one line naming why, and the calls still
    run (eager native calls) with the logits of the eager path."""
    import torch

    from helpers import tiny_llama
    from packed_ss.layout import prefill_layout
    from packed_ss.models.graphs import GraphCalls, graph_problem

    assert "CUDA device" in graph_problem(torch.device("cpu"))
    model = tiny_llama(seed=4)
    calls = GraphCalls(model.model, False, compiled=True)
    assert not calls.compiled and "CUDA graphs off" in calls.note and "CUDA device" in calls.note
    eager = model.share(compiled=False)
    for adapter in (eager,):
        adapter.reset(64, block_size=4)
    calls.reset(64, block_size=4)
    layout = prefill_layout([3, 4, 5, 6], 0, 1)
    prepared = calls.prepare(layout)
    out, _ = calls.execute(prepared, tuple(range(layout.rows)))
    reference = eager.forward(layout, tuple(range(layout.rows))).logits
    torch.testing.assert_close(out, reference)


def test_a_graph_path_layer_launches_about_half_the_kernels_of_the_cpus():
    """Issue 55: at 1-64 rows a layer's small kernels cost about what its GEMMs do, so the graph path's call form
    keeps them few. Upper bounds on the counted operators per layer (packed_ss.models.op_count): a change that adds
    one to a layer has to raise them on purpose."""
    from packed_ss.models.op_count import COMPILED_FORM, GRAPH_FORMS, operations_per_layer

    cpu = operations_per_layer(COMPILED_FORM)
    graphs = {form.attention: operations_per_layer(form) for form in GRAPH_FORMS}
    assert cpu["mm"] == graphs["written"]["mm"] == graphs["sdpa"]["mm"] == 4  # q|k|v, o, gate|up, down
    assert sum(graphs["sdpa"].values()) <= 21 and sum(graphs["written"].values()) <= 26
    assert sum(cpu.values()) - sum(graphs["sdpa"].values()) >= 20
    assert graphs["sdpa"]["rms_norm"] == 2 and not graphs["sdpa"]["rsqrt"]  # one fused kernel per norm
    assert graphs["sdpa"]["cat"] == 1 and graphs["sdpa"]["stack"] == 1  # RoPE's halves, the keys with the values


def test_compiled_calls_asked_to_write_in_place_still_give_the_eager_calls_tokens():
    """torch.compile's calls keep the cache read-only by default (in place they were slower here); asked to write in
    place they must still be right: the mask has no columns for the call's own rows then, and the compiled forward
    has to get the slots."""
    from helpers import tiny_llama

    eager = tiny_llama(seed=8, logit_scale=3.0)
    compiled = tiny_llama(seed=8, logit_scale=3.0, compiled=True)
    read_only = compiled.share()  # the same network and compiled function, in the default form
    compiled.static.in_place = True
    prompt, config = [4, 9, 2, 7], DecodeConfig(block_size=4, max_new_tokens=6)
    expected = generate(eager, prompt, config, "ar").token_ids
    for model in (compiled, read_only, compiled):  # each form a compiled variant of its own, both kept
        assert generate(model, prompt, config, "ar").token_ids == expected
    for model in (compiled, read_only):
        assert model.compiled and model.compile_note is None and model.static.shapes, model.compile_note


def test_a_network_turned_float32_after_its_decoder_was_made_gets_a_float32_decoder_and_loses_what_was_compiled():
    """The decoder keeps fused copies of the weights: a network turned float32 (or edited in place) after its first
    adapter had kept the float64 copies, so its float32 calls, compiled or not, ran in float64."""
    from packed_ss.models.native import NATIVE_COMPILED, native_decoder

    made = tiny_llama(seed=7)
    assert native_decoder(made.model).embed.dtype == torch.float64
    object.__setattr__(made.model, NATIVE_COMPILED, "compiled from the float64 copies")
    made.model.float()
    again = DualModeModel(made.model, made.tokenizer, 1, 0)
    assert again.static.native.embed.dtype == torch.float32
    assert getattr(made.model, NATIVE_COMPILED, None) is None
    first = native_decoder(made.model)
    assert native_decoder(made.model) is first  # unchanged weights: the same decoder
    with torch.no_grad():
        made.model.lm_head.weight.mul_(2.0)  # an in-place edit of a weight
    assert native_decoder(made.model) is not first
    logits = again.forward(prefill_layout([2, 3, 4], 0, 1), (2,)).logits
    reference = DualModeModel(made.model, made.tokenizer, 1, 0, path="transformers")
    torch.testing.assert_close(logits, reference.forward(prefill_layout([2, 3, 4], 0, 1), (2,)).logits,
                               rtol=1e-5, atol=1e-5)
