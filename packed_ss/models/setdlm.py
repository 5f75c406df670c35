"""SetDLM family (kuleshov-group/setdlms), loaded natively: no remote code, no ``trust_remote_code``.

What SetDLM's own code writes (read from ``src/denoiser/base.py``, ``bd3lm.py``, ``setdlm.py``,
``src/backbone/automodel.py`` and ``src/utils.py``; this loader is written from those facts only):

* ``config.json`` is a denoiser config, not a model config: ``model_type`` ``bd3lm`` (the config class
  SetDLM inherits; ``denoiser`` for the base class), ``architectures: ["SetDLM"]``, ``auto_map`` to the
  copied source files, and ``backbone_config``, a Hydra spec of the network: ``_target_``
  (``...automodel.AutoModelFromPreTrained``, which holds the causal LM as ``.model``, or
  ``transformers.AutoModelForCausalLM.from_pretrained`` itself), ``automodel_cls``,
  ``pretrained_model_name_or_path`` (the base model, e.g. ``Qwen/Qwen3-1.7B-Base``) and a layer cut
  (``keep_bottom_n_layers``, ``keep_every_n_layers`` or ``num_layers`` + ``keep_top_layers``, depending on
  the code's version). ``tokenization_config`` holds ``mask_token_id``, ``pad_token_id``,
  ``bos_token_id``, ``eos_token_id`` and ``vocab_size`` (also copied to the top level); ``length`` is the
  training context, ``tokenizer_name`` the tokenizer's hub id.
* The backbone's architecture is the base model's ``config.json`` (a hub id, or a local folder given with
  ``base_model``), with the layers cut as the spec says; the weights are all in the checkpoint.
* Weights: ``pytorch_model.bin`` (the code saves with ``safe_serialization=False``) or
  ``model.safetensors`` (a converted copy), names prefixed by the wrapper: ``backbone.model.`` in front of
  a causal LM's own names (``model.layers.*``, ``lm_head.weight``), or ``backbone.`` for the unwrapped
  target. ``static_attention_mask`` (SetDLM's training mask, a buffer derived from ``length``) may be
  stored too; it is not a weight and is skipped by name.

The network is plain ``transformers``: SetDLM's ``CustomQwen3ForCausalLM`` differs from
``Qwen3ForCausalLM`` only by casting queries and keys to the values' dtype after the cache update, which
is the identity here (queries, keys, values and cache share the model's dtype; ``tests/test_setdlm.py``
checks it). SetDLM's ``AutoModelFromPreTrained`` builds that Qwen3 class whatever ``automodel_cls`` says
(``AutoModel`` is its configs' default), so every value is accepted and the weights decide (a missing LM
head is refused by the strict load). The loaded class is :class:`SetDLMQwen3`, ``Qwen3ForCausalLM`` with
SetDLM's stored mask buffers declared as no weights, so loading prints no report about them.

Attention kernel: ``CustomQwen3Attention`` runs eager attention whenever the mask is 4D (always, in SetDLM's
decoding); this loader uses sdpa, whose sums run in another order, so logits differ from SetDLM's at about
1e-4 in float32 (1e-12 in float64) and a near tie between two tokens or two confidences can break the other
way. ``attention="eager"`` loads the eager kernel, fed an additive mask as SetDLM feeds it, for exact agreement
(bit for bit with the dynamic cache; the static cache's wider key span still rounds at about 1e-7).

Decoding context: ``length`` (1,024 for the released checkpoints) is SetDLM's context; its decoder crops the
KV cache from the left once a call would exceed it (``src/denoiser/setdlm.py``
``_prepare_inputs_inference``). The loaded config carries it as ``context_length`` and the noise
schedule's window (``noise_config.block_size``, what ``compute_window_size`` returns) as
``native_window``; :mod:`packed_ss.any_order` crops likewise and records it. The any-order input (token entries and mask entries sharing position ids; a mask sees the
tokens strictly earlier in the generation order and itself) is built by :mod:`packed_ss.any_order`;
the loaded config says ``any_order: true`` so the engine runs those schedules. Float32 by default (the
paper's setting for SetDLM).
"""

