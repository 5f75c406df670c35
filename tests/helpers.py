"""Models built inside the tests: a tiny random Llama (float64) and a scripted dual-mode model."""

from __future__ import annotations

import numpy as np
import torch

from packed_ss.models import CallOutput, DualModeModel


def tiny_tokenizer(vocab_size: int):
    """Word-level tokenizer over ``vocab_size`` tokens: ``<eos>``, ``<mask>``, then ``a``, ``b``, ..."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<eos>", "<mask>"] + [f"w{i}" for i in range(vocab_size - 2)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins tokens with spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", mask_token="<mask>")


def tiny_llama(vocab_size: int = 24, seed: int = 0, hidden: int = 32, layers: int = 2,
               logit_scale: float = 1.0, eos: bool = True, cache: str = "static",
               compiled: bool = False, path: str = "auto") -> DualModeModel:
    """A randomly initialised Llama-architecture dual-mode model in float64 (argmax ties cannot flip), with the
    static cache (``cache="dynamic"``: transformers' own), with ``compiled`` compiled calls, run by the native
    forward (``path="transformers"``: transformers' own)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    # The mask token is never a prediction: every schedule gives the never-emit ids (the mask token's among them)
    # zero probability, as for a trained dual-mode model.
    return DualModeModel(model, tiny_tokenizer(vocab_size), mask_token_id=1, eos_token_id=0 if eos else None,
                         cache=cache, compiled=compiled, path=path)


class ScriptedModel:
    """A dual-mode model whose predictions follow a script (no transformer; the call interface only).

    The verifier continues ``target`` whenever the rows it sees hold the prompt followed by a correct
    prefix of ``target``. The drafter predicts output position k (0-based) correctly iff it sees at
    least ``thresholds[k]`` verified output tokens (paper Assumption 3.1), otherwise a wrong token.
    """

    mask_token_id = 1
    eos_token_id = None
    max_length = 10_000

    def __init__(self, prompt: list[int], target: list[int], thresholds: list[int], vocab_size: int = 16):
        self.prompt, self.target, self.thresholds = list(prompt), list(target), list(thresholds)
        self.vocab_size = vocab_size
        self.cache: list[int] = []

    @property
    def cache_length(self) -> int:
        return len(self.cache)

    def reset(self, tokens: int = 0, block_size: int | None = None) -> None:
        self.cache = []

    def rollback(self, keep: int) -> None:
        assert 0 <= keep <= len(self.cache)
        self.cache = self.cache[:keep]

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))

    def _verified_outputs(self, seen: dict[int, int]) -> int:
        """How many leading output tokens the visible rows hold correctly (-1: prompt not intact)."""
        n = len(self.prompt)
        if any(seen.get(i) != t for i, t in enumerate(self.prompt)):
            return -1
        c = 0
        while seen.get(n + c) == self._truth(c) and c < len(self.target):
            c += 1
        return c

    def _truth(self, k: int) -> int:
        return self.target[k] if k < len(self.target) else 2

    def _wrong(self, k: int) -> int:
        return 2 + (self._truth(k) - 1) % (self.vocab_size - 2)

    def forward(self, layout, rows):
        full = np.asarray(layout.full_mask())
        cached = self.cache[:layout.cached]
        key_positions = np.concatenate([np.arange(len(cached)), np.asarray(layout.position_ids, dtype=np.int64)])
        key_tokens = np.concatenate([np.asarray(cached, dtype=np.int64), np.asarray(layout.token_ids, dtype=np.int64)])
        unmasked = key_tokens != self.mask_token_id
        full = np.concatenate([full[:, :len(cached)], full[:, layout.cached:]], axis=1)  # keys the cache holds
        n = len(self.prompt)
        logits = torch.zeros(len(rows), self.vocab_size, dtype=torch.float64)
        for out_row, r in enumerate(rows):
            visible = full[r] & unmasked  # later keys at a position overwrite earlier ones, as in a dict built in order
            seen = dict(zip(key_positions[visible].tolist(), key_tokens[visible].tolist()))
            position, token = layout.position_ids[r], layout.token_ids[r]
            c = self._verified_outputs(seen)
            if token == self.mask_token_id:  # drafter: predicts its own position
                k = position - n
                known = self.thresholds[min(k, len(self.thresholds) - 1)]
                guess = self._truth(k) if c >= known else self._wrong(k)
            else:  # verifier: predicts the next position
                k = position + 1 - n
                guess = self._truth(k) if c >= k else self._wrong(k)
            logits[out_row, guess] = 10.0
        self.cache.extend(layout.token_ids)
        return CallOutput(logits, 0.0)


