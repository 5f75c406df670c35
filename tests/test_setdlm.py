"""SetDLM family: its released checkpoints' on-disk format (derived from kuleshov-group/setdlms' code) loaded
natively and strictly, decoded by the any-order schedules; a fixture written to that format, nothing
downloaded."""

import json

import pytest
import torch
from transformers import Qwen3ForCausalLM
from helpers import SETDLM_EOS_ID, SETDLM_LENGTH, SETDLM_MASK_ID, qwen3_base_config, write_setdlm_checkpoint
from test_any_order import serial_reference

from packed_ss import DecodeConfig, generate
from packed_ss.any_order.layout import order_layout
from packed_ss.any_order.session import OrderSession
from packed_ss.any_order.setdlm_native import (SetDLMDecoding, SetDLMDiffusion, commit_count, commit_rule,
                                               setdlm_sequence, timesteps)
from packed_ss.iteration import PromptError
from packed_ss.records import summarize
from packed_ss.models import DualModeModel, ModelLoadError
from packed_ss.models.setdlm import kept_layers

SPECULATIVE = ("linear", "quadratic", "packed")
PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def setdlm(tmp_path_factory):
    """(folder, the Qwen3 weights written, the checkpoint loaded in float64)."""
    folder = tmp_path_factory.mktemp("setdlm-tiny")
    own = write_setdlm_checkpoint(folder)
    return folder, own, DualModeModel.from_pretrained(folder, device="cpu", dtype="float64")


