"""Model families: Nemotron-Labs-Diffusion loaded natively from its own on-disk format (no remote code),
strict weight mapping, and the proposal-only drafter LoRA (paper Appendix F.2)."""

import json
import shutil

import pytest
import torch
from helpers import NLD_BOS_ID, NLD_EOS_ID, NLD_MASK_ID, write_lora_adapter, write_nld_checkpoint
from safetensors.torch import load_file

from packed_ss import DecodeConfig, generate
from packed_ss.layout import packed_layout, prefill_layout
from packed_ss.models import DualModeModel, ModelLoadError
from packed_ss.schedules import SPECULATIVE


def test_nld_is_detected_and_every_tensor_lands_under_its_mapped_name(nld_dir, nld_model):
    assert nld_model.family == "nemotron"
    assert type(nld_model.model).__name__ == "Ministral3ForCausalLM"
    assert (nld_model.mask_token_id, nld_model.eos_token_id, nld_model.bos_token_id) == (NLD_MASK_ID, NLD_EOS_ID,
                                                                                          NLD_BOS_ID)
    assert not list(nld_dir.glob("*.py")), "the fixture ships no remote code, so none can have run"
    stored = load_file(str(nld_dir / "model.safetensors"))
    loaded = nld_model.model.state_dict()
    assert torch.equal(loaded["lm_head.weight"], stored["diffusion_head.weight"].double())
    for name, tensor in stored.items():
        mapped = "lm_head.weight" if name == "diffusion_head.weight" else "model." + name[len("encoder."):]
        assert torch.equal(loaded[mapped], tensor.double()), name
    assert nld_model.encode("w5 w6") == [NLD_BOS_ID, 5, 6]
    assert NLD_MASK_ID in nld_model.never_emit_ids


