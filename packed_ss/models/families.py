"""Model families: how a checkpoint on disk or on the hub becomes the ``transformers`` model the adapter runs.

Each family (one file each) reads a checkpoint's ``config.json`` and returns a :class:`Checkpoint`: a
``transformers`` causal LM whose ``forward`` takes an explicit 4D boolean mask, position ids and a
``DynamicCache``, plus its tokenizer and special ids. Families: ``nemotron`` (Nemotron-Labs-Diffusion),
``setdlm`` (SetDLM's denoiser checkpoints, any-order) and ``plain`` (anything ``AutoModelForCausalLM``
loads that has a mask token). The family is detected from the config
(``model_type``, ``architectures``) or forced by name (``--family``).

Loading is strict in every family: a checkpoint that leaves any parameter freshly initialised, or holds
tensors the model does not use, is refused with the keys named (a silently random model is the worst
failure a decoding demo can have).
"""

from __future__ import annotations

import json
from pathlib import Path

from packed_ss.models.checkpoint import Family
from packed_ss.models.errors import ModelLoadError
from packed_ss.models.nemotron import NemotronLabsDiffusion
from packed_ss.models.plain import PlainCausalLM
from packed_ss.models.setdlm import SetDLMFamily


def families() -> dict[str, Family]:
    """Registry of the families by name, most specific first (detection tries them in this order)."""
    found = (NemotronLabsDiffusion(), SetDLMFamily(), PlainCausalLM())
    return {f.name: f for f in found}


def read_config(name: str, local_only: bool) -> dict:
    """``config.json`` of a folder or hub id as a dict. Raises: ModelLoadError when it cannot be read."""
    local = Path(name).expanduser()
    try:
        if local.is_dir():
            path = local / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            path = Path(hf_hub_download(name, "config.json", local_files_only=local_only))
        config = json.loads(path.read_text(encoding="utf-8"))
    except Exception as error:  # noqa: BLE001 - hub errors, bad JSON, unreadable file: one message
        raise ModelLoadError(f"cannot read config.json of {name!r}: {type(error).__name__}: "
                             f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"config.json of {name!r} is not a JSON object")
    return config


def says_any_order(config: dict) -> bool:
    """Whether a ``config.json`` describes an any-order model (paper Appendix C): ``any_order: true``, or a
    SetDLM checkpoint (the setdlm family sets the flag when it loads one)."""
    return config.get("any_order") is True or SetDLMFamily().matches(config)


def pick_family(config: dict, forced: str | None = None) -> Family:
    """The family named ``forced``, else the first whose ``matches(config)`` holds.

    Raises: ModelLoadError for an unknown family name.
    """
    registry = families()
    if forced:
        if forced not in registry:
            raise ModelLoadError(f"unknown model family {forced!r}; choose one of {', '.join(registry)}")
        return registry[forced]
    for family in registry.values():
        if family.matches(config):
            return family
    return registry["plain"]
