"""Model adapter: one dual-mode ``transformers`` causal LM with a real KV cache.

A dual-mode model has one set of weights and two modes that differ only in the attention mask: causal
rows predict the next token (verifier), and a block ``[last verified token, MASK x (B-1)]`` read
bidirectionally predicts the token at each mask's own position (drafter). The adapter runs one call
with an explicit boolean 4D mask and explicit position ids, and rolls the cache back so that it holds
the verified prefix except its last token (paper Appendix D.1): a static cache by default
(:mod:`packed_ss.models.static`, where calls may also be compiled), or transformers' ``DynamicCache``.

Shape legend: R rows of the call, C cached tokens, V vocabulary.
"""

from __future__ import annotations

import operator
import re
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from packed_ss.layout import CallLayout
from packed_ss.models.checkpoint import Checkpoint
from packed_ss.models.errors import ModelLoadError, local_folder, quoted, some
from packed_ss.models.families import pick_family, read_config
from packed_ss.models.lora import DrafterLora, adapter_folder
from packed_ss.models.graphs import GraphCalls
from packed_ss.models.native import NativeCalls, adopt_compiled, compiled_parts, native_problem
from packed_ss.models.process_state import loading
from packed_ss.models.static import StaticCalls, kernel_mask, static_cache_problem


@dataclass(frozen=True)
class CallOutput:
    """Logits (len(rows), V) on the model's device for the requested rows, and the model time in ms.

    ``deferred``: hidden states (len(deferred), H) of the rows whose LM head was put off, or None when the
    call computed no deferred rows (see :meth:`DualModeModel.forward`). ``recorded_ms``: time spent recording the
    call's CUDA graph before its clock started (:mod:`packed_ss.models.graphs`; not part of ``model_ms``, and left
    out of the iteration's wall time).
    """

    logits: torch.Tensor
    model_ms: float
    deferred: torch.Tensor | None = None
    recorded_ms: float = 0.0


# Architectures whose causal-LM head is exactly ``lm_head(last_hidden_state)`` (no scaling or soft-capping),
# so the head may be applied to some rows later. Others compute every requested row's logits at once.
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "ministral3", "qwen2", "qwen3"})


WORD_START = "\u2581"  # SentencePiece's word-start marker


DTYPES = ("float32", "bfloat16", "float16", "float64")  # dtypes from_pretrained accepts by name
CACHES = ("static", "dynamic")  # KV cache kinds (packed_ss.models.static; transformers' DynamicCache)
PATHS = ("auto", "native", "transformers")  # whose forward runs the calls (packed_ss.models.native; transformers')


def device_dtype_problem(device: str | None, dtype: str | None) -> str | None:
    """A one-line message when ``--device`` / ``--dtype`` cannot work here, else None (checked before loading)."""
    if dtype is not None and dtype not in DTYPES:
        return f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
    if device is None:
        return None
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError, TypeError):
        return f"--device {device!r} is not a device name (cpu, cuda, cuda:1...)"
    if kind not in ("cpu", "cuda", "mps"):
        return f"--device must be cpu, cuda, cuda:N or mps, got {device!r}"
    if kind == "cuda" and not torch.cuda.is_available():
        return f"--device {device!r}: no CUDA device is available on this machine (use --device cpu)"
    if kind == "mps" and not torch.backends.mps.is_available():
        return f"--device {device!r}: MPS is not available on this machine (use --device cpu)"
    return None


def special_ids_problem(name: str, checkpoint, vocab_size: int) -> None:
    """Refuse a checkpoint whose mask, EOS or BOS id lies outside its vocabulary (a broken config would otherwise
    fail deep inside the first call). Raises: ModelLoadError naming the id and the vocabulary size."""
    for what, value in (("mask_token_id", checkpoint.mask_token_id), ("eos_token_id", checkpoint.eos_token_id),
                        ("bos_token_id", checkpoint.bos_token_id)):
        if value is not None and not (isinstance(value, int) and 0 <= value < vocab_size):
            raise ModelLoadError(f"{name!r}: {what} {value!r} is not a token id of its vocabulary of {vocab_size} "
                                 f"(0 to {vocab_size - 1})")


