"""Model families: how a checkpoint on disk or on the hub becomes the ``transformers`` model the adapter runs.

Each family (one file each) reads a checkpoint's ``config.json`` and returns a :class:`Checkpoint`: a
``transformers`` causal LM whose ``forward`` takes an explicit 4D boolean mask, position ids and a
``DynamicCache``, plus its tokenizer and special ids. The family is detected from the config
(``model_type``, ``architectures``) or forced by name (``--family``).

Loading is strict in every family: a checkpoint that leaves any parameter freshly initialised, or holds
tensors the model does not use, is refused with the keys named (a silently random model is the worst
failure a decoding demo can have).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from packed_ss.models.adapter import ModelLoadError, some


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint, ready for :class:`~packed_ss.models.DualModeModel`.

    Attributes:
        model: the ``transformers`` causal LM (eval mode, on its device and dtype).
        tokenizer: its tokenizer.
        mask_token_id, eos_token_id, bos_token_id: special ids (bos is prepended to every prompt when set).
        family: the family's name.
        adapter_name: maps an adapter tensor's module path (checkpoint names) to the loaded model's
            (NLD renames ``encoder.`` to ``model.``); used by the drafter LoRA loader.
        source: local folder the files came from (hub checkpoints: the local snapshot).
    """

    model: Any
    tokenizer: Any
    mask_token_id: int
    eos_token_id: int | None
    bos_token_id: int | None
    family: str
    adapter_name: Callable[[str], str] = field(default=lambda name: name)
    source: Path | None = None


class Family(Protocol):
    """One model family (see the module docstring)."""

    name: str
    summary: str

    def matches(self, config: dict) -> bool:
        """Whether ``config.json`` (as a dict) is this family's."""
        ...

    def load(self, name: str, config: dict, dtype, device: str, local_only: bool) -> Checkpoint:
        """Load ``name`` (folder or hub id) in ``dtype`` straight onto ``device`` (no CPU copy of a GPU
        model). Raises: ModelLoadError."""
        ...


def families() -> dict[str, Family]:
    """Registry of the families by name, most specific first (detection tries them in this order)."""
    from packed_ss.models.nemotron import NemotronLabsDiffusion
    from packed_ss.models.plain import PlainCausalLM

    found = (NemotronLabsDiffusion(), PlainCausalLM())
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


def refuse_partial_load(name: str, info: dict, ignored: Callable[[str], bool] = lambda key: False) -> None:
    """Raise ModelLoadError when ``from_pretrained``'s loading info shows missing, unexpected or
    mismatched keys (``ignored`` unexpected keys excepted), naming up to five of each."""
    missing = set(info.get("missing_keys") or ())
    unexpected = {k for k in info.get("unexpected_keys") or () if not ignored(k)}
    mismatched = {k if isinstance(k, str) else k[0] for k in info.get("mismatched_keys") or ()}
    problems = []
    if missing:
        problems.append(f"missing (would be random): {some(missing, 5)}")
    if unexpected:
        problems.append(f"not used by the model: {some(unexpected, 5)}")
    if mismatched:
        problems.append(f"wrong shape: {some(mismatched, 5)}")
    if problems:
        raise ModelLoadError(f"refusing {name!r}: its weights do not all map onto the model; "
                             + "; ".join(problems))