def reference_qwen3(own: dict):
    """A plain ``Qwen3ForCausalLM`` with the fixture's architecture written out by hand (not through the
    loader: rope theta, two layers, tied head) holding the same weights, float64."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-6,
                         max_position_embeddings=512, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config).double().eval()
    model.load_state_dict({k: v.double() for k, v in own.items()}, strict=True)
    return model


def test_setdlm_is_detected_and_every_tensor_lands_under_its_qwen3_name(setdlm):
    folder, own, model = setdlm
    assert model.family == "setdlm" and model.any_order
    assert isinstance(model.model, Qwen3ForCausalLM) and type(model.model).__name__ == "SetDLMQwen3"
    assert (model.context_length, model.native_window, model.native_decoding) == (SETDLM_LENGTH, 8, "setdlm")
    assert model.model.config.num_hidden_layers == 2  # keep_bottom_n_layers: 2 of the base's 3
    assert (model.mask_token_id, model.eos_token_id, model.bos_token_id) == (SETDLM_MASK_ID, SETDLM_EOS_ID, None)
    assert not list(folder.glob("*.py")), "the fixture ships no remote code, so none can have run"
    loaded = model.model.state_dict()
    assert set(loaded) == set(own)
    for name, tensor in own.items():
        assert torch.equal(loaded[name], tensor.double()), name
    assert model.encode("w5 w6") == [5, 6] and SETDLM_MASK_ID in model.never_emit_ids


def test_float32_is_the_default_dtype_of_the_family(setdlm):
    folder, _, _ = setdlm
    assert DualModeModel.from_pretrained(folder, device="cpu").dtype == torch.float32


@pytest.mark.parametrize("weights,model_type,wrapped", [
    ("safetensors", "bd3lm", True), ("bin", "denoiser", True), ("safetensors", "bd3lm", False)])
def test_each_format_the_code_can_write_loads_to_the_same_model(tmp_path, setdlm, weights, model_type, wrapped):
    """pytorch_model.bin (what the code saves) or model.safetensors; model_type of SetDLM's config class or the
    denoiser base class; the backbone wrapped (``backbone.model.``) or the causal LM itself (``backbone.``)."""
    own = write_setdlm_checkpoint(tmp_path, weights=weights, model_type=model_type, wrapped=wrapped)
    model = DualModeModel.from_pretrained(tmp_path, device="cpu", dtype="float64")
    assert model.family == "setdlm" and model.any_order
    loaded = model.model.state_dict()
    assert all(torch.equal(loaded[k], v.double()) for k, v in own.items())
    assert model.model.config.num_hidden_layers == (2 if wrapped else 3)
    assert run(model, "packed", new=12).token_ids == run(model, "ar", new=12).token_ids


@pytest.mark.parametrize("rename,named", [
    ({"backbone.model.model.layers.1.mlp.up_proj.weight": "backbone.model.model.layers.1.mlp.upp_proj.weight"},
     "upp_proj"),
    ({"backbone.model.model.norm.weight": "backbone.norm.weight"}, "model.norm.weight"),
])
def test_a_renamed_tensor_is_refused_with_the_key_named(tmp_path, rename, named):
    write_setdlm_checkpoint(tmp_path, rename=rename)
    with pytest.raises(ModelLoadError, match="do not all map") as error:
        DualModeModel.from_pretrained(tmp_path, device="cpu")
    assert named in str(error.value) and "missing" in str(error.value)


def _rewrite(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if key == "backbone":
            config["backbone_config"].update(value)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes,message", [
    ({"architectures": ["BD3LM"]}, "not a SetDLM"),
    ({"backbone": {"_target_": "backbone_encoder_decoder.LLMasEncoderDecoder"}}, "not supported"),
    ({"backbone": {"keep_bottom_n_layers": 5}}, "keep_bottom_n_layers is 5, more than the base model's 3 layers"),
    ({"backbone": {"keep_bottom_n_layers": 0}}, "not a positive integer"),
    ({"backbone": {"pretrained_model_name_or_path": "/nowhere/qwen3-base"}}, "'/nowhere/qwen3-base' does not exist"),
    ({"tokenization_config": {}, "mask_token_id": None}, "no mask_token_id"),
    ({"tokenization_config": {"mask_token_id": 999}, "mask_token_id": 999}, "mask_token_id 999 is not a token id"),
])
def test_configs_the_loader_cannot_map_are_refused_with_a_reason(tmp_path, changes, message):
    write_setdlm_checkpoint(tmp_path)
    _rewrite(tmp_path, **changes)
    with pytest.raises(ModelLoadError, match=message):
        DualModeModel.from_pretrained(tmp_path, device="cpu")


@pytest.mark.parametrize("automodel_cls", ["AutoModel", "AutoModelForMaskedLM", "CustomQwen3ForCausalLM"])
def test_any_automodel_cls_loads_as_setdlms_wrapper_ignores_it(tmp_path, automodel_cls):
    """``configs/model/backbone/automodel.yaml`` writes ``automodel_cls: AutoModel``; SetDLM's
    ``AutoModelFromPreTrained`` builds its Qwen3 causal LM whatever the field says, so the weights decide."""
    own = write_setdlm_checkpoint(tmp_path, automodel_cls=automodel_cls)
    model = DualModeModel.from_pretrained(tmp_path, device="cpu", dtype="float64")
    assert model.family == "setdlm" and isinstance(model.model, Qwen3ForCausalLM)
    assert all(torch.equal(model.model.state_dict()[k], v.double()) for k, v in own.items())


def test_a_load_prints_no_report_about_setdlms_stored_mask(tmp_path, capfd):
    """``static_attention_mask`` is SetDLM's buffer, not a weight: it is dropped knowingly, nothing printed."""
    write_setdlm_checkpoint(tmp_path)
    capfd.readouterr()
    DualModeModel.from_pretrained(tmp_path, device="cpu")
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "static_attention_mask" not in out + err


def test_a_base_model_that_is_not_qwen3_is_refused(tmp_path):
    """SetDLM's wrapper always builds CustomQwen3ForCausalLM, so another base architecture cannot be its."""
    write_setdlm_checkpoint(tmp_path)
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32,
                                                  "num_hidden_layers": 3, "num_attention_heads": 4,
                                                  "intermediate_size": 64, "vocab_size": 32}))
    _rewrite(tmp_path, backbone={"pretrained_model_name_or_path": str(llama)})
    with pytest.raises(ModelLoadError, match="only a Qwen3 base"):
        DualModeModel.from_pretrained(tmp_path, device="cpu")


