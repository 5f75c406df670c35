"""A static KV cache and fixed-shape (optionally compiled) model calls.

The dynamic path grows the cache by concatenation in every call and crops it after the verification. Here
the keys and values live in tensors preallocated to a capacity (``transformers.StaticCache``), each call
writes its rows in place at the current length, and a rollback (paper Appendix D.1 cache update) only
moves that length: the rows past it are never read again, because every mask column past the length is
False, and the next call overwrites them.

With ``compiled`` the call goes through ``torch.compile``: its rows are padded up to one of a few row
counts (:func:`padded_rows`) and the mask always spans the whole capacity, so a run sees a handful of
shapes (the prefill, whose length is the prompt's, runs eagerly). Padding rows read cache column 0 only
(a row that attends to nothing gives NaN) and are never kept: the length moves past the real rows only.

Shape legend: R rows of the call, Rp padded rows, K capacity (keys every call attends over), H hidden.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import torch

from packed_ss.layout import PREFILL
from packed_ss.models.process_state import COMPILING

CAPACITY_STEP = 256  # capacities are multiples of this (fewer distinct shapes across runs)
RECOMPILE_LIMIT = 64  # compiled variants dynamo keeps per function (shapes x capacities)
# Variants this process compiles per function, every network together: a call of a new shape past it runs eagerly
# (one line in the model's note) and the shapes compiled before stay compiled. Dynamo's own limit, once met, failed
# every later compile of the function (FailOnRecompileLimitHit), which turned compiling off for every visitor.
COMPILE_BUDGET = RECOMPILE_LIMIT - 8


def compiled_variants(code) -> int:
    """How many compiled variants dynamo holds for the function whose code object is ``code`` (every guard set)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code))


def padded_rows(rows: int, block_size: int) -> int:
    """Rp: the row count a compiled call of ``rows`` rows is padded to: 1 stays 1 (AR), any other count rounds up
    to a multiple of the block size B. Linear-SS's B, Packed-SS's 2B and Quadratic-SS's B(B + 1) rows (paper
    Table 2, Appendix D.1) stay as they are; shorter drafts near the end of a run reuse the same shapes.

    Raises: ValueError when ``rows`` < 1 or ``block_size`` < 1.
    """
    if rows < 1 or block_size < 1:
        raise ValueError(f"rows and block size must be >= 1, got {rows} and {block_size}")
    return 1 if rows == 1 else -(-rows // block_size) * block_size


def static_cache_problem(config) -> str | None:
    """Why ``config``'s model cannot use a static cache here (sliding-window or non-attention layers, whose
    static layers keep a window instead of every token), or None when it can."""
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds - {"full_attention"}:
        return f"layer types {sorted(kinds - {'full_attention'})} need the dynamic cache"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "a sliding-window model needs the dynamic cache"
    return None


def kernel_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """The boolean (1, 1, R, K) ``mask`` as ``model``'s attention kernel takes it: as is for sdpa; for eager, whose
    kernel adds the mask to the scores, 0 where True and the dtype's minimum elsewhere (what SetDLM's
    ``_preprocess_attention_mask`` builds, ``src/denoiser/base.py``)."""
    if getattr(model.config, "_attn_implementation", None) != "eager":
        return mask
    return torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(~mask, torch.finfo(model.dtype).min)


def forward(model, cache, hidden_only: bool, input_ids, position_ids, mask) -> torch.Tensor:
    """One call over a static ``cache``: hidden states (1, Rp, H) when ``hidden_only`` (the caller applies the LM
    head to the rows it needs), else logits (1, Rp, V). Inputs (1, Rp), (1, Rp) and the mask (1, 1, Rp, K)."""
    inputs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, past_key_values=cache,
                  use_cache=True)
    if hidden_only:
        return model.base_model(**inputs).last_hidden_state
    return model(**inputs).logits


COMPILED = "packed_ss_compiled_forward"  # attribute of the network holding its compiled forward
COMPILE_FAILURE = "packed_ss_compile_failure"  # ... or the error that compiling it raised
COMPILED_SHAPES = "packed_ss_compiled_shapes"  # ... and the (Rp, K) shapes compiled so far


