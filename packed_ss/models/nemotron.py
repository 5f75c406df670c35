"""Nemotron-Labs-Diffusion (NLD) family, loaded natively: no remote code, no ``trust_remote_code``.

An NLD checkpoint (``model_type: nemotron_labs_diffusion``) is a Ministral3-shaped decoder: GQA,
SwiGLU, RMSNorm, yarn rope with the Llama-4 query scaling. Its config is mapped onto
``transformers``' ``Ministral3Config`` and the weights onto ``Ministral3ForCausalLM`` by renaming
``encoder.*`` to ``model.*`` and ``diffusion_head.weight`` to ``lm_head.weight`` (the released
checkpoints do not tie it to the embeddings). Mask (100 on the released models), EOS and BOS ids come
from the config. Diffusion mode is nothing but the attention mask here: the adapter passes every call an
explicit 4D boolean mask and explicit position ids, so one call can hold causal verifier rows and
bidirectional drafter rows (paper Appendix D.1).

Positions: the Llama-4 query scale ``1 + beta * log(1 + floor(pos / original_max_position_embeddings))``
is computed by ``Ministral3Attention`` from the explicit position ids, so rows that share a position
(the two halves of a packed call) get the same scale; it is exactly 1 below 16,384 positions on the
released models. The adapter allows sequences up to ``max_position_embeddings`` (262,144 there); the
app's per-request row budget refuses prompts far shorter than that.
"""

from __future__ import annotations

from packed_ss.models.checkpoint import Checkpoint, refuse_partial_load
from packed_ss.models.errors import ModelLoadError

MODEL_TYPE = "nemotron_labs_diffusion"
ARCHITECTURE = "NemotronLabsDiffusionModel"
# Rope settings Ministral3's attention reads (yarn, and the Llama-4 query scaling).
ROPE_FIELDS = ("rope_type", "rope_theta", "original_max_position_embeddings", "llama_4_scaling_beta")
# Checkpoint name -> transformers' Ministral3ForCausalLM name (regular expressions, as key_mapping takes).
KEY_MAPPING = {r"^encoder\.": "model.", r"^diffusion_head\.": "lm_head."}
# config.json fields that carry over to Ministral3Config unchanged (the rest are NLD training knobs).
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                 "rope_parameters", "sliding_window", "tie_word_embeddings", "bos_token_id", "eos_token_id",
                 "initializer_range", "attention_dropout")


def adapter_module_name(name: str) -> str:
    """A module path in NLD's names (``encoder.layers.3.self_attn.o_proj``) in the loaded model's names."""
    return "model." + name[len("encoder."):] if name.startswith("encoder.") else name


def ministral_config(config: dict):
    """``Ministral3Config`` of an NLD ``config.json``. Raises: ModelLoadError for a shape it cannot hold."""
    from transformers import Ministral3Config

    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise ModelLoadError(f"NLD config has {flag}: true, which Ministral3 layers do not have")
    if config.get("rope_parameters") is None and config.get("rope_scaling") is not None:
        config = {**config, "rope_parameters": config["rope_scaling"]}
    rope = config.get("rope_parameters") or {}
    missing = [k for k in ROPE_FIELDS if k not in rope]
    if missing:
        raise ModelLoadError(f"config.json has no rope_parameters {', '.join(missing)}, which every "
                             f"Nemotron-Labs-Diffusion checkpoint carries (model_type {config.get('model_type')!r}: "
                             f"is this an NLD checkpoint? leave --family out to detect the family)")
    fields = {k: config[k] for k in CONFIG_FIELDS if k in config}
    if isinstance(fields.get("eos_token_id"), list):
        fields["eos_token_id"] = fields["eos_token_id"][0]
    try:
        mapped = Ministral3Config(**fields)
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"NLD config does not map onto Ministral3Config: {error}") from error
    mapped._attn_implementation = "sdpa"
    return mapped


class NemotronLabsDiffusion:
    name = "nemotron"
    summary = "Nemotron-Labs-Diffusion (nvidia/Nemotron-Labs-Diffusion-3B/8B/14B), loaded as Ministral3"
    default_dtype = None

    def matches(self, config: dict) -> bool:
        return config.get("model_type") == MODEL_TYPE or ARCHITECTURE in (config.get("architectures") or ())

    def load(self, name: str, config: dict, dtype, device: str, local_only: bool) -> Checkpoint:
        from transformers import AutoTokenizer, Ministral3ForCausalLM

        if config.get("mask_token_id") is None:
            raise ModelLoadError(f"NLD checkpoint {name!r} has no mask_token_id in its config.json")
        mapped = ministral_config(config)
        # Passing the mapped config keeps both loaders away from config.json's auto_map (remote code).
        tokenizer = AutoTokenizer.from_pretrained(name, config=mapped, local_files_only=local_only,
                                                  trust_remote_code=False)
        model, info = Ministral3ForCausalLM.from_pretrained(
            name, config=mapped, key_mapping=KEY_MAPPING, dtype=dtype, device_map=device,
            attn_implementation="sdpa", local_files_only=local_only, output_loading_info=True,
            trust_remote_code=False, ignore_mismatched_sizes=True)  # mis-shaped tensors: named below
        # Rotary frequencies are recomputed from the config; a checkpoint that stored them loses nothing.
        refuse_partial_load(name, info, ignored=lambda key: key.endswith("rotary_emb.inv_freq"))
        eos = config.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) else eos
        return Checkpoint(model, tokenizer, int(config["mask_token_id"]), eos, config.get("bos_token_id"),
                          self.name, adapter_module_name)