def test_base_model_flag_replaces_the_hub_id_the_checkpoint_names(tmp_path, monkeypatch):
    """The released configs name Qwen/Qwen3-1.7B-Base; offline, a local copy of its config.json is given (flag or
    PACKED_SS_BASE_MODEL); a base of another shape is refused with the mis-shaped tensors named."""
    from packed_ss.cli import _parser, load_model

    write_setdlm_checkpoint(tmp_path)
    _rewrite(tmp_path, backbone={"pretrained_model_name_or_path": str(tmp_path / "absent-base")})
    model = DualModeModel.from_pretrained(tmp_path, device="cpu", base_model=str(tmp_path / "base"))
    assert model.family == "setdlm" and model.model.config.num_hidden_layers == 2
    monkeypatch.setenv("PACKED_SS_BASE_MODEL", str(tmp_path / "base"))
    args = _parser().parse_args(["generate", "--prompt", "w5", "--model", str(tmp_path)])
    assert args.base_model == str(tmp_path / "base")
    wider = tmp_path / "wider"
    wider.mkdir()
    (wider / "config.json").write_text(json.dumps(qwen3_base_config() | {"intermediate_size": 128}))
    with pytest.raises(ModelLoadError, match="wrong shape: .*mlp"):
        DualModeModel.from_pretrained(tmp_path, device="cpu", base_model=str(wider))
    with pytest.raises(ModelLoadError, match="applies to SetDLM checkpoints only"):
        load_model("assets/model", "cpu", None, base_model=str(tmp_path / "base"))
    with pytest.raises(ModelLoadError, match="--base-model is empty"):
        load_model(str(tmp_path), "cpu", None, base_model=" ")


def test_layer_cuts_of_each_code_version():
    assert kept_layers({}, 4) == [0, 1, 2, 3]
    assert kept_layers({"keep_bottom_n_layers": 2}, 4) == [0, 1]
    assert kept_layers({"keep_every_n_layers": 2}, 4) == [1, 3]
    assert kept_layers({"num_layers": 1, "keep_top_layers": True}, 4) == [3]
    assert kept_layers({"num_layers": 3}, 4) == [0, 1, 2]


def setdlm_training_input(tokens: list[int], ranks: list[int]):
    """SetDLM's training input written from its description: ``[tokens | masks]``, both halves in generation
    order with shared position ids; a token sees the tokens at or before it in the order, a mask sees the
    tokens strictly before it and itself. Returns (ids (1, 2S), positions (1, 2S), mask (1, 1, 2S, 2S))."""
    s = len(tokens)
    by_rank = sorted(range(s), key=lambda i: ranks[i])
    ids = [tokens[i] for i in by_rank] + [SETDLM_MASK_ID] * s
    positions = by_rank + by_rank
    r = torch.arange(s)
    mask = torch.zeros(2 * s, 2 * s, dtype=torch.bool)
    mask[:s, :s] = r[:, None] >= r[None, :]
    mask[s:, :s] = r[:, None] > r[None, :]
    mask[s:, s:] = torch.eye(s, dtype=torch.bool)
    return torch.tensor([ids]), torch.tensor([positions]), mask[None, None]