def serve(demo):
    """Launch a demo built by ``app.build_demo`` on 127.0.0.1 (as ``python app.py`` does), yield its URL,
    close it afterwards. For module-scoped ``server`` fixtures: ``yield from serve(demo)``."""
    import app

    _, url, _ = demo.launch(prevent_thread_lock=True, quiet=True, **app.launch_kwargs(demo))
    try:
        yield url
    finally:
        demo.close()


def page_event(url: str, name: str, data: list, session: str = "page-visitor", timeout: float = 120) -> tuple:
    """Send the page event called ``name`` (its ``api_name``; private ones included) as the page does, through
    /gradio_api/queue/join, and read its answer: ``("complete", output data)`` or ``("error", message or None)``."""
    import http.client
    import json
    import urllib.request

    config = json.loads(urllib.request.urlopen(url.rstrip("/") + "/config", timeout=30).read())
    fn_index = next(d["id"] for d in config["dependencies"] if d.get("api_name") == name)
    host, port = url.split("//")[1].strip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    body = {"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None}
    conn.request("POST", "/gradio_api/queue/join", json.dumps(body), {"Content-Type": "application/json"})
    answer = conn.getresponse()
    event = json.loads(answer.read().decode())
    assert answer.status == 200, event
    conn.request("GET", f"/gradio_api/queue/data?session_hash={session}")
    stream = conn.getresponse()
    for raw in stream:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        message = json.loads(line[5:])
        if message.get("event_id") not in (None, event["event_id"]) or message.get("msg") != "process_completed":
            continue
        output = message.get("output", {})
        if message.get("success") and "error" not in output:
            return "complete", output.get("data")
        return "error", output.get("error")
    raise AssertionError(f"no answer to {name}")


# --- a tiny checkpoint in Nemotron-Labs-Diffusion's on-disk format -----------------------------------
NLD_MASK_ID, NLD_EOS_ID, NLD_BOS_ID = 100, 11, 1


def nld_config(vocab_size: int = 128, block_size: int = 8) -> dict:
    """config.json of a tiny NLD checkpoint: the real file's fields and types, sizes scaled down.

    The yarn rope keeps NLD's parameters but ``original_max_position_embeddings`` is 64, so prompts in the
    tests cross the position where the Llama-4 query scaling starts (16,384 on the real models).
    """
    return {
        "architectures": ["NemotronLabsDiffusionModel"],
        "model_type": "nemotron_labs_diffusion",
        "auto_map": {"AutoConfig": "configuration_nemotron_labs_diffusion.NemotronLabsDiffusionConfig",
                     "AutoModel": "modeling_nemotron_labs_diffusion.NemotronLabsDiffusionModel"},
        "ar_loss_weight": 1.0, "dlm_loss_weight": None, "dlm_paradigm": "bidirectional",
        "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "attn_implementation": "sdpa",
        "block_size": block_size, "bos_token_id": NLD_BOS_ID, "eos_token_id": NLD_EOS_ID,
        "mask_token_id": NLD_MASK_ID,
        "hidden_act": "silu", "hidden_size": 48, "head_dim": 16, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "initializer_range": 0.02,
        "rope_parameters": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0, "llama_4_scaling_beta": 0.1,
                            "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 64,
                            "rope_theta": 1000000.0, "rope_type": "yarn"},
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "5.0.0", "use_cache": False, "vocab_size": vocab_size,
    }


