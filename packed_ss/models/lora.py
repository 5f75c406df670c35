"""Proposal-only drafter LoRA (paper Appendix F.2, Tables 4-5), loaded with ``peft``.

A drafter adapter (NLD ships one as ``linear_spec_lora``: LoRA on ``o_proj``, rank 128, alpha 512) is
trained to improve drafting only. The verifier must stay the base model, or the output is no longer
the base model's. So within one call the adapter's update is computed for every row (the call is one
batched matmul) but added only to the proposal rows: a per-row 0/1 gate multiplies the LoRA output.
Verifier rows, which are the only rows ever cached, never see it; drafter rows attend to the cached
prefix as the base model computed it.

A call whose proposal rows are all its rows (Linear-SS's drafting call) runs the adapter ungated; a
call without proposal rows (verification, prefill) runs with the adapter disabled, at no cost.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from packed_ss.models.errors import ModelLoadError, some

ADAPTER_NAME = "drafter"
PEFT_PREFIX = "base_model.model."  # peft's saved-key prefix before the module path


def adapter_folder(model_source: Path | None, model_name: str, spec: str, local_only: bool) -> Path | None:
    """Local folder of a drafter adapter given as a path, or as a subfolder of the model (folder or hub);
    None when there is none (no ``adapter_config.json`` found).

    Raises: ModelLoadError when a hub subfolder cannot be fetched (offline, missing repository).
    """
    candidates = [Path(spec).expanduser()]
    if model_source is not None:
        candidates.append(Path(model_source) / spec)
    for folder in candidates:
        if (folder / "adapter_config.json").is_file():
            return folder
    if model_source is None:  # a hub model: fetch only that subfolder
        try:
            from huggingface_hub import snapshot_download

            root = snapshot_download(model_name, allow_patterns=[f"{spec.strip('/')}/*"], local_files_only=local_only)
        except Exception as error:  # noqa: BLE001 - offline, missing repo: one message
            raise ModelLoadError(f"cannot fetch drafter adapter {spec!r} of {model_name!r}: "
                                 f"{type(error).__name__}") from error
        folder = Path(root) / spec
        if (folder / "adapter_config.json").is_file():
            return folder
    return None


def unmapped(model, state: dict, targets) -> str:
    """Why LoRA tensors ``{module.lora_A.weight: (r, in), module.lora_B.weight: (out, r)}`` do not fit
    ``model``'s linear layers, or leave some targeted layer without weights (empty when they fit).
    ``targets``: the adapter's ``target_modules`` (a list of module-name suffixes; a regex is not checked
    for completeness)."""
    modules = dict(model.named_modules())
    absent, wrong = [], []
    if isinstance(targets, (list, tuple, set)):
        targeted = {n for n, m in modules.items() if isinstance(m, torch.nn.Linear)
                    and any(n == t or n.endswith("." + t) for t in targets)}
        given = {key.rpartition(".lora_")[0] for key in state}
        bare = sorted(n for n in targeted if n not in given or f"{n}.lora_A.weight" not in state
                      or f"{n}.lora_B.weight" not in state)
    else:
        bare = []
    for key, tensor in sorted(state.items()):
        name, _, leaf = key.rpartition(".lora_")
        layer = modules.get(name)
        if layer is None or not hasattr(layer, "in_features"):
            absent.append(name)
        elif (leaf.startswith("A") and tensor.shape[-1] != layer.in_features) or (
                leaf.startswith("B") and tensor.shape[0] != layer.out_features):
            wrong.append(key)
    parts = []
    if absent:
        absent = sorted(set(absent))
        parts.append(f"{len(absent)} target modules not in the model ({some(absent)})")
    if wrong:
        parts.append(f"{len(wrong)} tensors of the wrong shape ({some(wrong)})")
    if bare:
        parts.append(f"{len(bare)} targeted layers without LoRA weights ({some(bare)})")
    return "; ".join(parts)


class DrafterLora:
    """A LoRA adapter injected into a ``transformers`` model, switched per call and gated per row.

    Attributes:
        layers: the peft LoRA layers (one per targeted linear).
        rank, alpha: the adapter's r and lora_alpha.
        source: the folder it was loaded from.
    """

    def __init__(self, layers: list, rank: int, alpha: float, source: Path):
        self.layers, self.rank, self.alpha, self.source = layers, rank, alpha, source
        self._gate: torch.Tensor | None = None  # (1, R, 1) 0/1 multiplier of the LoRA output, None = all rows
        self._lock = threading.Lock()  # the switch is state on shared weights: one call at a time
        for layer in layers:
            layer.lora_B[ADAPTER_NAME].register_forward_hook(self._apply_gate)
        self.switch(None)

    def _apply_gate(self, module, args, output):
        return output if self._gate is None else output * self._gate

    @classmethod
    def load(cls, model, folder: Path, module_name: Callable[[str], str]) -> "DrafterLora":
        """Inject the adapter in ``folder`` (peft format) into ``model`` and load its weights.

        ``module_name`` maps a module path in the checkpoint's names to the model's.
        Raises: ModelLoadError for a non-LoRA adapter, weights that do not all map (keys named), or no peft.
        """
        try:
            from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict
            from peft.tuners.lora import LoraLayer
        except ImportError:  # an optional dependency (pyproject.toml's extra "lora"): one line, not a traceback
            raise ModelLoadError("a drafter adapter needs peft, which is not installed: pip install peft (or "
                                 "pip install 'packed-ss[lora]')") from None
        from safetensors.torch import load_file

        try:
            raw = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
            if raw.get("peft_type", "LORA") != "LORA":
                raise ModelLoadError(f"drafter adapter {str(folder)!r} is {raw.get('peft_type')}, not LoRA")
            config = LoraConfig(r=int(raw["r"]), lora_alpha=float(raw["lora_alpha"]), lora_dropout=0.0,
                                target_modules=raw["target_modules"], bias="none",
                                use_rslora=bool(raw.get("use_rslora", False)))
            weights = load_file(str(folder / "adapter_model.safetensors"))
        except ModelLoadError:
            raise
        except Exception as error:  # noqa: BLE001 - unreadable config or weights: one message
            raise ModelLoadError(f"cannot read drafter adapter {str(folder)!r}: {type(error).__name__}: {error}") from error
        state = {}
        for key, tensor in weights.items():
            path = key[len(PEFT_PREFIX):] if key.startswith(PEFT_PREFIX) else key
            module, _, leaf = path.rpartition(".lora_")
            state[f"{module_name(module)}.lora_{leaf}"] = tensor
        # Check before injecting: a refused adapter must leave the model exactly as it was.
        problems = unmapped(model, state, config.target_modules)
        if problems:
            raise ModelLoadError(f"drafter adapter {str(folder)!r} does not fit this model: {problems}")
        inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
        result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER_NAME)
        expected = {n for n, _ in model.named_parameters() if f".{ADAPTER_NAME}." in n and ".lora_" in n}
        missing = sorted(expected & set(result.missing_keys))
        unexpected = sorted(result.unexpected_keys)
        if missing or unexpected or not expected:
            raise ModelLoadError(
                f"drafter adapter {str(folder)!r} does not map onto the model: {len(missing)} LoRA weights missing "
                f"({some(missing)}), {len(unexpected)} not used ({some(unexpected)})"
                + ("" if expected else " (no target module found)"))
        dtype = next(p for n, p in model.named_parameters() if ".lora_" not in n).dtype
        layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
        for layer in layers:
            layer.lora_A[ADAPTER_NAME].to(dtype)
            layer.lora_B[ADAPTER_NAME].to(dtype)
        return cls(layers, config.r, config.lora_alpha, folder)

    @contextmanager
    def applied(self, rows: tuple[int, ...], total: int, device=None, dtype=None) -> Iterator[None]:
        """Hold the adapter switched for one call of ``total`` rows (see :meth:`switch`), then off."""
        with self._lock:
            self.switch(rows, total, device, dtype)
            try:
                yield
            finally:
                self.switch(None)

    def switch(self, rows: tuple[int, ...] | None, total: int = 0, device=None, dtype=None) -> None:
        """Set the adapter for the next call: off (``rows`` None or empty), on for every row
        (``len(rows) == total``), or on and gated to ``rows`` of a call of ``total`` rows."""
        on = bool(rows)
        for layer in self.layers:
            layer.enable_adapters(on)
        self._gate = None
        if on and len(rows) < total:
            gate = torch.zeros(1, total, 1, device=device, dtype=dtype)
            gate[0, list(rows)] = 1
            self._gate = gate