def test_one_forward_equals_a_plain_qwen3_with_the_same_weights_under_an_any_order_mask(setdlm):
    _, own, model = setdlm
    reference = reference_qwen3(own)
    ids, positions, mask = setdlm_training_input([5, 9, 4, 11, 7, 6], [0, 1, 4, 2, 5, 3])
    with torch.no_grad():
        want = reference(input_ids=ids, position_ids=positions, attention_mask=mask).logits
        got = model.model(input_ids=ids, position_ids=positions, attention_mask=mask).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # The engine's own call (paper D.2's N | O | M | R regions, prompt prefilled) through the adapter.
    model.reset()
    layout = order_layout("ao-packed", 0, [], (5, 7, 6), {5: 9, 6: 4}, SETDLM_MASK_ID, checked=2, verified=3,
                          drafted=True, prompt=(5, 6, 7, 8, 10))
    rows = tuple(range(layout.rows))
    got = model.forward(layout, rows).logits
    model.reset()
    with torch.no_grad():
        want = reference(input_ids=torch.tensor([layout.token_ids]), position_ids=torch.tensor([layout.position_ids]),
                         attention_mask=layout.full_mask()[None, None]).logits[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_setdlms_attention_cast_is_the_identity_here(setdlm, dtype):
    """CustomQwen3Attention casts queries and keys to the values' dtype after the cache update; in
    transformers' Qwen3 every projection, and the cache, already has the model's dtype, so the cast
    changes nothing."""
    folder, _, _ = setdlm
    model = DualModeModel.from_pretrained(folder, device="cpu", dtype=dtype, path="transformers")  # SetDLM's own
    seen = set()
    for layer in model.model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            proj.register_forward_hook(lambda module, args, out: seen.add(out.dtype))
    generate(model, PROMPT, DecodeConfig(block_size=5, max_new_tokens=6), "packed")
    assert seen == {dtype}
    model.reset()
    layout = order_layout("ao-ar", 0, [], (4,), {}, SETDLM_MASK_ID, checked=0, verified=1, drafted=False,
                          prompt=tuple(PROMPT))
    model.forward(layout, (layout.rows - 1,))
    assert {k.dtype for k, _ in model.cached_kv()} == {v.dtype for _, v in model.cached_kv()} == {dtype}


def run(model, schedule, order="ltr", block=5, new=24):
    return generate(model, PROMPT, DecodeConfig(block_size=block, max_new_tokens=new, order=order), schedule)


def test_ltr_equals_the_checkpoints_own_left_to_right_decoding(setdlm):
    model = setdlm[2]
    reference = run(model, "ar")
    assert len(reference.token_ids) == 24 or reference.stop_reason == "eos"
    for name in SPECULATIVE:
        got = run(model, name)
        assert got.token_ids == reference.token_ids, name


@pytest.mark.parametrize("name", SPECULATIVE)
def test_confidence_order_equals_the_serial_reference(setdlm, name):
    model = setdlm[2]
    got = run(model, name, order="confidence")
    assert got.token_ids == serial_reference(model, PROMPT, got.records, 24)


def test_native_decoding_runs_on_the_checkpoint(setdlm):
    """SetDLM's own decoding: every call commits at least one token, unverified."""
    model = setdlm[2]
    got = run(model, "diffusion", new=16)
    assert got.nfe <= len(setdlm_sequence(got)) and all(r.advance + r.cut >= 1 for r in got.records)


def test_the_app_offers_a_setdlm_checkpoint_with_the_order_choice_before_loading_it(setdlm, tiny_model_dir):
    from serve.models import ModelStore

    folder, _, _ = setdlm
    store = ModelStore(default=str(tiny_model_dir), allowed=[str(folder)], device="cpu")
    public = store.offered[1]
    assert store.any_order(public) and not store.any_order(None)
    model = store.get(public)
    assert model.family == "setdlm" and model.dtype == torch.float32


def test_benchmark_reports_setdlm_schedules_and_native_decoding(setdlm, tmp_path):
    """Table 9's rows on the fixture: the speculative schedules under confidence order beside native."""
    from packed_ss.bench.cli import main

    folder, _, _ = setdlm
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ("w5 w6 w7", "w8 w9")) + "\n")
    out = tmp_path / "out"
    code = main(["--model", str(folder), "--prompts", str(prompts), "--schedules", "ar,linear,packed,diffusion",
                 "--order", "confidence", "--block-size", "5", "--max-new-tokens", "8",
                 "--out", str(out), "--no-warmup", "--resamples", "200", "--threads", "1"])
    assert code == 0
    report = (out / "summary.md").read_text()
    for name in ("packed", "linear", "diffusion"):
        assert name in report
    assert "confidence" in report


# --- SetDLM's own native decoder, ported step by step (kuleshov-group/setdlms at 549f0bb) --------------------
# The port below is written from SetDLM's code, not from the engine: full forward passes of a plain Qwen3 with
# eager attention (as SetDLM's CustomQwen3Attention runs 4D masks) and no KV cache, the cache's history
# replayed through the mask. Each comment names the file:line of SetDLM's code the step follows;
# setdlm.py is src/denoiser/setdlm.py, mdlm.py src/denoiser/mdlm.py, bd3lm.py src/denoiser/bd3lm.py.

SHARP = 10.0  # final-norm scale of the native-decoding fixture: some masks reach the 0.9 threshold, some do not


@pytest.fixture(scope="module")
def sharp(tmp_path_factory):
    """(the checkpoint loaded in float64, a plain eager Qwen3 holding the same weights)."""
    folder = tmp_path_factory.mktemp("setdlm-sharp")
    own = write_setdlm_checkpoint(folder, sharpness=SHARP)
    reference = reference_qwen3(own)
    reference.config._attn_implementation = "eager"
    return DualModeModel.from_pretrained(folder, device="cpu", dtype="float64"), reference