def test_a_forced_family_that_does_not_fit_is_refused_at_load(nld_dir, tiny_model_dir):
    """Forcing NLD on a Llama folder, or the plain loader on NLD (whose config points to remote code), fails at
    once with a message, never later in a call, and never asks whether to run a checkpoint's code."""
    with pytest.raises(ModelLoadError, match="is this an NLD checkpoint"):
        DualModeModel.from_pretrained(tiny_model_dir, device="cpu", family="nemotron")
    with pytest.raises(ModelLoadError, match="declares remote code"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", family="plain")


def test_family_can_be_forced_and_unknown_family_is_refused(nld_dir):
    with pytest.raises(ModelLoadError, match="unknown model family 'llama'"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", family="llama")
    forced = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64", family="nemotron")
    assert forced.family == "nemotron"


@pytest.mark.parametrize("rename,named", [
    ({"encoder.layers.1.mlp.up_proj.weight": "encoder.layers.1.mlp.upp_proj.weight"}, "upp_proj"),
    ({"diffusion_head.weight": "lm_head_extra.weight"}, "lm_head"),
])
def test_a_checkpoint_with_a_renamed_tensor_is_refused_with_the_key_named(tmp_path, rename, named):
    write_nld_checkpoint(tmp_path, rename=rename)
    with pytest.raises(ModelLoadError, match="do not all map") as error:
        DualModeModel.from_pretrained(tmp_path, device="cpu")
    assert named in str(error.value) and "missing" in str(error.value)


def test_a_plain_checkpoint_missing_a_tensor_is_refused(tiny_model_dir, tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "broken"
    shutil.copytree(tiny_model_dir, folder)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["model.norm.weight"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match="model.norm.weight"):
        DualModeModel.from_pretrained(folder, device="cpu")


def test_nld_greedy_speculative_runs_equal_ar_across_the_query_scaling_position(nld_model):
    """Every speculative schedule returns AR's tokens; prompts end near position 64, where the fixture's
    Llama-4 query scaling starts, so shared positions in packed calls are exercised across it."""
    gen = torch.Generator().manual_seed(0)
    for length in (3, 50, 62):
        prompt = [NLD_BOS_ID] + torch.randint(20, 90, (length,), generator=gen).tolist()
        ref = generate(nld_model, prompt, DecodeConfig(max_new_tokens=24), "ar")
        for block in (2, 4, 8):
            for name in SPECULATIVE:
                run = generate(nld_model, prompt, DecodeConfig(block_size=block, max_new_tokens=24), name)
                assert run.token_ids == ref.token_ids, (name, block, length)


@pytest.mark.parametrize("name", SPECULATIVE)
def test_nld_cache_equals_a_fresh_forward_and_rows_match_table_2(nld_model, name):
    from packed_ss import decode
    from transformers import DynamicCache

    prompt, block = [NLD_BOS_ID, 30, 31, 32], 4
    generated = []
    for record in decode(nld_model, prompt, DecodeConfig(block_size=block, max_new_tokens=20), name):
        generated += record.appended
        ids = (prompt + generated)[: nld_model.cache_length]
        assert nld_model.cache_length == len(prompt + generated) - 1
        ref = DynamicCache(config=nld_model.model.config)
        with torch.no_grad():
            nld_model.model(input_ids=torch.tensor([ids]), past_key_values=ref, use_cache=True)
        for (keys, _), ref_layer in zip(nld_model.cached_kv(), ref.layers, strict=True):
            assert torch.allclose(keys, ref_layer.keys, atol=1e-10)
        if record.index > 1:  # regular iterations (Table 2): rows and calls per iteration
            # Packed-SS on a CPU leaves the empty draft slots out (pads_drafts False): 1 + |D| + B rows, at most 2B
            packed = 1 + len(record.old_draft) + block if not nld_model.pads_drafts else 2 * block
            expected = {"linear": (2, 2 * block), "packed": (1, packed), "quadratic": (1, block * (block + 1))}
            assert (len(record.calls), record.rows) == expected[name]


# --- proposal-only drafter LoRA ------------------------------------------------------------------------
def _packed_call(model, base, prefix, draft, block):
    """Cache ``prefix`` minus its last token as ``base`` computes it, in ``model``; the packed call's layout
    and rows."""
    import copy

    base.reset()
    first = prefill_layout(prefix[:-1], 0, base.mask_token_id)
    base.forward(first, first.verify_rows)
    model.cache, model._length = copy.deepcopy(base.cache), base.cache_length
    layout = packed_layout(prefix[-1], draft, block - 1, len(prefix) - 1, model.mask_token_id)
    rows = layout.verify_rows + layout.draft_rows
    return layout, rows


@pytest.fixture(scope="module")
def lora_models(nld_dir):
    """Base, with the drafter adapter, merged: dynamic caches, which ``_packed_call`` copies from one to another
    (the static cache's LoRA runs are checked against these below)."""
    dynamic = dict(device="cpu", dtype="float64", cache="dynamic")
    with_lora = DualModeModel.from_pretrained(nld_dir, drafter_lora="linear_spec_lora", **dynamic)
    merged = DualModeModel.from_pretrained(nld_dir, drafter_lora="linear_spec_lora", **dynamic)
    for layer in merged.drafter_lora.layers:  # peft's merge: W += scaling * B A, for every row of every call
        layer.enable_adapters(True)
        layer.merge(adapter_names=["drafter"])
    merged.drafter_lora = None  # its forward must not switch (and so unmerge) the merged adapter
    base = DualModeModel.from_pretrained(nld_dir, **dynamic)
    return base, with_lora, merged


@pytest.mark.parametrize("name", SPECULATIVE)
def test_adapter_runs_on_the_static_cache_equal_the_dynamic_caches(lora_models, nld_dir, name):
    _, with_lora, _ = lora_models
    static = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64", drafter_lora="linear_spec_lora")
    assert static.cache_kind == "static"
    config = DecodeConfig(block_size=4, max_new_tokens=16, drafter_lora=True)
    prompt = [NLD_BOS_ID, 50, 51, 52, 53]
    a, b = generate(static, prompt, config, name), generate(with_lora, prompt, config, name)
    assert a.token_ids == b.token_ids and [r.proposals for r in a.records] == [r.proposals for r in b.records]


def test_adapter_in_one_packed_call_changes_draft_rows_only(lora_models):
    """Verify rows equal the base model's; draft rows equal the merged model's (whose context is the same
    base-model cache); the adapter really changes the draft rows."""
    base, with_lora, merged = lora_models
    prefix, draft, block = [NLD_BOS_ID, 40, 41, 42, 43], [44, 45], 4
    n_verify = block

    def logits(model, adapter):
        layout, rows = _packed_call(model, base, prefix, draft, block)
        kwargs = dict(adapter_rows=layout.proposal_rows) if adapter else {}
        return model.forward(layout, rows, **kwargs).logits

    plain = logits(base, False)
    mixed = logits(with_lora, True)
    full = logits(merged, False)
    assert torch.allclose(mixed[:n_verify], plain[:n_verify], atol=1e-10)
    assert torch.allclose(mixed[n_verify:], full[n_verify:], atol=1e-9)
    assert not torch.allclose(mixed[n_verify:], plain[n_verify:], atol=1e-3)
    # with the adapter off the loaded adapter changes nothing
    assert torch.allclose(logits(with_lora, False), plain, atol=1e-10)


@pytest.mark.parametrize("name", SPECULATIVE)
def test_adapter_runs_stay_lossless_and_count_selected_and_evaluated_rows(lora_models, name):
    base, with_lora, _ = lora_models
    prompt = [NLD_BOS_ID, 50, 51, 52, 53]
    block = 4
    ref = generate(base, prompt, DecodeConfig(max_new_tokens=20), "ar")
    run = generate(with_lora, prompt, DecodeConfig(block_size=block, max_new_tokens=20, drafter_lora=True), name)
    assert run.token_ids == ref.token_ids
    calls = [c for r in run.records for c in r.calls]
    for call in calls:
        if call.layout.name == "linear-verify" or call.layout.name == "prefill":
            assert call.adapter_selected == call.adapter_evaluated == 0  # verification: adapter off
        else:
            assert call.adapter_selected == len(call.layout.proposal_rows) > 0
            assert call.adapter_evaluated == call.layout.rows
    assert run.adapter_selected_rows == sum(c.adapter_selected for c in calls) > 0
    if name == "linear":  # its drafting call is all proposal rows: selected == evaluated
        assert run.adapter_selected_rows == run.adapter_evaluated_rows
    else:
        assert run.adapter_selected_rows < run.adapter_evaluated_rows


def test_adapter_flag_without_an_adapter_and_broken_adapters_are_refused(nld_dir, nld_model, tmp_path):
    from packed_ss.iteration import PromptError

    with pytest.raises(PromptError, match="no drafter adapter: turn the drafter LoRA off"):
        generate(nld_model, [NLD_BOS_ID, 5], DecodeConfig(drafter_lora=True), "packed")
    with pytest.raises(ModelLoadError, match="no adapter_config.json"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", drafter_lora="nowhere")
    bad = tmp_path / "bad-adapter"
    write_lora_adapter(bad, {"encoder.layers.0.self_attn.o_proj.weight": torch.zeros(48, 64)})
    with pytest.raises(ModelLoadError, match=r"does not fit this model: 1 targeted layers without LoRA weights "
                                             r"\(model.layers.1.self_attn.o_proj\)"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", drafter_lora=str(bad))
    wrong = tmp_path / "wrong-shape"
    write_lora_adapter(wrong, {f"encoder.layers.{i}.self_attn.o_proj.weight": torch.zeros(48, 32) for i in (0, 1)})
    with pytest.raises(ModelLoadError, match="wrong shape"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", drafter_lora=str(wrong))
    # A server offering several models: an adapter that does not fit one model leaves it untouched and says why.
    base = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64")
    kept = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64", drafter_lora=str(bad),
                                         require_adapter=False)
    assert kept.drafter_lora is None and "targeted layers without LoRA weights" in kept.adapter_note
    assert not any(".lora_" in name for name, _ in kept.model.named_parameters())
    prompt = [NLD_BOS_ID, 40, 41]
    assert generate(kept, prompt, DecodeConfig(max_new_tokens=6), "packed").token_ids == \
        generate(base, prompt, DecodeConfig(max_new_tokens=6), "packed").token_ids
    with pytest.raises(PromptError, match=r"no drafter adapter \(drafter adapter .* does not fit"):
        generate(kept, prompt, DecodeConfig(drafter_lora=True), "packed")
    config = json.loads((bad / "adapter_config.json").read_text())
    (bad / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    with pytest.raises(ModelLoadError, match="not LoRA"):
        DualModeModel.from_pretrained(nld_dir, device="cpu", drafter_lora=str(bad))


# --- the app on an NLD checkpoint ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def nld_server(nld_dir):
    """``python app.py --model <nld folder> --drafter-lora linear_spec_lora`` (tiny NLD fixture)."""
    import app
    from helpers import serve

    demo = app.build_demo(str(nld_dir), dtype="float64", drafter_lora="linear_spec_lora", new_tokens_cap=32)
    yield from serve(demo)


def test_app_serves_steps_and_a_race_on_an_nld_checkpoint(nld_server):
    from gradio_client import Client

    client = Client(nld_server, verbose=False)
    prompt = " ".join(f"w{i}" for i in range(20, 30))
    for lora in (False, True):
        ui = ("", prompt, "packed", 4, 0.0, 0, 1.0, 0, 12, lora, "", "model", 0.8, "ltr", False)
        first = client.predict(*ui, api_name="/step")
        second = client.predict(*ui, api_name="/step")
        assert 'class="token-grid"' in second[1] and "error" not in str(second[5]).lower()
        assert first[0]["value"] == 1 and second[0]["value"] == 2
        client.predict(api_name="/reset")
    race = client.predict(prompt, max_new_tokens=12, block_size=4, drafter_lora=True, api_name="/race")
    assert race["lossless_identical_to_ar"] is True
    assert set(race["lanes"]) >= {"linear", "quadratic", "packed"}
    run = client.predict(prompt, schedule="linear", max_new_tokens=12, block_size=4, drafter_lora=True,
                         api_name="/generate")
    assert run["adapter_selected_rows"] == run["adapter_evaluated_rows"] > 0
    with pytest.raises(Exception, match="precision must be"):
        client.predict(prompt, max_new_tokens=4, precision="int8", api_name="/generate")


def test_space_variables_choose_the_default_model_the_offered_ones_and_the_adapter(monkeypatch):
    """A Space sets PACKED_SS_MODEL, PACKED_SS_ALLOW_MODELS and PACKED_SS_DRAFTER_LORA; flags win over them."""
    import app
    from serve.models import ANY_ORDER_MODEL

    seen = {}

    class Demo:
        def launch(self, **kwargs):
            seen["launched"] = True

    def fake_build(model, **kwargs):
        seen.update(model=model, **kwargs)
        return Demo()

    monkeypatch.setattr(app, "build_demo", fake_build)
    monkeypatch.setenv("PACKED_SS_MODEL", "nvidia/Nemotron-Labs-Diffusion-3B")
    monkeypatch.setenv("PACKED_SS_ALLOW_MODELS", "nvidia/Nemotron-Labs-Diffusion-8B, assets/model ,")
    monkeypatch.setenv("PACKED_SS_DRAFTER_LORA", "linear_spec_lora")
    app.main([])
    assert seen["model"] == "nvidia/Nemotron-Labs-Diffusion-3B" and seen["launched"]
    assert seen["allowed_models"] == ["nvidia/Nemotron-Labs-Diffusion-8B", "assets/model"]
    assert seen["drafter_lora"] == "linear_spec_lora" and seen["family"] is None
    app.main(["--model", "m", "--allow-model", "x", "--drafter-lora", "other", "--family", "nemotron"])
    assert (seen["model"], seen["allowed_models"], seen["drafter_lora"], seen["family"]) == ("m", ["x"], "other",
                                                                                             "nemotron")
    monkeypatch.delenv("PACKED_SS_MODEL")
    monkeypatch.delenv("PACKED_SS_ALLOW_MODELS")
    monkeypatch.delenv("PACKED_SS_DRAFTER_LORA")
    app.main([])
    assert seen["model"] == app.DEFAULT_MODEL and seen["allowed_models"] == [ANY_ORDER_MODEL] and seen["drafter_lora"] is None


def test_token_strings_keep_the_spaces_a_sentencepiece_tokenizer_marks():
    """Decoding one token drops a Metaspace word start; the pieces the page joins must keep it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from helpers import tiny_llama

    vocab = {"<unk>": 0, "<mask>": 1, "\u2581hello": 2, "\u2581world": 3, "!": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    model = tiny_llama(vocab_size=5)
    model.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", mask_token="<mask>")
    ids = model.encode("hello world hello")
    assert "".join(model.token_strings(ids)).strip() == model.decode(ids) == "hello world hello"