from __future__ import annotations

import functools

from packed_ss.models.checkpoint import Checkpoint, refuse_partial_load
from packed_ss.models.errors import ModelLoadError, local_folder

DENOISER_TYPES = ("denoiser", "bd3lm")  # model_type of SetDLM's config classes (base class, SetDLM's own)
ARCHITECTURE = "SetDLM"
# Backbone targets whose weights are a causal LM's, and the prefix the denoiser adds in front of its names.
WRAPPED, DIRECT = "AutoModelFromPreTrained", "AutoModelForCausalLM.from_pretrained"
PREFIXES = {WRAPPED: "backbone.model.", DIRECT: "backbone."}
# Stored buffers of the denoiser that are no weights (derived from the config by SetDLM's own code).
NOT_WEIGHTS = ("static_attention_mask", "encoder_static_attention_mask")
SPECIAL_IDS = ("mask_token_id", "eos_token_id", "bos_token_id", "pad_token_id")
ATTENTIONS = ("sdpa", "eager")  # the engine's kernel, and the one SetDLM's CustomQwen3Attention runs for 4D masks


def is_denoiser_config(config: dict) -> bool:
    """Whether ``config.json`` has the shape SetDLM's code saves (a denoiser around a backbone spec)."""
    return (config.get("model_type") in DENOISER_TYPES or ARCHITECTURE in (config.get("architectures") or ())) \
        and isinstance(config.get("backbone_config"), dict)


def special_ids(config: dict) -> dict[str, int | None]:
    """mask/EOS/BOS/pad ids: ``tokenization_config`` first, the top-level copies second (as DenoiserConfig
    sets them). An EOS list gives its first id."""
    tokenization = config.get("tokenization_config") or {}
    found = {}
    for key in SPECIAL_IDS:
        value = tokenization.get(key, config.get(key))
        found[key] = value[0] if isinstance(value, list) and value else value
    return found


def backbone_target(name: str, config: dict) -> tuple[str, str]:
    """(prefix of the backbone's weight names, base model id or folder) of a SetDLM config.

    Raises: ModelLoadError for a denoiser class other than SetDLM, or a backbone this loader cannot map.
    """
    architectures = config.get("architectures") or []
    if architectures and ARCHITECTURE not in architectures:
        raise ModelLoadError(f"{name!r} is a {', '.join(architectures)} checkpoint of SetDLM's code base, not a "
                             f"SetDLM (any-order) model; only SetDLM checkpoints decode with these schedules")
    spec = config["backbone_config"]
    target = str(spec.get("_target_", ""))
    kind = next((k for k in PREFIXES if target.endswith(k)), None)
    if kind is None:
        raise ModelLoadError(f"SetDLM backbone {target!r} is not supported: only a causal LM backbone "
                             f"(AutoModelFromPreTrained or AutoModelForCausalLM.from_pretrained) is mapped")
    # automodel_cls is not checked: SetDLM's wrapper always builds its Qwen3 causal LM (automodel.py).
    base = spec.get("pretrained_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise ModelLoadError(f"SetDLM config of {name!r} names no base model "
                             f"(backbone_config.pretrained_model_name_or_path)")
    return PREFIXES[kind], base