def setdlm_generate(backbone, prompt, new_tokens, window, threshold, first_hitting=True, context=SETDLM_LENGTH,
                    num_steps=None):
    """SetDLM.generate (setdlm.py:799) for one prompt, greedy, predict_and_noise, ``window`` = max_window_size.

    Returns (steps, sequence, cropped): per step the committed (position, token) pairs in textual order;
    the generated tokens generate returns (masks removed, setdlm.py:1370-1372); cache entries cropped.
    The stopping criterion is "an EOS among the tokens before the window's end" (eos_token_criteria).
    """
    n = len(prompt)
    num_steps = new_tokens if num_steps is None else num_steps
    # mdlm.py:431-442 _sample_generation_timesteps: linspace(1, 0, min(T + 1, max_length + 1))[:-1], float64
    timesteps = torch.linspace(1.0, 0.0, min(num_steps + 1, new_tokens + 1), dtype=torch.float64)[:-1]
    window = min(8, window)  # setdlm.py:966-973: min(noise.compute_window_size() (the fixture's 8), max_window)
    samples = list(prompt) + [SETDLM_MASK_ID] * new_tokens  # mdlm.py/setdlm.py:772-796 _sample_prior
    # The KV cache as entries (token, position, first visible entry): setdlm.py:1046-1051 update_cache prefills
    # the prompt causally (setdlm.py:588-590, the static mask's clean block; no mask to patch).
    entries = [(t, j, 0) for j, t in enumerate(prompt)]
    start = 0  # entries cropped from the left so far (bd3lm.py:298-321 _crop_kv_cache_left)
    pending = []  # positions committed last step, not yet cached (masked_positions still holds them)
    steps, generated = [], 0
    for i in range(len(timesteps)):  # setdlm.py:1063
        t = timesteps[i]
        following = generated + 1 if first_hitting else i + 1  # setdlm.py:1067-1079
        next_t = timesteps[following] if following < len(timesteps) else timesteps[-1] * 0
        first_open = samples.index(SETDLM_MASK_ID)  # setdlm.py:986-992 / 1330-1337 window_start
        masks = [j for j in range(first_open, min(first_open + window, n + new_tokens)) if samples[j] == SETDLM_MASK_ID]
        # setdlm.py:523-559: crop the cache from the left when cache + this call's rows exceed config.length
        overflow = (len(entries) - start) + len(pending) + len(masks) - context
        if overflow > 0:
            assert len(entries) - start - overflow > 0  # setdlm.py:556
            start += overflow
        logits = _setdlm_call(backbone, entries, start, [(samples[j], j) for j in pending], masks)
        # setdlm.py:1386-1389 _forward: the mask token gets -inf, log-softmax; mdlm.py:996 exp
        logits[:, SETDLM_MASK_ID] = float("-inf")
        probs = logits.log_softmax(-1).exp()
        xs = probs.argmax(-1)  # base.py:406-407 _sample_categorical, do_sample false
        conf = probs.gather(-1, xs[:, None])[:, 0]  # mdlm.py:1036 xs_probs
        # mdlm.py:1041-1043: num_to_decode with block_size = max_new_tokens (setdlm.py:1188)
        k = int((t * new_tokens).round().to(torch.int) - (next_t * new_tokens).round().to(torch.int))
        output = xs.clone()
        noise_indices = conf.argsort(dim=-1)[: -k]  # mdlm.py:1044-1054 (mask rows only: 0 clean + k)
        output[noise_indices] = SETDLM_MASK_ID  # mdlm.py:1079
        output = torch.where(conf >= threshold, xs, output)  # mdlm.py:1080-1082
        committed = [(j, int(x)) for j, x in zip(masks, output) if x != SETDLM_MASK_ID]
        # setdlm.py:1195-1202: the previous step's clean rows enter the cache, each having seen the cache
        # and the clean rows before it (setdlm.py:568-570 puts them first, in textual order)
        entries += [(samples[j], j, start) for j in pending]
        for j, x in committed:
            samples[j] = x  # setdlm.py:1223, 1236-1240 scatter
        pending = [j for j, _ in committed]
        steps.append(committed)
        generated += len(committed)  # setdlm.py:1338-1340 num_tokens_generated_per_step
        if SETDLM_MASK_ID not in samples[n:]:  # setdlm.py:1341-1343 done_decoding
            break
        first_open = samples.index(SETDLM_MASK_ID)
        if i % window == 0 and i > 0 and SETDLM_EOS_ID in samples[n:first_open + window]:  # setdlm.py:1344-1364
            samples = samples[:first_open + window]
            break
    return steps, tuple(x for x in samples[n:] if x != SETDLM_MASK_ID), start


