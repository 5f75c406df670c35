"""Plain family: a ``transformers`` causal LM that already has a mask token (the embedded model's kind).

Loaded with ``AutoModelForCausalLM`` from its own config; the mask id comes from ``config.mask_token_id``
or the tokenizer's mask token, EOS from the tokenizer (else the config). No BOS is added to prompts.
"""

from __future__ import annotations

from packed_ss.models.checkpoint import Checkpoint, refuse_partial_load
from packed_ss.models.errors import ModelLoadError


class PlainCausalLM:
    name = "plain"
    summary = "a transformers causal LM with a mask token (config.mask_token_id or tokenizer.mask_token)"
    default_dtype = None

    def matches(self, config: dict) -> bool:
        return True  # the fallback: anything AutoModelForCausalLM knows

    def load(self, name: str, config: dict, dtype, device: str, local_only: bool) -> Checkpoint:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if config.get("auto_map"):  # never run a checkpoint's own code; never ask whether to
            raise ModelLoadError(f"{name!r} declares remote code (auto_map, model_type "
                                 f"{config.get('model_type')!r}); packed-ss only loads families it implements "
                                 f"natively (leave --family out to detect one, e.g. nemotron)")
        tokenizer = AutoTokenizer.from_pretrained(name, local_files_only=local_only, trust_remote_code=False)
        model, info = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, device_map=device,
                                                           attn_implementation="sdpa", local_files_only=local_only,
                                                           output_loading_info=True, trust_remote_code=False,
                                                           ignore_mismatched_sizes=True)  # named below
        refuse_partial_load(name, info)
        mask_id = getattr(model.config, "mask_token_id", None)
        if mask_id is None:
            mask_id = tokenizer.mask_token_id
        if mask_id is None:
            raise ModelLoadError(f"model {name!r} has no mask token id (config.mask_token_id or tokenizer.mask_token)")
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else model.config.eos_token_id
        if isinstance(eos, list):
            eos = eos[0]
        return Checkpoint(model, tokenizer, int(mask_id), eos, None, self.name)