def dynamo_settings():
    """``torch._dynamo.config``, with the variants it keeps per function raised to :data:`RECOMPILE_LIMIT`."""
    import torch._dynamo

    settings = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(settings, name) and getattr(settings, name) < RECOMPILE_LIMIT:
            setattr(settings, name, RECOMPILE_LIMIT)
    return settings


def compiled_forward(model, compiler=None):
    """:func:`forward` compiled with ``torch.compile`` (CPU: inductor's C++ backend; CUDA: ``reduce-overhead``,
    CUDA graphs), made once per network and kept on it, so that every :meth:`DualModeModel.share` of the
    network reuses its compiled shapes. None when the compiler cannot be set up (the error is kept on the
    network as ``packed_ss_compile_failure``)."""
    found = getattr(model, COMPILED, None)
    if found is not None or getattr(model, COMPILE_FAILURE, None) is not None:
        return found
    settings = dynamo_settings()
    device = next(model.parameters()).device
    options = {"mode": "reduce-overhead"} if device.type == "cuda" else {}
    try:
        if settings.disable and compiler is None:  # TORCH_COMPILE_DISABLE / TORCHDYNAMO_DISABLE: torch.compile is a no-op
            raise RuntimeError("torch.compile is disabled in this process (TORCH_COMPILE_DISABLE or TORCHDYNAMO_DISABLE)")
        function = (compiler or torch.compile)(forward, dynamic=False, fullgraph=False, **options)
    except Exception as error:  # noqa: BLE001 - any compiler set-up failure: eager, with one line
        object.__setattr__(model, COMPILE_FAILURE, error)
        return None
    object.__setattr__(model, COMPILED, function)
    object.__setattr__(model, COMPILED_SHAPES, [])
    return function