def _setdlm_call(backbone, entries, start, pending, masks):
    """Logits (len(masks), V) of one decoding call, recomputed without a cache: every cache entry sees the
    entries from the first it saw when it was computed up to itself; a clean row sees the cache and the
    earlier clean rows (setdlm.py:588-590, causal); a mask row sees the cache, the clean rows and itself
    (setdlm.py:592-609 patches the masks' block to its diagonal; at step 0, setdlm.py:632-648)."""
    rows = [(t, j) for t, j, _ in entries] + pending + [(SETDLM_MASK_ID, j) for j in masks]
    c, p = len(entries), len(pending)
    allowed = torch.zeros(len(rows), len(rows), dtype=torch.bool)
    for e, (_, _, first) in enumerate(entries):
        allowed[e, first:e + 1] = True
    for r in range(c, c + p + len(masks)):
        allowed[r, start:min(r, c + p)] = True
        allowed[r, r] = True
    ids = torch.tensor([[t for t, _ in rows]])
    positions = torch.tensor([[j for _, j in rows]])
    bias = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    with torch.no_grad():
        return backbone(input_ids=ids, position_ids=positions, attention_mask=bias[None, None]).logits[0, c + p:]


def engine_steps(run):
    """The native lane's trajectory: per iteration the committed (position, token) pairs in textual order."""
    return [[(r.proposal_positions[k], r.proposals[k]) for k in r.kept] for r in run.records]


def harness_cut(sequence):
    """SetDLM's harness splits the decoded text at the EOS (scripts/eval/harness_eval.py:502-509); the engine's
    output keeps the EOS token itself, as every schedule's does."""
    return sequence[:sequence.index(SETDLM_EOS_ID) + 1] if SETDLM_EOS_ID in sequence else sequence


NATIVE_PROMPTS = ([5, 6, 7, 8], [9, 4, 11], [12, 13, 14, 15, 16])


@pytest.mark.parametrize("window", [2, 4, 8, 16])
@pytest.mark.parametrize("prompt", NATIVE_PROMPTS)
def test_native_decoding_follows_setdlms_generate_step_by_step(sharp, window, prompt):
    """Committed positions and tokens of every step, the calls, SetDLM's returned tokens and the harness's cut
    output; W = 16 is bounded by the noise schedule's 8."""
    model, backbone = sharp
    run = generate(model, prompt, DecodeConfig(block_size=window + 1, max_new_tokens=24), "diffusion")
    steps, sequence, _ = setdlm_generate(backbone, prompt, 24, window, 0.9)
    assert engine_steps(run) == steps and run.nfe == len(steps)
    assert setdlm_sequence(run) == sequence and run.token_ids == harness_cut(sequence)


def test_the_trajectories_exercise_the_rule(sharp):
    """The fixture makes the comparison above mean something: steps commit several tokens, the first-hitting
    count grows, and a run decodes past its EOS until SetDLM's stop check."""
    model, backbone = sharp
    counts = [len(s) for p in NATIVE_PROMPTS for s in setdlm_generate(backbone, p, 24, 8, 0.9)[0]]
    assert max(counts) >= 4 and counts.count(1) >= 3
    sequence = setdlm_generate(backbone, NATIVE_PROMPTS[2], 24, 2, 0.9)[1]
    assert len(harness_cut(sequence)) < len(sequence)  # tokens past the EOS were decoded


@pytest.mark.parametrize("window", [2, 4, 8])
def test_native_decoding_without_first_hitting_follows_setdlm(sharp, window):
    """first_hitting false (the paper's throughput script) and a step budget T below N."""
    model, backbone = sharp
    for settings, steps_t in ((SetDLMDecoding(first_hitting=False), None), (SetDLMDecoding(num_steps=12), 12)):
        for prompt in NATIVE_PROMPTS:
            session = OrderSession(model, prompt, DecodeConfig(block_size=window + 1, max_new_tokens=24), "diffusion")
            run = summarize(list(SetDLMDiffusion(settings).iterate(session)), "diffusion", window + 1, 0.0, len(prompt))
            steps, sequence, _ = setdlm_generate(backbone, prompt, 24, window, 0.9, settings.first_hitting,
                                                 num_steps=steps_t)
            assert engine_steps(run) == steps and setdlm_sequence(run) == sequence, (settings, prompt)


