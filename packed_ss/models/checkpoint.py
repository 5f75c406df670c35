"""What a model family returns: a loaded :class:`Checkpoint`, the :class:`Family` protocol, and the strict
load check every family applies (:func:`refuse_partial_load`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from packed_ss.models.errors import ModelLoadError, some


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
    default_dtype: str | None  # dtype when the caller names none (None: float32 on CPU, bfloat16 on CUDA)

    def matches(self, config: dict) -> bool:
        """Whether ``config.json`` (as a dict) is this family's."""
        ...

    def load(self, name: str, config: dict, dtype, device: str, local_only: bool) -> Checkpoint:
        """Load ``name`` (folder or hub id) in ``dtype`` straight onto ``device`` (no CPU copy of a GPU
        model). The setdlm family also takes ``base_model`` (a local copy of the base model's config).
        Raises: ModelLoadError."""
        ...


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