def nld_tokenizer(vocab_size: int = 128):
    """Word-level tokenizer with NLD's special ids: ``<s>`` 1, ``</s>`` 11, ``[MASK]`` 100."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(vocab_size)]
    words[0], words[NLD_BOS_ID], words[NLD_EOS_ID], words[NLD_MASK_ID] = "<unk>", "<s>", "</s>", "[MASK]"
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   mask_token="[MASK]")


def write_nld_checkpoint(folder, seed: int = 0, logit_scale: float = 4.0, rename: dict | None = None,
                         **sizes) -> dict:
    """Write a random tiny NLD-format checkpoint (config.json, model.safetensors, tokenizer) to ``folder``.

    Tensors carry NLD's names (``encoder.*``, ``diffusion_head.weight``). ``rename`` maps a tensor name to
    another (a broken checkpoint); ``sizes`` override config fields (``head_dim=64``: vLLM's CPU attention takes
    no head of 16). Returns the state dict written (NLD names, float32).
    """
    import json
    from pathlib import Path

    from safetensors.torch import save_file
    from transformers import Ministral3Config, Ministral3ForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {**nld_config(), **sizes}
    torch.manual_seed(seed)
    skip = {"model_type", "architectures", "transformers_version", "torch_dtype"}
    fields = {k: v for k, v in config.items() if k in Ministral3Config.__dataclass_fields__ and k not in skip}
    model = Ministral3ForCausalLM(Ministral3Config(**fields)).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    state = {}
    for name, tensor in model.state_dict().items():
        name = name.replace("model.", "encoder.", 1) if name.startswith("model.") else name
        name = "diffusion_head.weight" if name == "lm_head.weight" else name
        state[(rename or {}).get(name, name)] = tensor.contiguous()
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    nld_tokenizer(config["vocab_size"]).save_pretrained(folder)
    return state


def write_lora_adapter(folder, base_state: dict, rank: int = 4, alpha: int = 16, seed: int = 1,
                       targets: tuple[str, ...] = ("o_proj",)) -> None:
    """Write a random LoRA adapter in peft's on-disk format for an NLD checkpoint (``encoder.*`` names).

    adapter_config.json + adapter_model.safetensors with keys
    ``base_model.model.encoder.layers.N.self_attn.o_proj.lora_{A,B}.weight``, as the released
    ``linear_spec_lora`` folder has (rank 128, alpha 512 there).
    """
    import json
    from pathlib import Path

    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, weight in base_state.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in targets:
            out_features, in_features = weight.shape
            a = torch.randn(rank, in_features, generator=generator) * 0.3
            b = torch.randn(out_features, rank, generator=generator) * 0.3  # non-zero: the adapter changes drafts
            tensors[f"base_model.model.{module}.lora_A.weight"] = a
            tensors[f"base_model.model.{module}.lora_B.weight"] = b
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": None, "r": rank, "lora_alpha": alpha, "lora_dropout": 0.0,
              "bias": "none", "target_modules": list(targets), "fan_in_fan_out": False, "use_rslora": False,
              "base_model_name_or_path": None, "inference_mode": True}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))


def tiny_any_order(vocab_size: int = 24, seed: int = 0, logit_scale: float = 4.0, eos: bool = True) -> DualModeModel:
    """A tiny random any-order model (float64): :func:`tiny_llama` with ``any_order`` set and a zero mask
    embedding, so a mask row's prediction comes from the context it sees (varied, order-dependent outputs)."""
    model = tiny_llama(vocab_size=vocab_size, seed=seed, logit_scale=logit_scale, eos=eos)
    with torch.no_grad():
        model.model.model.embed_tokens.weight[model.mask_token_id].zero_()
    model.model.config.any_order = True
    model.any_order = True
    return model


# --- a tiny checkpoint in SetDLM's on-disk format (kuleshov-group/setdlms) -----------------------------
SETDLM_MASK_ID, SETDLM_EOS_ID, SETDLM_PAD_ID = 3, 0, 2
SETDLM_LENGTH = 64  # the denoiser's training context ("length"); its stored mask is 2 * length square


def qwen3_base_config(vocab_size: int = 32, layers: int = 3) -> dict:
    """config.json of a tiny Qwen3 base model in the hub's (transformers 4.x) format: ``rope_theta`` and
    ``torch_dtype`` at the top level, tied embeddings, as Qwen/Qwen3-1.7B-Base's file has them."""
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "bos_token_id": SETDLM_EOS_ID, "eos_token_id": SETDLM_EOS_ID,
        "head_dim": 8, "hidden_act": "silu", "hidden_size": 32, "initializer_range": 0.02,
        "intermediate_size": 64, "max_position_embeddings": 512, "max_window_layers": layers,
        "num_attention_heads": 4, "num_hidden_layers": layers, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
        "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab_size,
    }