@pytest.mark.parametrize("cache", ["static", "dynamic"])
def test_native_decoding_crops_the_cache_at_setdlms_context_as_setdlm_does(sharp, cache):
    """4 + 80 tokens exceed the fixture's length of 64: both crop the oldest cache entries, the run says how many,
    and the crop changes what is decoded (an uncropped port gives other tokens)."""
    loaded, backbone = sharp
    model = DualModeModel(loaded.model, loaded.tokenizer, loaded.mask_token_id, loaded.eos_token_id, None, "setdlm",
                          cache=cache)
    assert model.cache_kind == cache
    prompt = [20, 8, 13, 8]
    run = generate(model, prompt, DecodeConfig(block_size=5, max_new_tokens=80), "diffusion")
    steps, sequence, cropped = setdlm_generate(backbone, prompt, 80, 4, 0.9)
    assert engine_steps(run) == steps and setdlm_sequence(run) == sequence
    assert run.cropped == cropped > 0 and run.metrics()["cropped"] == cropped
    assert sum(r.cropped > 0 for r in run.records) > 1
    uncropped = setdlm_generate(backbone, prompt, 80, 4, 0.9, context=10**6)[1]
    assert uncropped[:60] == sequence[:60] and uncropped != sequence


def test_left_to_right_decoding_crops_like_setdlm_at_window_one(sharp):
    """The ar lane beyond the context equals SetDLM's decoder at window 1, crop included."""
    model, backbone = sharp
    run = generate(model, PROMPT, DecodeConfig(block_size=5, max_new_tokens=80), "ar")
    assert run.cropped > 0
    assert run.token_ids == harness_cut(setdlm_generate(backbone, PROMPT, 80, 1, 1.0)[1])


@pytest.mark.parametrize("name", SPECULATIVE)
def test_speculative_schedules_crop_too_and_agree_with_ar_until_the_context_fills(sharp, name):
    """Their calls hold more rows than ar's, so past the crop they see a shorter context (docs/checkpoints.md: Context)."""
    model, _ = sharp
    got, reference = run(model, name, new=80), run(model, "ar", new=80)
    assert got.cropped > 0 and len(got.token_ids) == 80
    assert got.token_ids[:40] == reference.token_ids[:40]


def test_a_prompt_that_leaves_no_room_in_the_context_is_refused_in_one_line(sharp):
    model, _ = sharp
    with pytest.raises(PromptError, match="exceeds the model's context of 64 tokens") as error:
        generate(model, [5] * 62, DecodeConfig(block_size=5, max_new_tokens=8), "diffusion")
    assert "\n" not in str(error.value)


def test_commit_rule_pure_functions():
    """k from the timesteps (first hitting: the count grows after a step of several), ties keep the later mask."""
    steps = timesteps(8)
    assert steps == tuple(1 - i / 8 for i in range(8))
    assert commit_count(steps, 0, 0, 8, True) == 1 and commit_count(steps, 1, 3, 8, True) == 3
    assert commit_count(steps, 1, 3, 8, False) == 1 and commit_count(steps, 7, 8, 8, True) == 1
    assert commit_rule([0.2, 0.5, 0.5, 0.1], 1, 0.9) == (2,)
    assert commit_rule([0.2, 0.95, 0.5, 0.1], 2, 0.9) == (1, 2)
    assert commit_rule([0.2, 0.3], 5, 0.9) == (0, 1)