def non_finite_problem(name: str, model) -> None:
    """Refuse a checkpoint whose weights hold NaN or infinite values (every output would be meaningless).

    Raises: ModelLoadError naming up to three such tensors."""
    chunk = 1 << 24  # elements checked at once (a bounded temporary, even for a 262k-token embedding)

    def finite(tensor) -> bool:
        flat = tensor.detach().reshape(-1)
        return all(bool(torch.isfinite(flat[i:i + chunk]).all()) for i in range(0, flat.numel(), chunk))

    bad = [key for key, tensor in model.state_dict().items() if tensor.is_floating_point() and not finite(tensor)]
    if bad:
        raise ModelLoadError(f"refusing {quoted(name)}: {len(bad)} of its weight tensors hold NaN or infinite values "
                             f"({some(bad, 3)}); the checkpoint is damaged or was saved from a diverged run")


def hub_unreachable(name: str, timeout_s: float = 10.0) -> bool:
    """True when the hub cannot be contacted at all (no network), checked with one quick request.

    Loading then uses the local cache only, instead of the loaders' retries (tens of seconds offline).
    A missing repository or any other hub answer returns False: the loader reports it.
    """
    import os

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return True
    from huggingface_hub import HfApi

    try:
        HfApi().model_info(name, timeout=timeout_s)
    except Exception as error:  # noqa: BLE001 - httpx ConnectError/ConnectTimeout, or a hub answer
        kind = type(error).__name__.lower()
        return isinstance(error, (ConnectionError, TimeoutError)) or "connect" in kind or "timeout" in kind
    return False


BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # a byte-fallback token (SentencePiece, Llama)


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins for the 256 bytes (GPT-2's table: printable Latin-1 characters stand
    for themselves, the other bytes for code points from 256 on), stand-in -> byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            table[chr(byte)] = byte
        else:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


BYTE_LEVEL = _byte_level_alphabet()


def token_bytes(piece: str) -> bytes | None:
    """The bytes a token's piece stands for: a byte-fallback piece (``<0xF0>``) or a byte-level BPE piece (every
    character one of :data:`BYTE_LEVEL`'s stand-ins); None for any other piece."""
    found = BYTE_PIECE.fullmatch(piece)
    if found:
        return bytes([int(found.group(1), 16)])
    if piece and all(c in BYTE_LEVEL for c in piece):
        return bytes(BYTE_LEVEL[c] for c in piece)
    return None


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _size(count: int) -> str:
    """A byte count for a message: GiB, MiB or KiB, two significant decimals at most."""
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.2f} {unit}"
    return f"{count / 1024:.1f} KiB"