def kept_layers(spec: dict, layers: int) -> list[int]:
    """Indices of the base model's layers the backbone keeps, as SetDLM's wrapper cuts them.

    ``keep_bottom_n_layers`` n: the first n (-1: all); ``keep_every_n_layers`` k: layers i with
    (i + 1) % k == 0; ``num_layers`` n with ``keep_top_layers``: the last n, else the first n (-1: all).
    Raises: ModelLoadError for a cut that keeps no layer or more than the base has.
    """
    bottom = spec.get("keep_bottom_n_layers", -1)
    every = spec.get("keep_every_n_layers", 1)
    count = spec.get("num_layers", -1)
    for value in (bottom, every, count):
        if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != -1):
            raise ModelLoadError(f"SetDLM backbone layer cut {value!r} is not a positive integer or -1")
    keep = list(range(layers))
    if isinstance(bottom, int) and bottom != -1:
        keep = keep[:bottom]
    if isinstance(every, int) and every > 1:
        keep = [i for i in keep if (i + 1) % every == 0]
    if isinstance(count, int) and count != -1:
        keep = keep[-count:] if spec.get("keep_top_layers") else keep[:count]
    for knob, value in (("keep_bottom_n_layers", bottom), ("num_layers", count), ("keep_every_n_layers", every)):
        if value > layers:
            raise ModelLoadError(f"SetDLM backbone_config.{knob} is {value}, more than the base model's {layers} "
                                 f"layers (is the base model the checkpoint's?)")
    if not keep:
        raise ModelLoadError(f"SetDLM backbone cut keeps none of the base model's {layers} layers "
                             f"(keep_bottom_n_layers {bottom}, keep_every_n_layers {every}, num_layers {count})")
    return keep


def backbone_config(base: str, spec: dict, local_only: bool, attention: str = "sdpa"):
    """The base model's ``transformers`` config with the layers cut as ``spec`` says (only its config.json is
    read; the weights are the checkpoint's), attention kernel ``attention``.

    Raises: ModelLoadError for an unreadable config, or a base that is not Qwen3 (SetDLM's wrapper always
    builds ``CustomQwen3ForCausalLM``, ``src/backbone/automodel.py``)."""
    from transformers import AutoConfig

    try:
        local_folder(base, "the SetDLM base model")
    except ModelLoadError as error:
        raise ModelLoadError(f"{error} (--base-model takes a local copy of the base model's config.json)") from None
    try:
        mapped = AutoConfig.from_pretrained(base, local_files_only=local_only, trust_remote_code=False)
    except Exception as error:  # noqa: BLE001 - offline, unknown model_type, remote code: one message
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelLoadError(f"cannot read the SetDLM base model config {base!r} (give a local copy of its "
                             f"config.json with --base-model): {first}") from error
    if mapped.model_type != "qwen3":
        raise ModelLoadError(f"SetDLM base model {base!r} is {mapped.model_type!r}; SetDLM's code always builds a "
                             f"Qwen3 backbone (CustomQwen3ForCausalLM), so only a Qwen3 base is mapped")
    layers = int(mapped.num_hidden_layers)
    keep = kept_layers(spec, layers)
    mapped.num_hidden_layers = len(keep)
    layer_types = getattr(mapped, "layer_types", None)
    if isinstance(layer_types, list) and len(layer_types) == layers:
        mapped.layer_types = [layer_types[i] for i in keep]
    mapped._attn_implementation = attention
    return mapped


def decoding_context(config: dict) -> tuple[int | None, int | None]:
    """(SetDLM's context ``length``, its noise schedule's window ``noise_config.block_size``), None where
    absent: ``_prepare_inputs_inference`` crops the KV cache to the first, ``generate`` takes
    ``min(noise.compute_window_size(), max_window_size)`` as its window, and both schedules' (staggered,
    linear) ``compute_window_size`` return ``block_size`` (``src/noise_schedule/noise_schedules.py``)."""
    noise = config.get("noise_config") or {}
    values = (config.get("length"), noise.get("block_size") if isinstance(noise, dict) else None)
    return tuple(v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None for v in values)