def test_eager_attention_on_request_agrees_with_setdlms_kernel_exactly(setdlm):
    """SetDLM runs eager attention for its 4D masks; the engine's sdpa differs only in rounding (7e-5 measured on a
    checkpoint SetDLM wrote, about 4e-7 on this tiny one), and ``attention="eager"`` (an additive mask, as SetDLM
    passes) removes that with the dynamic cache."""
    folder, own, _ = setdlm
    reference = reference_qwen3(own).float()
    reference.config._attn_implementation = "eager"
    layout = order_layout("ao-packed", 0, [], (5, 7, 6), {5: 9, 6: 4}, SETDLM_MASK_ID, checked=2, verified=3,
                          drafted=True, prompt=(5, 6, 7, 8, 10))
    rows = tuple(range(layout.rows))
    bias = torch.zeros(layout.rows, layout.rows).masked_fill(~layout.full_mask(), torch.finfo(torch.float32).min)
    with torch.no_grad():  # SetDLM's additive float mask (base.py _preprocess_attention_mask)
        want = reference(input_ids=torch.tensor([layout.token_ids]), position_ids=torch.tensor([layout.position_ids]),
                         attention_mask=bias[None, None]).logits[0]
    logits = {}
    for attention, cache in (("eager", "static"), ("eager", "dynamic"), ("sdpa", "static")):
        model = DualModeModel.from_pretrained(folder, device="cpu", attention=attention, cache=cache)
        assert model.model.config._attn_implementation == attention
        model.reset(layout.rows)
        logits[attention, cache] = model.forward(layout, rows).logits
    assert torch.equal(logits["eager", "dynamic"], want)  # the same kernel over the same keys: bit for bit
    # the static cache's keys span its capacity (masked columns change the sums' blocking); sdpa sums otherwise
    torch.testing.assert_close(logits["eager", "static"], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(logits["sdpa", "static"], want, rtol=0, atol=1e-4)
    assert not torch.equal(logits["sdpa", "static"], want)
    with pytest.raises(ModelLoadError, match="attention must be one of"):
        DualModeModel.from_pretrained(folder, device="cpu", attention="flash")


def test_the_native_lanes_confidence_saturates_in_float32_as_setdlms_does():
    """At threshold 1.0 (SetDLM's generation-config default) SetDLM commits every mask whose float32 confidence
    rounds to 1.0; the lane's float64 softmax gave 0.9999973 for [90, 76.8, 76] and committed fewer (issue 36,
    item 5: 24/48 runs ended as SetDLM's own generate does)."""
    import torch

    from packed_ss.any_order.setdlm_native import commit_rule, setdlm_confidence

    logits = torch.tensor([[90.0, 76.8, 76.0], [5.0, 4.0, 3.0], [80.0, 60.0, 0.0]], dtype=torch.float64)
    confidence = setdlm_confidence(logits)
    assert confidence[0] == 1.0 and confidence[2] == 1.0 and confidence[1] < 1.0
    assert torch.softmax(logits[0], -1).max().item() < 1.0  # what the lane computed before
    assert commit_rule(confidence, 1, 1.0) == (0, 2)  # both saturated masks, though one was asked for


def test_the_confidence_threshold_flag_reaches_the_diffusion_schedule(tiny_model_dir, capsys):
    from packed_ss.cli import main

    assert main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--schedule", "diffusion",
                 "--max-new-tokens", "4", "--confidence-threshold", "1.5"]) == 2
    assert "confidence threshold must be in (0, 1], got 1.5" in capsys.readouterr().err
    assert main(["generate", "--model", str(tiny_model_dir), "--prompt", "w1 w2", "--schedule", "diffusion",
                 "--max-new-tokens", "4", "--confidence-threshold", "1.0"]) == 0


@pytest.mark.parametrize("order", ["ltr", "confidence"])
def test_the_native_forward_and_its_graphs_decode_setdlm_as_transformers_forward_does(setdlm, order):
    """Issue 55 names SetDLM among the models the GPU path serves: its any-order layouts (mask entries sharing
    positions with tokens) are masks and positions like any other, so the native forward and its graphs (here the
    CPU recorder with CUDA graphs' semantics) give transformers' tokens, the context's left crop included
    (60 new tokens past SetDLM's 64-token context)."""
    from test_graphs import HostGraphCalls

    folder, _, native = setdlm
    reference = DualModeModel.from_pretrained(folder, device="cpu", dtype="float64", path="transformers")
    graphs = native.share()
    graphs.static = HostGraphCalls(graphs.model, graphs.supports_deferred_rows, compiled=True)
    assert native.path == "native" and native.path_note is None and reference.path == "transformers"
    config = DecodeConfig(block_size=5, max_new_tokens=60, order=order)
    cropped = {}
    for name in ["ar", *SPECULATIVE, "diffusion"]:
        want = generate(reference, PROMPT, config, name)
        assert generate(native, PROMPT, config, name).token_ids == want.token_ids, name
        assert generate(graphs, PROMPT, config, name).token_ids == want.token_ids, name
        cropped[name] = want.cropped
    assert graphs.static.shapes and cropped["packed"] > 0, (graphs.static.shapes, cropped)