class StaticCalls:
    """The static cache of one adapter and the calls that write it.

    Attributes:
        capacity: K, tokens the cache holds: the run's own need rounded up to a multiple of :data:`CAPACITY_STEP`
            (a call that needs more grows it, keeping the prefix).
        length: C, tokens of the verified prefix held (the rest of the capacity is stale).
        compiled: whether calls go through ``torch.compile`` (False after a compile failure).
        note: the one-line reason compiling was given up, or None.
        block_size: B of the current run (chooses the padded row counts).
        shapes: the (Rp, K) shapes compiled for the network so far (by any of its adapters), in first-use order.
        compile_s: seconds this adapter spent in calls that compiled a new shape (reported apart from decoding
            time).
    """

    def __init__(self, model, hidden_only: bool, compiled: bool = False, compiler=None):
        self.model = model
        self.device = next(model.parameters()).device
        self.capacity = 0
        self.length = 0
        self.block_size = 1
        self.cache = None
        self.compile_s = 0.0
        self.budget_note: str | None = None  # set when a call ran eagerly because the compile budget was spent
        self._requested = compiled
        self._hidden_only = hidden_only  # the LM head is applied apart, to the rows needed only
        known = getattr(model, self.failure_attribute, None) is not None  # another adapter's failure: said already
        self._function = self._compile(compiler) if compiled else None
        if compiled and self._function is None and not known:
            warnings.warn(self.note, RuntimeWarning, stacklevel=3)

    # where the network keeps its compiled function, its compile failure and its compiled shapes (per forward kind)
    compiled_attribute, failure_attribute, shapes_attribute = COMPILED, COMPILE_FAILURE, COMPILED_SHAPES
    compiled_code = forward.__code__  # the function dynamo compiles (its variants count against COMPILE_BUDGET)

    def _compile(self, compiler):
        return compiled_forward(self.model, compiler)

    @property
    def compiled(self) -> bool:
        """Compiled calls were asked for and compiling has not failed for this network (by any adapter)."""
        return self._requested and getattr(self.model, self.failure_attribute, None) is None

    @property
    def note(self) -> str | None:
        """The one-line reason compiling was given up for this network, or None."""
        error = getattr(self.model, self.failure_attribute, None) if self._requested else None
        if error is None:
            return None
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return self.failure_line.format(kind=type(error).__name__, first=first[:200])

    failure_line = "torch.compile failed ({kind}: {first}); decoding eagerly"  # what ``note`` says

    @property
    def shapes(self) -> list[tuple[int, int]]:
        compiled = getattr(self.model, self.shapes_attribute, None) or []
        return list(dict.fromkeys(key[:2] for key in compiled))  # the (Rp, K) of every variant compiled, once each

    # --- the cache ----------------------------------------------------------------------------
    def reset(self, tokens: int = 0, block_size: int | None = None) -> None:
        """Empty the cache for a run of about ``tokens`` tokens (prompt + new tokens + blocks), B = ``block_size``."""
        if block_size:
            self.block_size = int(block_size)
        self.length = 0
        # Sized to the run: every call attends over the whole capacity, so a long run's capacity is not kept
        if self.cache is None or -(-max(tokens, 1) // CAPACITY_STEP) * CAPACITY_STEP != self.capacity:
            self._allocate(max(tokens, 1))
        self._set_length(0)

    def rollback(self, keep: int) -> None:
        """Keep the first ``keep`` tokens: only the length moves (no tensor is copied)."""
        self.length = keep
        self._set_length(keep)

    def crop_left(self, drop: int) -> None:
        """Drop the ``drop`` oldest tokens: the later ones move to the front of the same tensors (compiled calls
        keep their addresses), the length falls by ``drop``."""
        keep = self.length - drop
        for layer in self.cache.layers:
            for tensor in (layer.keys, layer.values):
                tensor[:, :, :keep] = tensor[:, :, drop:self.length].clone()
        self.rollback(keep)

    def _allocate(self, tokens: int, keep: int = 0) -> None:
        from transformers import StaticCache

        capacity = -(-tokens // CAPACITY_STEP) * CAPACITY_STEP
        old = self.cache
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        if old is not None and keep and old.layers[0].is_initialized:  # grown mid-run: carry the prefix over
            for new_layer, old_layer in zip(self.cache.layers, old.layers):
                new_layer.lazy_initialization(old_layer.keys, old_layer.values)
                new_layer.keys[:, :, :keep] = old_layer.keys[:, :, :keep]
                new_layer.values[:, :, :keep] = old_layer.values[:, :, :keep]
        self.capacity = capacity
        self._set_length(keep)

    def _set_length(self, length: int) -> None:
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(length)

    # --- one call -----------------------------------------------------------------------------
    def prepare(self, layout, eager: bool = False, adapter_rows: tuple[int, ...] = ()) -> tuple:
        """The host-side work of a call (not model time): pad the rows, build the ids, positions and the mask over
        the whole capacity, grow the cache when the call does not fit. ``eager``: never compile this call (the
        prefill, calls with the drafter adapter switched on). ``adapter_rows``: unused here (the drafter LoRA's
        hooks gate transformers' forward; the native forward takes them, :class:`NativeCalls`). Returns what
        :meth:`execute` takes."""
        rows, cached = layout.rows, self.length
        compiled = self.compiled and not eager and PREFILL not in layout.regions
        total = padded_rows(rows, self.block_size) if compiled else rows
        if cached + total > self.capacity:
            self._allocate(cached + total, keep=cached)
        ids = np.zeros((2, total), dtype=np.int64)
        ids[0, :rows], ids[1, :rows] = layout.token_ids, layout.position_ids
        ids[0, rows:] = layout.token_ids[-1]  # padding rows: any token, position 0
        mask = np.zeros((total, self.capacity), dtype=bool)
        mask[:rows, :cached] = True
        mask[:rows, cached:cached + rows] = layout.mask.numpy()
        mask[rows:, 0] = True
        host = torch.from_numpy(ids)
        inputs = (host[:1].to(self.device), host[1:].to(self.device),
                  kernel_mask(self.model, torch.from_numpy(mask).to(self.device)[None, None]))
        return inputs, rows, total, compiled

    def execute(self, prepared: tuple, need: tuple[int, ...], defer: bool = False) -> tuple[torch.Tensor, bool]:
        """Run a call made by :meth:`prepare`; returns (outputs of the rows ``need``, whether they are hidden states
        (H wide, for the LM head) rather than logits (V wide)), and advances the length by R. ``defer``: some of
        ``need`` are deferred rows (this path returns hidden states whenever the model can defer its head)."""
        inputs, rows, total, compiled = prepared
        out = self._compiled_call(inputs, total) if compiled else None
        if out is None:
            out = self._eager(*inputs)
        self.length += rows
        if total != rows:  # the padding rows' keys stay past the length, unread
            self._set_length(self.length)
        keep = torch.as_tensor(need, dtype=torch.long, device=out.device)
        return out[0].index_select(0, keep), self._hidden_only

    def record(self, prepared: tuple, defer: bool = False) -> float:
        """Record what the call ``prepared`` will replay, before its clock starts: seconds spent (here none: compiling
        happens inside the compiled call, :mod:`packed_ss.models.graphs` records ahead)."""
        return 0.0

    def release_spares(self) -> None:
        """Give back device memory held for later runs (:mod:`packed_ss.models.graphs` keeps spare caches)."""

    def rehearsing(self):
        """A context for an untimed rehearsal of a run (:func:`packed_ss.engine.decode`): nothing to do here
        (:meth:`packed_ss.models.graphs.GraphCalls.rehearsing` records the shapes met, largest first)."""
        import contextlib

        return contextlib.nullcontext()

    def _eager(self, input_ids, position_ids, mask):
        return forward(self.model, self.cache, self._hidden_only, input_ids, position_ids, mask)

    def _call_compiled(self, inputs, known: bool = False):
        """The compiled function on ``inputs``; ``known``: its shape was compiled before and dynamo checks only the
        guards that tell its variants apart, so nothing compiles in this call."""
        return self._function(self.model, self.cache, self._hidden_only, *inputs)

    def _compiled_call(self, inputs, total: int, variant=None):
        """The compiled call, or None when compiling failed (then the caller runs it eagerly). ``variant``: what else
        tells compiled graphs of one (Rp, K) apart (part of the shape recorded)."""
        if self._function is None or not self.compiled:
            return None
        key = (total, self.capacity) if variant is None else (total, self.capacity, variant)
        new = key not in (getattr(self.model, self.shapes_attribute, None) or [])
        if new and compiled_variants(self.compiled_code) >= COMPILE_BUDGET:
            self.budget_note = (f"the process's compile budget ({COMPILE_BUDGET} shapes) is spent: calls of new shapes "
                                f"(here {total} rows x {self.capacity} cached keys) run eagerly")
            return None
        start = time.perf_counter()
        try:
            if new:  # one compile at a time in the process (packed_ss.models.process_state)
                with COMPILING:
                    out = self._call_compiled(inputs)
            elif COMPILING.acquire(blocking=False):  # a shape compiled before: dynamo checks only the guards that tell
                try:  # its variants apart, under a stance that is one per process, so only while nothing compiles
                    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                        out = self._call_compiled(inputs, known=True)
                finally:
                    COMPILING.release()
            else:  # another thread compiles meanwhile: every guard checked (the same variant, found more slowly)
                out = self._call_compiled(inputs)
        except Exception as error:  # noqa: BLE001 - inductor/C++ compiler failures: eager from now on
            self._give_up(error)
            self._set_length(self.length)
            return None
        if new:
            getattr(self.model, self.shapes_attribute).append(key)
            self.compile_s += time.perf_counter() - start
        return out.clone() if self.device.type == "cuda" else out  # CUDA graphs reuse their output buffer

    def _give_up(self, error: Exception) -> None:
        """Decode eagerly from now on, with a one-line warning; every adapter of the network does (``note``)."""
        self._function = None
        if getattr(self.model, self.failure_attribute, None) is None:
            object.__setattr__(self.model, self.failure_attribute, error)
            object.__setattr__(self.model, self.compiled_attribute, None)
            warnings.warn(self.note, RuntimeWarning, stacklevel=3)