def setdlm_config(base: str, vocab_size: int = 32, model_type: str = "bd3lm", wrapped: bool = True,
                  keep: int = 2) -> dict:
    """config.json as SetDLM's ``save_pretrained`` writes it: the denoiser's fields, ``backbone_config``
    (a Hydra spec naming the base model), ``tokenization_config`` (special ids, copied to the top level)."""
    if wrapped:
        backbone = {"_target_": "backbone_automodel.AutoModelFromPreTrained", "automodel_cls": "AutoModelForCausalLM",
                    "pretrained_model_name_or_path": base, "trust_remote_code": True, "keep_bottom_n_layers": keep,
                    "reinit_model": False}
    else:
        backbone = {"_target_": "transformers.AutoModelForCausalLM.from_pretrained",
                    "pretrained_model_name_or_path": base, "revision": None, "trust_remote_code": True}
    tokenization = {"vocab_size": vocab_size, "mask_token_id": SETDLM_MASK_ID, "pad_token_id": SETDLM_PAD_ID,
                    "bos_token_id": None, "eos_token_id": SETDLM_EOS_ID, "pad_vocab_size_multiple": 1}
    return {
        "architectures": ["SetDLM"], "model_type": model_type,
        "auto_map": {"AutoConfig": "bd3lm.BD3LMConfig", "AutoModel": "setdlm.SetDLM",
                     "AutoModelForMaskedLM": "setdlm.SetDLM"},
        "attn_backend": "sdpa", "backbone_config": backbone, "backbone_is_decoder_only": False,
        "block_size": SETDLM_LENGTH, "eval_block_size": SETDLM_LENGTH, "keep_clean_bos": None,
        "length": SETDLM_LENGTH, "max_length": None, "shift_logits": True, "time_conditioned_backbone": False,
        "noise_config": {"_target_": "noise_schedule_noise_schedules.StaggeredNoise", "block_size": 8,
                         "length": SETDLM_LENGTH},
        "sampler_config": None, "tokenization_config": tokenization, "tokenizer_name": "Qwen/Qwen3-1.7B-Base",
        "torch_dtype": "float32", "transformers_version": "4.51.0", **{k: v for k, v in tokenization.items()
                                                                      if k != "pad_vocab_size_multiple"},
    }


def write_setdlm_checkpoint(folder, seed: int = 0, logit_scale: float = 4.0, rename: dict | None = None,
                            weights: str = "bin", model_type: str = "bd3lm", wrapped: bool = True,
                            sharpness: float = 1.0, automodel_cls: str = "AutoModelForCausalLM") -> dict:
    """Write a random tiny SetDLM checkpoint to ``folder`` and its Qwen3 base model's config.json to
    ``folder/base`` (a local stand-in for Qwen/Qwen3-1.7B-Base; the checkpoint's config names it).

    The wrapped backbone keeps the bottom 2 of the base's 3 layers (the direct one all 3); tensors carry the denoiser's prefixes
    (``backbone.model.`` wrapped, ``backbone.`` direct) plus SetDLM's stored ``static_attention_mask``
    buffer; ``weights`` "bin" writes pytorch_model.bin (what SetDLM's code saves), "safetensors"
    model.safetensors. The mask token's embedding is zero, so a mask row's prediction depends on the context
    it sees. ``rename`` maps a stored name to another (a broken checkpoint). ``sharpness`` scales the final
    norm's weight, hence every logit (above 1: confident predictions, some over a commit threshold);
    ``automodel_cls`` goes into the wrapped backbone spec. Returns the Qwen3 state dict written
    (transformers' own names, float32).
    """
    import json
    from pathlib import Path

    from safetensors.torch import save_file
    from transformers import AutoConfig, Qwen3ForCausalLM

    folder = Path(folder)
    base = folder / "base"
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.json").write_text(json.dumps(qwen3_base_config(), indent=2))
    config = AutoConfig.from_pretrained(base)
    kept = 2 if wrapped else 3  # the wrapper cuts the base's 3 layers to 2; the bare from_pretrained cannot
    config.num_hidden_layers, config.layer_types = kept, config.layer_types[:kept]
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float()
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(logit_scale)
        model.model.embed_tokens.weight[SETDLM_MASK_ID].zero_()
        model.model.norm.weight.mul_(sharpness)
    own = {name: tensor.clone().contiguous() for name, tensor in model.state_dict().items()}
    prefix = "backbone.model." if wrapped else "backbone."
    # Tied embeddings: the .bin pickle keeps both names; safetensors files keep only the embedding.
    stored = {prefix + name: tensor for name, tensor in own.items() if weights == "bin" or name != "lm_head.weight"}
    rows = torch.arange(2 * SETDLM_LENGTH)
    stored["static_attention_mask"] = rows[:, None] >= rows[None, :]  # stands in for SetDLM's training mask
    stored = {(rename or {}).get(name, name): tensor for name, tensor in stored.items()}
    if weights == "bin":
        torch.save(stored, folder / "pytorch_model.bin")
    else:
        save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = setdlm_config(str(base), model_type=model_type, wrapped=wrapped)
    if wrapped:
        config["backbone_config"]["automodel_cls"] = automodel_cls
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    setdlm_tokenizer().save_pretrained(folder)
    return own


def setdlm_tokenizer(vocab_size: int = 32):
    """Word-level tokenizer with the fixture's special ids: ``<eos>`` 0, ``<pad>`` 2, ``<mask>`` 3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = [f"w{i}" for i in range(vocab_size)]
    words[SETDLM_EOS_ID], words[SETDLM_PAD_ID], words[SETDLM_MASK_ID] = "<eos>", "<pad>", "<mask>"
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<pad>", pad_token="<pad>", eos_token="<eos>",
                                   mask_token="<mask>")