class DualModeModel:
    """A ``transformers`` causal LM used as verifier (causal rows) and drafter (mask rows).

    Attributes:
        pads_drafts: Packed-SS calls pad a short draft to W slots (True off the CPU; see packed_layout).
        mask_token_id, eos_token_id: special token ids (from the config or the tokenizer).
        vocab_size: V, number of logits per row.
        never_emit_ids: ids no schedule may output (the mask token, vocabulary padding rows).
        max_length: longest sequence (prompt + new tokens + one block) the model's positions allow.
        any_order: the config says ``any_order: true`` (a SetDLM-style model, :mod:`packed_ss.any_order`).
        context_length: SetDLM's context (``length``): any-order calls crop the cache from the left to fit it, as
            SetDLM's decoder does; None for models without one.
        native_window: the window SetDLM's noise schedule allows its native decoder (None: no bound).
        native_decoding: ``"setdlm"`` when the ``diffusion`` lane follows SetDLM's own ``generate``, else
            ``"threshold"`` (:mod:`packed_ss.any_order.diffusion`).
    """

    def __init__(self, model, tokenizer, mask_token_id: int, eos_token_id: int | None,
                 bos_token_id: int | None = None, family: str = "plain", drafter_lora=None,
                 cache: str = "static", compiled: bool | None = False, path: str = "auto"):
        """Wrap a loaded network (see :meth:`from_pretrained` for ``cache``, ``compiled`` and ``path``)."""
        from transformers import DynamicCache

        self.model = model.eval()
        self.tokenizer = tokenizer
        self.mask_token_id = int(mask_token_id)
        self.eos_token_id = None if eos_token_id is None else int(eos_token_id)
        self.bos_token_id = None if bos_token_id is None else int(bos_token_id)
        self.family = family
        self.drafter_lora = drafter_lora  # a packed_ss.models.lora.DrafterLora, or None
        self.adapter_note: str | None = None  # why a requested adapter was not loaded (require_adapter=False)
        self.vocab_size = int(model.config.vocab_size)
        # Never output: the mask token, and embedding rows past the tokenizer's vocabulary (padding rows
        # that decode to nothing; unknown without a tokenizer). The schedules give these ids zero probability in
        # every distribution.
        padding = range(len(tokenizer), self.vocab_size) if tokenizer is not None else ()
        self.never_emit_ids = (self.mask_token_id,) + tuple(padding)
        self.max_length = int(getattr(model.config, "max_position_embeddings", 2048))
        # A same-position any-order model (paper Appendix C/D.2): decoded by packed_ss.any_order's schedules.
        self.any_order = bool(getattr(model.config, "any_order", False))
        self.context_length = getattr(model.config, "context_length", None)
        self.native_window = getattr(model.config, "native_window", None)
        self.native_decoding = getattr(model.config, "native_decoding", "threshold")
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self._cache_class = DynamicCache
        self._length = 0  # dynamic cache: its tokens, tracked here to keep get_seq_length off the hot path
        self.supports_deferred_rows = (getattr(model.config, "model_type", None) in PLAIN_HEAD_TYPES
                                       and model.get_output_embeddings() is not None)
        if cache not in CACHES:
            raise ValueError(f"cache must be one of {', '.join(CACHES)}, got {cache!r}")
        why_not = static_cache_problem(model.config)
        if compiled and (cache != "static" or why_not):
            raise ModelLoadError(f"compiled calls need the static cache ({why_not or 'cache=' + repr(cache)})")
        if path not in PATHS:
            raise ValueError(f"path must be one of {', '.join(PATHS)}, got {path!r}")
        # Whose forward runs the calls: the native one (packed_ss.models.native) where it serves the model, else
        # transformers'; path_note says why not in one line when "auto" could not use it.
        why_native = ("the dynamic cache is transformers' own" if cache == "dynamic" or why_not
                      else native_problem(model) if path != "transformers" else None)
        if path == "native" and why_native:
            raise ModelLoadError(f"the native forward cannot serve this model: {why_native}")
        self.path_requested = path
        self.path = "native" if path != "transformers" and not why_native else "transformers"
        self.path_note = f"transformers' forward: {why_native}" if path == "auto" and why_native else None
        if compiled is None:  # the default: CUDA graphs where the native forward runs a CUDA model, else eager
            compiled = self.path == "native" and self.device.type == "cuda"
        # The static cache (written in place, rolled back by moving its length) unless the model cannot use it.
        self.static = None if cache == "dynamic" or why_not else self._calls(compiled)
        self.cache = None if self.static else DynamicCache(config=model.config)
        self._compile_requested = compiled  # shares ask for it too (and learn of a failure without retrying)
        # Packed-SS pads a short draft to W slots (the paper's fixed 2B-row call, for GPU kernels); on a CPU
        # every row costs time, so the call holds only the draft's own rows there.
        self.pads_drafts = self.device.type != "cpu"
        self._cuda = self.device.type == "cuda"

    @classmethod
    def from_pretrained(cls, name_or_path: str | Path, device: str | None = None,
                        dtype: str | torch.dtype | None = None, family: str | None = None,
                        drafter_lora: str | None = None, require_adapter: bool = True,
                        base_model: str | None = None, cache: str = "static",
                        compiled: bool | None = None, attention: str | None = None,
                        path: str = "auto") -> "DualModeModel":
        """Load a model and tokenizer from a local folder or a hub id, strictly (every weight mapped).

        Args:
            name_or_path: folder (``config.json`` + safetensors + tokenizer) or a hub id (needs the network
                or the local hub cache).
            device: ``"cpu"``, ``"cuda"``...; default CUDA when available.
            dtype: ``torch.float32``, ``torch.bfloat16``, ``"float64"``...; default the family's own (SetDLM:
                float32), else float32 on CPU and bfloat16 on CUDA.
            family: ``"plain"``, ``"nemotron"`` or ``"setdlm"`` (see :mod:`packed_ss.models.families`);
                default: detected from ``config.json`` (``model_type``, ``architectures``, ``backbone_config``).
            drafter_lora: a peft LoRA folder, or the name of the model's subfolder holding one (NLD:
                ``linear_spec_lora``), applied to proposal rows only (:mod:`packed_ss.models.lora`).
            require_adapter: when False, a model without that adapter loads without one (a server offering
                several models); when True (default) it is an error.
            base_model: SetDLM only (other families ignore it): hub id or local folder of the base model whose
                config.json gives the backbone's architecture (default: the one the checkpoint's
                ``backbone_config`` names).
            cache: ``"static"`` (default; :mod:`packed_ss.models.static`, dynamic for sliding-window models) or
                ``"dynamic"`` (transformers' ``DynamicCache``, grown and cropped).
            compiled: decode and speculative calls at padded row counts (static cache only), through
                ``torch.compile``, or replayed as CUDA graphs where the native forward runs on CUDA
                (:mod:`packed_ss.models.graphs`); None (default): graphs where the native forward runs a CUDA
                model, else eager calls. A compiler or capture failure falls back to eager calls with a warning
                (``compile_note``).
            attention: SetDLM only: ``"sdpa"`` (default) or ``"eager"``, the kernel SetDLM's own code runs (logits
                then agree with it exactly rather than to about 1e-4; :mod:`packed_ss.models.setdlm`).
            path: whose forward runs the calls: ``"auto"`` (default: :mod:`packed_ss.models.native` where it serves
                the model, on the CPU or CUDA, else transformers', with ``path_note`` saying why), ``"native"`` (an
                error where it cannot) or ``"transformers"``.
        Raises:
            ModelLoadError: missing folder, unreadable config, unknown family, weights that do not all map
            (keys named), no mask token id, or an adapter that does not load.
        """
        name = str(name_or_path)
        local = local_folder(name)  # None: a hub id
        problem = device_dtype_problem(device, dtype if isinstance(dtype, str) else None)
        if problem:
            raise ModelLoadError(problem)
        if cache not in CACHES:
            raise ModelLoadError(f"--cache must be one of {', '.join(CACHES)}, got {cache!r}")
        if path not in PATHS:
            raise ModelLoadError(f"--path must be one of {', '.join(PATHS)}, got {path!r}")
        if compiled and cache != "static":
            raise ModelLoadError("--compile (or PACKED_SS_COMPILE=1) needs the static cache: leave out --cache "
                                 "dynamic, or turn compiling off (--no-compile)")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        local_only = local is None and hub_unreachable(name)
        offline = (f"cannot load model {name!r}: the Hugging Face hub cannot be reached from this machine and "
                   f"the model is not in the local cache (use a local folder, e.g. assets/model)")
        try:
            config = read_config(name, local_only)
        except ModelLoadError as error:
            raise (ModelLoadError(offline) if local_only else error) from error
        chosen = pick_family(config, family)
        dtype = dtype or chosen.default_dtype or ("bfloat16" if str(device).startswith("cuda") else "float32")
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        options = {"base_model": base_model} if base_model and chosen.name == "setdlm" else {}
        if attention and chosen.name == "setdlm":
            options["attention"] = attention
        if base_model and chosen.name != "setdlm":  # a server may pass one for every model it offers: a warning
            warnings.warn(f"base_model {quoted(str(base_model))} applies to SetDLM checkpoints only; {quoted(name)} is a "
                          f"{chosen.name} model, so it is ignored", stacklevel=2)
        # Torch's default dtype is one per process and from_pretrained sets it while it builds the network: one load
        # at a time in the process (packed_ss.models.process_state), the files and the config read before.
        with loading():
            try:
                checkpoint = chosen.load(name, config, dtype, str(device), local_only, **options)
            except ModelLoadError:
                raise
            except Exception as error:  # any loader failure becomes one clear message
                raise ModelLoadError(offline if local_only else
                                     f"cannot load model {name!r}: {type(error).__name__}: {error}") from error
            model = checkpoint.model
            special_ids_problem(name, checkpoint, int(model.config.vocab_size))
            non_finite_problem(name, model)
            lora, adapter_note = None, None
            if drafter_lora:
                folder = adapter_folder(local, name, drafter_lora, local_only)
                try:
                    if folder is None:
                        raise ModelLoadError(f"drafter adapter {drafter_lora!r}: no adapter_config.json there or in "
                                             f"the model's subfolder {drafter_lora!r}")
                    lora = DrafterLora.load(model, folder, checkpoint.adapter_name)
                except ModelLoadError as error:
                    if require_adapter:
                        raise
                    adapter_note = str(error)  # the model loads without it (an adapter fits some models only)
            why_not = static_cache_problem(model.config) if compiled else None
            if why_not:
                raise ModelLoadError(f"--compile needs the static cache, and {name!r} cannot use it: {why_not}")
            if getattr(model.config, "mask_token_id", None) is None:  # NLD's mapped config: wrap(model) finds it again
                model.config.mask_token_id = checkpoint.mask_token_id
            loaded = cls(model.to(device), checkpoint.tokenizer, checkpoint.mask_token_id, checkpoint.eos_token_id,
                         checkpoint.bos_token_id, checkpoint.family, lora, cache, compiled, path)
            loaded.adapter_note = adapter_note
            return loaded

    @classmethod
    def wrap(cls, model, tokenizer=None, mask_token_id: int | None = None, eos_token_id: int | None = None,
             cache: str = "static", compiled: bool | None = None, path: str = "auto") -> "DualModeModel":
        """An adapter over a ``transformers`` causal LM already loaded, on its own device and dtype
        (``AutoModelForCausalLM.from_pretrained(folder)``, or ``DualModeModel.from_pretrained(name).model`` for the
        families transformers does not load natively). Nothing is read from disk.

        Args:
            model: the network; its forward must take a 4D boolean mask and position ids, as transformers' own
                architectures do (Llama, Mistral, Ministral3, Qwen2/3...).
            tokenizer: its tokenizer, or None: then :meth:`encode`, :meth:`decode` and :meth:`token_strings`
                raise, and only the mask token is kept out of the outputs (the vocabulary's padding rows are
                known from a tokenizer only).
            mask_token_id: default ``model.config.mask_token_id``, else the tokenizer's mask token.
            eos_token_id: default the tokenizer's EOS, else ``model.config.eos_token_id`` (the first of a list).
            cache, compiled, path: as in :meth:`from_pretrained`. The native forward (``path="auto"`` on a
                Llama-family network) fuses the network's projection weights, which become views of the fused
                matrices: the same values, held once; ``path="transformers"`` leaves the network as it is.
        No BOS is added by :meth:`encode` (ids given to the engine already hold what the model wants).

        Raises:
            ModelLoadError: no mask token id (not a dual-mode model), a special id outside the vocabulary, or
            compiled calls without the static cache.
            ValueError: an unknown ``cache`` or ``path``.
        """
        name = str(getattr(model, "name_or_path", "") or type(model).__name__)
        config = model.config
        if mask_token_id is None:
            mask_token_id = getattr(config, "mask_token_id", None)
        if mask_token_id is None and tokenizer is not None:
            mask_token_id = tokenizer.mask_token_id
        if mask_token_id is None:
            raise ModelLoadError(f"{quoted(name)} is not a dual-mode model: it has no mask token id (config.mask_token_id, "
                                 f"the tokenizer's mask token or mask_token_id=...)")
        if eos_token_id is None and tokenizer is not None:
            eos_token_id = tokenizer.eos_token_id
        if eos_token_id is None:
            eos_token_id = getattr(config, "eos_token_id", None)
        if isinstance(eos_token_id, (list, tuple)):
            eos_token_id = eos_token_id[0] if eos_token_id else None
        ids = Checkpoint(model, tokenizer, mask_token_id, eos_token_id, None, "plain")
        special_ids_problem(name, ids, int(config.vocab_size))
        return cls(model, tokenizer, mask_token_id, eos_token_id, None, "plain", None, cache, compiled, path)

    def _calls(self, compiled: bool):
        """The static cache's calls of this adapter, run by the forward of :attr:`path`."""
        if self.path != "native":
            return StaticCalls(self.model, self.supports_deferred_rows, compiled)
        calls = GraphCalls if self.device.type == "cuda" else NativeCalls  # CUDA: compiled calls replay graphs
        return calls(self.model, self.supports_deferred_rows, compiled)

    def compiled_parts(self) -> tuple | None:
        """What a later load of the same checkpoint may adopt instead of compiling again
        (:func:`packed_ss.models.native.compiled_parts`), or None (nothing compiled, or transformers' forward)."""
        return compiled_parts(self.model) if self.path == "native" else None

    def adopt_compiled(self, parts: tuple) -> None:
        """Run this freshly loaded model's native calls by the decoder and compiled graphs of an earlier load of the
        same checkpoint and dtype (:meth:`compiled_parts`); its own decoder is dropped before any call used it."""
        if self.path != "native" or self.static is None:
            raise ValueError("only a model on the native forward with the static cache adopts compiled calls")
        adopt_compiled(self.model, parts)
        self.static = self._calls(self._compile_requested)

    def share(self, compiled: bool | None = None) -> "DualModeModel":
        """A second adapter over the same weights and tokenizer with its own empty cache.

        Use one per concurrent run (one per user session): runs never see each other's cache.
        ``compiled``: True or False for an adapter on that path (static cache), None for this adapter's own.
        Raises: ModelLoadError for compiled calls on a model that cannot use the static cache.
        """
        cache = "static" if compiled else self.cache_kind
        shared = DualModeModel(self.model, self.tokenizer, self.mask_token_id, self.eos_token_id,
                               self.bos_token_id, self.family, self.drafter_lora, cache,
                               self._compile_requested if compiled is None else compiled, self.path_requested)
        shared.adapter_note = self.adapter_note
        return shared

    # --- text ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: BOS first when the family uses one (NLD), no other special tokens.
        Raises: ValueError for a model wrapped without a tokenizer."""
        ids = self._text().encode(text, add_special_tokens=False)
        return ([self.bos_token_id] if self.bos_token_id is not None and ids else []) + ids

    @property
    def has_chat_template(self) -> bool:
        """Whether the tokenizer carries a chat template (instruct checkpoints do; the shipped models do not)."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def chat_text(self, text: str) -> str:
        """``text`` as one user message in the tokenizer's chat template, ready for the assistant's answer
        (thinking switched off where the template has that switch, paper E.3). A BOS the template writes
        is left out when :meth:`encode` adds its own.

        Raises: ValueError when the tokenizer has no chat template.
        """
        if not self.has_chat_template:
            raise ValueError("this model's tokenizer has no chat template: send the prompt as plain text")
        switches = {"enable_thinking": False} if "enable_thinking" in str(self.tokenizer.chat_template) else {}
        chat = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                  add_generation_prompt=True, **switches)
        bos = self.tokenizer.bos_token
        if self.bos_token_id is not None and bos and chat.startswith(bos):
            chat = chat[len(bos):]
        return chat

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``, special tokens kept. Raises: ValueError for an id that is not an integer in
        ``[0, vocab_size)``, or for a model wrapped without a tokenizer."""
        return self._text().decode(self.checked_ids(ids), skip_special_tokens=False)

    def _text(self):
        """The tokenizer. Raises: ValueError for a model wrapped without one (:meth:`wrap`)."""
        if self.tokenizer is None:
            raise ValueError("this model was wrapped without a tokenizer: it has no text, only token ids "
                             "(DualModeModel.wrap(model, tokenizer=...))")
        return self.tokenizer

    def checked_ids(self, ids) -> list[int]:
        """``ids`` as a list of token ids of this model. Raises: ValueError for anything but integers in
        ``[0, vocab_size)`` (the tokenizer would fail with an unrelated error, e.g. an OverflowError for -1)."""
        out = []
        for token in ids:
            try:
                value = None if isinstance(token, bool) else operator.index(token)
            except TypeError:
                value = None
            if value is None or not 0 <= value < self.vocab_size:
                raise ValueError(f"token ids are integers from 0 to {self.vocab_size - 1}, got {token!r:.40}")
            out.append(value)
        return out

    def token_strings(self, ids: list[int]) -> list[str]:
        """Readable text of each token on its own (for chips, hover text and the text view, which joins
        them). A SentencePiece word-start marker ("▁") becomes the leading space that decoding a token
        alone drops, so joined pieces keep the spaces between words. A token that holds part of a character's
        UTF-8 bytes (a byte-level or byte-fallback token: an emoji takes several) is shown as its bytes,
        ``<0xF0>``, where decoding it alone gives only the replacement character. Raises: ValueError as
        :meth:`decode`."""
        ids = self.checked_ids(ids)
        pieces = self._text().convert_ids_to_tokens(ids)
        out = []
        for i, piece in zip(ids, pieces):
            text = self.tokenizer.decode([i], skip_special_tokens=False)
            if isinstance(piece, str) and piece.startswith(WORD_START) and not text.startswith(" "):
                text = " " + text
            if "\ufffd" in text and isinstance(piece, str):
                raw = token_bytes(piece)
                if raw is not None and not _utf8(raw):
                    text = "".join(f"<0x{b:02X}>" for b in raw)
            out.append(text)
        return out

    # --- cache --------------------------------------------------------------------------------
    @property
    def cache_length(self) -> int:
        """C, tokens currently held in the KV cache."""
        return self.static.length if self.static else self._length

    @property
    def cache_kind(self) -> str:
        """``"static"`` or ``"dynamic"``: the KV cache this adapter writes."""
        return "static" if self.static else "dynamic"

    @property
    def compile_note(self) -> str | None:
        """Why compiling was given up, or why some calls of this adapter ran eagerly (one line), or None."""
        if not self.static:
            return None
        return self.static.note or self.static.budget_note

    @property
    def compiled(self) -> bool:
        """Whether speculative and decode calls go through ``torch.compile`` (False after a compile failure)."""
        return bool(self.static and self.static.compiled)

    @property
    def graphs(self) -> bool:
        """Whether those calls replay CUDA graphs (the native forward on CUDA, :mod:`packed_ss.models.graphs`)."""
        return self.compiled and isinstance(self.static, GraphCalls)

    def cached_kv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values the cache holds for the first C tokens, per layer: (1, heads, C, head_dim) each (views
        of the static cache, which holds more past C; the dynamic cache's own tensors)."""
        length = self.cache_length
        if self.static and not length:
            return []
        layers = self.static.cache.layers if self.static else self.cache.layers
        return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in layers]

    def reset(self, tokens: int = 0, block_size: int | None = None) -> None:
        """Empty the cache before a new prompt. ``tokens``: the most the run can hold (prompt, new tokens and
        the largest call), so that a static cache is sized once; ``block_size``: B of the run (the padded row
        counts of compiled calls, :func:`packed_ss.models.static.padded_rows`)."""
        self._length = 0
        if self.static:
            self.static.reset(tokens, block_size)
        else:
            self.cache = self._cache_class(config=self.model.config)

    def rollback(self, keep: int) -> None:
        """Drop cached tokens beyond the first ``keep`` (Appendix D.1 cache update).

        Raises: ValueError if ``keep`` exceeds the cache length or is negative.
        """
        length = self.cache_length
        if not 0 <= keep <= length:
            raise ValueError(f"cannot keep {keep} of {length} cached tokens")
        if keep < length:
            if self.static:
                self.static.rollback(keep)
            else:
                self.cache.crop(keep - length)  # transformers 5.23: a negative argument removes that many
                self._length = keep

    def crop_left(self, drop: int) -> None:
        """Drop the ``drop`` oldest cached tokens, keeping the rest in order (SetDLM's ``_crop_kv_cache_left``,
        ``src/denoiser/bd3lm.py``): their keys keep the positions they were computed at.

        Raises: ValueError if ``drop`` is negative or exceeds the cache length.
        """
        length = self.cache_length
        if not 0 <= drop <= length:
            raise ValueError(f"cannot drop {drop} of {length} cached tokens")
        if not drop:
            return
        if self.static:
            self.static.crop_left(drop)
            return
        for layer in self.cache.layers:
            layer.keys, layer.values = layer.keys[:, :, drop:], layer.values[:, :, drop:]
        self._length -= drop

    # --- one call -----------------------------------------------------------------------------
    @torch.no_grad()
    def forward(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...] = (),
                adapter_rows: tuple[int, ...] = ()) -> CallOutput:
        """Run one call with the layout's mask over [cache | new rows] and return logits for ``rows``.

        ``deferred`` rows get their hidden states only; :meth:`head` turns the ones a schedule ends up
        needing into logits (Quadratic-SS reads one branch of B, chosen by the verification of the same
        call). Needs ``supports_deferred_rows``; without it, pass every row in ``rows``.
        ``adapter_rows``: rows that get the drafter adapter's update (proposal rows, Appendix F.2); the
        adapter is off for the call when empty.
        All R rows are appended to the cache; the caller rolls back afterwards.
        Raises: ValueError when the layout was built for another cache length, ``deferred`` is given
        to a model that does not support it, or ``adapter_rows`` to a model without a drafter adapter.
        """
        if layout.cached != self.cache_length:
            raise ValueError(f"layout expects {layout.cached} cached tokens, cache holds {self.cache_length}")
        if deferred and not self.supports_deferred_rows:
            raise ValueError(f"model type {self.model.config.model_type!r} cannot defer its LM head")
        if adapter_rows and self.drafter_lora is None:
            raise ValueError("this model has no drafter adapter (load one with drafter_lora=...)")
        if self.drafter_lora is None:
            return self._static_call(layout, rows, deferred) if self.static else self._call(layout, rows, deferred)
        if self.path == "native":  # the native forward applies the adapter itself, gated by a per-call input
            return self._static_call(layout, rows, deferred, adapter_rows=adapter_rows)
        with self.drafter_lora.applied(adapter_rows, layout.rows, self.device, self.dtype):
            if self.static:  # the adapter's hooks stay eager
                return self._static_call(layout, rows, deferred, eager=bool(adapter_rows))
            return self._call(layout, rows, deferred)

    def _static_call(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...],
                     eager: bool = False, adapter_rows: tuple[int, ...] = ()) -> CallOutput:
        try:
            # host work and a new shape's recording before the clock, as in _call
            prepared = self.static.prepare(layout, eager=eager, adapter_rows=adapter_rows)
            recorded_s = self.static.record(prepared, defer=bool(deferred))
            self._sync()
            start = time.perf_counter()
            out, hidden_states = self.static.execute(prepared, rows + deferred, defer=bool(deferred))
        except torch.OutOfMemoryError:  # a cache or a call too large for the device: one line, the memory named
            raise self._memory_error(layout) from None
        hidden = None
        if hidden_states:
            logits = self.model.get_output_embeddings()(out[: len(rows)])
            hidden = out[len(rows):] if deferred else None
        else:
            logits = out
        self._sync()
        return CallOutput(self._as_float(logits), (time.perf_counter() - start) * 1000, hidden, recorded_s * 1000)

    def _memory_error(self, layout: CallLayout) -> ValueError:
        """The one-line error of a call that ran out of device memory, naming what its attention needed
        (:func:`~packed_ss.models.native.attention_temporaries`) beside the cache; the cache keeps what it held
        (the caller's run is over: a shorter prompt or fewer new tokens may fit)."""
        from packed_ss.models.native import attention_temporaries

        config = self.model.config
        heads = int(config.num_attention_heads)
        keys = layout.cached + layout.rows
        need = attention_temporaries(layout.rows, keys, heads, int(getattr(config, "num_key_value_heads", None)
                                                                    or heads))
        cache = self.static.cache.tensor.nbytes if hasattr(self.static.cache, "tensor") else 0
        self.static.release_spares()
        return ValueError(f"out of device memory in a call of {layout.rows} rows over {keys} keys: its attention "
                          f"needs up to {_size(need)} beside the {_size(cache)} KV cache; use a shorter prompt or "
                          f"fewer new tokens")

    @contextmanager
    def rehearsing(self):
        """Within the block, calls run untimed as a rehearsal of a run: on the graph path their shapes are noted and
        recorded on leaving, largest first (:meth:`packed_ss.models.graphs.GraphCalls.rehearsing`); elsewhere
        nothing changes. :func:`packed_ss.engine.decode` rehearses a graph path's run before its clock starts."""
        with self.static.rehearsing() if self.static else nullcontext():
            yield

    def _call(self, layout: CallLayout, rows: tuple[int, ...], deferred: tuple[int, ...]) -> CallOutput:
        device = self.device
        ids = torch.from_numpy(np.array((layout.token_ids, layout.position_ids), dtype=np.int64)).to(device)
        input_ids, position_ids = ids[:1], ids[1:]  # (1, R) each, one host array
        mask = kernel_mask(self.model, layout.full_mask().to(device)[None, None])  # (1, 1, R, C + R)
        inputs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                      past_key_values=self.cache, use_cache=True)
        self._sync()
        start = time.perf_counter()
        hidden = None
        if deferred:
            states = self.model.base_model(**inputs).last_hidden_state[0]  # (R, H)
            logits = self.model.get_output_embeddings()(states[list(rows)])
            hidden = states[list(deferred)]
        else:
            keep = torch.from_numpy(np.array(rows, dtype=np.int64)).to(device)
            logits = self.model(**inputs, logits_to_keep=keep).logits[0]
        self._sync()
        model_ms = (time.perf_counter() - start) * 1000
        self._length += layout.rows
        return CallOutput(self._as_float(logits), model_ms, hidden)

    @torch.no_grad()
    def head(self, hidden: torch.Tensor) -> CallOutput:
        """LM head on deferred hidden states (n, H) of the last call: logits (n, V) and its time in ms."""
        self._sync()
        start = time.perf_counter()
        logits = self.model.get_output_embeddings()(hidden)
        self._sync()
        return CallOutput(self._as_float(logits), (time.perf_counter() - start) * 1000)

    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize(self.device)

    @staticmethod
    def _as_float(logits: torch.Tensor) -> torch.Tensor:
        return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