class SetDLMFamily:
    name = "setdlm"
    summary = "SetDLM (kuleshov-group/setdlm-gsm8k-smax8/16/32): a denoiser around a Qwen3 causal LM"
    default_dtype = "float32"  # the paper runs SetDLM in float32 (Section 4.1, Appendix E.1)

    def matches(self, config: dict) -> bool:
        return is_denoiser_config(config)

    def load(self, name: str, config: dict, dtype, device: str, local_only: bool,
             base_model: str | None = None, attention: str = "sdpa") -> Checkpoint:
        """The checkpoint as ``SetDLMQwen3`` (``attention``: ``"sdpa"``, or ``"eager"`` as SetDLM runs it).

        Raises: ModelLoadError (see the module docstring)."""
        if attention not in ATTENTIONS:
            raise ModelLoadError(f"SetDLM attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        if not is_denoiser_config(config):
            raise ModelLoadError(f"{name!r} has no backbone_config (model_type {config.get('model_type')!r}): "
                                 f"is this a SetDLM checkpoint? leave --family out to detect the family")
        prefix, base = backbone_target(name, config)
        ids = special_ids(config)
        if ids["mask_token_id"] is None:
            raise ModelLoadError(f"SetDLM checkpoint {name!r} has no mask_token_id in its tokenization_config")
        mapped = backbone_config(base_model or base, config["backbone_config"], local_only, attention)
        mapped.any_order = True  # the engine's any-order schedules (packed_ss.any_order)
        mapped.context_length, mapped.native_window = decoding_context(config)
        mapped.native_decoding = "setdlm"  # the diffusion lane follows SetDLM's generate (any_order/setdlm_native.py)
        mapped.mask_token_id = int(ids["mask_token_id"])
        tokenizer = self._tokenizer(name, config, mapped, local_only)
        model, info = _load_weights(name, mapped, prefix, dtype, device, local_only, attention)
        refuse_partial_load(name, info, ignored=lambda key: key in NOT_WEIGHTS
                            or key.endswith("rotary_emb.inv_freq"))
        return Checkpoint(model, tokenizer, int(ids["mask_token_id"]), ids["eos_token_id"], ids["bos_token_id"],
                          self.name)

    @staticmethod
    def _tokenizer(name: str, config: dict, mapped, local_only: bool):
        """The checkpoint's own tokenizer files (the code saves them beside the weights), else
        ``tokenizer_name``. Raises: ModelLoadError when neither loads."""
        from transformers import AutoTokenizer

        tried = []
        for source in dict.fromkeys([name, config.get("tokenizer_name")]):
            if not isinstance(source, str) or not source:
                continue
            try:
                # The mapped config keeps the loader away from config.json's auto_map (remote code).
                return AutoTokenizer.from_pretrained(source, config=mapped, local_files_only=local_only,
                                                     trust_remote_code=False)
            except Exception as error:  # noqa: BLE001 - no tokenizer files there: try the next source
                tried.append(f"{source!r} ({type(error).__name__})")
        raise ModelLoadError(f"SetDLM checkpoint {name!r}: no tokenizer could be loaded from {', '.join(tried)}")


def _load_weights(name: str, mapped, prefix: str, dtype, device: str, local_only: bool, attention: str):
    """:class:`SetDLMQwen3` ``.from_pretrained`` of the checkpoint's weights under ``mapped``, the denoiser's
    prefix stripped from every name; returns (model, loading info)."""
    import re

    return _qwen3_class().from_pretrained(
        name, config=mapped, key_mapping={"^" + re.escape(prefix): ""}, dtype=dtype, device_map=device,
        attn_implementation=attention, local_files_only=local_only, output_loading_info=True, trust_remote_code=False,
        ignore_mismatched_sizes=True)  # mis-shaped tensors come back in the loading info, named by refuse_partial_load


@functools.cache
def _qwen3_class():
    """``Qwen3ForCausalLM`` with SetDLM's stored mask buffers (:data:`NOT_WEIGHTS`) declared as no weights, so
    transformers drops them without a load report; nothing else differs. Built on first use (transformers is
    imported lazily, as everywhere in this module)."""
    from transformers import Qwen3ForCausalLM

    class SetDLMQwen3(Qwen3ForCausalLM):
        _keys_to_ignore_on_load_unexpected = [rf"^{key}$" for key in NOT_WEIGHTS]

    return SetDLMQwen3
