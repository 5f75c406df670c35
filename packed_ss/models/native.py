"""A decoder forward of our own for Llama-family checkpoints: the CPU fast path (issue #38).

transformers' modules spend most of a small model's call outside the math (mask and cache objects, output
dataclasses, per-module Python). :class:`NativeDecoder` runs the same network from the checkpoint's own weights
with fused projections (one q|k|v matrix and one gate|up matrix per layer), a plain preallocated KV cache tensor,
rotary embeddings computed from the explicit position ids and attention written out over the cache and the call's
own keys. transformers still loads the checkpoint, gives the configuration, and is the reference that the tests
compare these logits with (``tests/test_native.py``).

A call comes in two forms (:attr:`NativeCalls.in_place`). torch.compile's calls never write the cache: the call
returns its new keys and values and the caller writes them at the cache's length, so a compiled graph mutates
nothing and inductor neither copies the cache nor recompiles when its length moves; the additive mask carries the
length. Eager calls and the graph path's CUDA graphs write them into the cache inside the call (``slots``) and
attend over the cache alone, which saves the copies and the score pieces of the call's own keys.

Served: model types :data:`NATIVE_TYPES` on the CPU and on CUDA (where its padded calls replay as CUDA graphs by
default, :mod:`packed_ss.models.graphs`), full attention, SiLU MLPs, static RoPE. Anything else
(another family, a forward hook other than the drafter LoRA's row gate, the eager attention kernel asked for) keeps
transformers' forward, and :func:`native_problem` says why in one line. Any-order models (SetDLM's Qwen3) are served:
their layouts are masks and positions like any other (``tests/test_setdlm.py``). The drafter LoRA (:mod:`packed_ss.models.lora`) runs here
too: its A and B matrices are added to the fused projections' columns, on the rows a per-call gate selects.

Shape legend: R rows of the call (Rp padded), K cache capacity, C cached tokens, L layers, Hq query heads,
Hkv key/value heads, G = Hq / Hkv, hd head size, H hidden size, V vocabulary.
"""

from __future__ import annotations

import os
import warnings
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from packed_ss.layout import PREFILL
from packed_ss.models.gemm_blocking import blocking_key, few_row_blocking
from packed_ss.models.static import CAPACITY_STEP, StaticCalls, dynamo_settings, padded_rows, static_cache_problem

# Llama-family types whose decoder layer is RMSNorm -> attention (RoPE) -> residual -> RMSNorm -> SiLU-gated MLP ->
# residual. qwen2: biases on q, k and v; qwen3: RMSNorm on each head of q and k; ministral3 (Nemotron-Labs-Diffusion):
# Llama-4 query scaling by position.
NATIVE_TYPES = frozenset({"llama", "mistral", "ministral3", "qwen2", "qwen3"})
STATIC_ROPE = frozenset({"default", "linear", "llama3", "yarn"})  # inv_freq does not depend on the call's length

# How a call attends (NativeDecoder.forward's ``attention``): eager calls use "sdpa" (NativeCalls.attention),
# torch.compile's "written" (COMPILED_ATTENTION); the graph path on CUDA uses GRAPH_ATTENTION
# (packed_ss.models.graphs), and scripts/gpu_check.py measures both there.
ATTENTIONS = ("written", "sdpa")

NATIVE = "packed_ss_native_decoder"  # attribute of the transformers network holding its NativeDecoder
NATIVE_COMPILED = "packed_ss_native_compiled"  # ... its compiled NativeDecoder
NATIVE_FAILURE = "packed_ss_native_compile_failure"  # ... or the error compiling it raised
NATIVE_SHAPES = "packed_ss_native_shapes"  # ... and the (Rp, K, variant) compiled so far (NativeCalls.execute)
NATIVE_SIGNATURE = "packed_ss_native_signature"  # ... and the weights the decoder was made from

# Inductor settings of the compiled path: weights frozen as constants (so GEMMs get prepacked kernels), GEMM
# kernels chosen by measuring inductor's C++ micro-GEMM template against ATen's for each shape (once per shape and
# cache dir), and on a CPU the compiled call's wrapper in C++ (its kernels launched from C++, not one Python call
# each; a 1-row call of the embedded model 0.46-0.49 ms against 0.51-0.56 ms without, docs/speed.md;
# PACKED_SS_CPP_WRAPPER=0 leaves it out). They are set around the calls that compile (torch.compile's ``options`` leaves freezing off in torch 2.13).
FROZEN_OPTIONS = {"freezing": True, "cpp_wrapper": True}  # float64: no tuned GEMM templates
COMPILE_OPTIONS = {**FROZEN_OPTIONS, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
                   "autotune_num_choices_displayed": 0, "max_autotune_report_choices_stats": False}  # quiet stderr
TUNED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # the C++ micro-GEMMs' types; float64 is only frozen
COMPILED_ATTENTION = "written"  # how torch.compile's calls attend (NativeDecoder.forward's ``attention``)
# The attention temporaries one in-place call may build at once (its query rows are taken in chunks past it): an
# 8,192-token prompt on NLD-3B's shape would otherwise build about 5 GB of scores on a GPU (attention_temporaries).
ATTENTION_BYTES = 512 << 20
# Per (query head, row, key): scores, their scaled and masked copies and the float32 softmax, at most 16 bytes, as
# written out or as SDPA's math kernel builds them (its memory-efficient kernel builds none); the mask, repeated per
# query group, 4 more per (group, row, key).
SCORE_BYTES, MASK_BYTES = 16, 4


def attention_chunk(rows: int, keys: int, heads: int, kv_heads: int, budget: int | None = None) -> int:
    """Query rows attended at once in an in-place call of ``rows`` rows over ``keys`` keys with ``heads`` query and
    ``kv_heads`` key/value heads, so that one chunk's temporaries stay within ``budget`` bytes (default
    :data:`ATTENTION_BYTES`): all ``rows`` when they fit, else at least 1. Raises: ValueError for a count below 1."""
    if min(rows, keys, heads, kv_heads) < 1:
        raise ValueError(f"rows, keys and heads must be >= 1, got {rows}, {keys}, {heads}, {kv_heads}")
    per_row = keys * (SCORE_BYTES * heads + MASK_BYTES * (heads // kv_heads))
    return max(1, min(rows, (ATTENTION_BYTES if budget is None else budget) // per_row))


def attention_temporaries(rows: int, keys: int, heads: int, kv_heads: int, budget: int | None = None) -> int:
    """Bytes of attention temporaries an in-place native call of ``rows`` rows over ``keys`` keys builds at most: its
    (rows, keys) float32 mask and one chunk's scores and repeated mask (:func:`attention_chunk`)."""
    chunk = attention_chunk(rows, keys, heads, kv_heads, budget)
    return rows * keys * MASK_BYTES + chunk * keys * (SCORE_BYTES * heads + MASK_BYTES * (heads // kv_heads))


def sdpa_backends(device: torch.device):
    """The SDPA kernels a call on ``device`` may use: on CUDA the memory-efficient kernel (it takes an additive mask
    and builds no scores) and the math kernel, never cuDNN's (a known fault of its graphs past 1,024 keys) nor flash
    (no additive mask); None elsewhere (torch's own choice). Shown by name in :meth:`sdpa_names`."""
    if device.type != "cuda":
        return None
    from torch.nn.attention import SDPBackend

    return [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_pinned(device: torch.device):
    """A context in which SDPA on ``device`` uses :func:`sdpa_backends` only (nothing pinned off CUDA)."""
    import contextlib

    backends = sdpa_backends(device)
    if backends is None:
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(backends)


def sdpa_names(device: torch.device) -> list[str] | None:
    """:func:`sdpa_backends` by name (what a capture records), None where torch chooses."""
    backends = sdpa_backends(device)
    return None if backends is None else [backend.name for backend in backends]


def native_problem(model) -> str | None:
    """Why :class:`NativeDecoder` cannot serve ``model`` (a loaded transformers causal LM), or None when it can."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in NATIVE_TYPES:
        return f"model type {kind!r} has no native forward (it serves {', '.join(sorted(NATIVE_TYPES))})"
    device = next(model.parameters()).device
    if device.type not in ("cpu", "cuda"):
        return f"the native forward serves CPU and CUDA models; on {device.type} transformers' forward is used"
    hooked = [name for name, module in model.named_modules()
              if (module._forward_hooks or module._forward_pre_hooks) and not _gate_hooks_only(module)]
    if hooked:
        return (f"the model carries forward hooks ({hooked[0]}{' ...' if len(hooked) > 1 else ''}: a change to its "
                f"computation), which only transformers' forward runs")
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        return "the checkpoint asks for transformers' eager attention kernel"
    why = static_cache_problem(config)
    if why:
        return why
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return f"MLP {getattr(config, 'hidden_act', None)!r}{' with biases' if getattr(config, 'mlp_bias', False) else ''} is not served"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope not in STATIC_ROPE:
        return f"RoPE type {rope!r} changes with the sequence length"
    if type(model.get_output_embeddings()) is not torch.nn.Linear or model.get_output_embeddings().bias is not None:
        return "the LM head is not a plain linear layer"
    for layer in model.model.layers:
        attention = layer.self_attn
        for projection in (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj,
                           layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            if type(projection) is not torch.nn.Linear:
                why = _lora_problem(projection)
                if why:
                    return why
    return None


def _gate_hooks_only(module) -> bool:
    """Whether ``module``'s hooks are only the drafter LoRA's row gate (:class:`DrafterLora`), which the native
    forward applies itself."""
    from packed_ss.models.lora import DrafterLora

    return not module._forward_pre_hooks and all(getattr(hook, "__func__", None) is DrafterLora._apply_gate
                                                 for hook in module._forward_hooks.values())


def _lora_problem(projection) -> str | None:
    """Why the native forward cannot run ``projection`` (not a plain linear layer), or None for a linear layer carrying
    the drafter LoRA alone as :class:`DrafterLora` loads it (plain LoRA, no dropout, not merged)."""
    from packed_ss.models.lora import ADAPTER_NAME

    kind = type(projection).__name__
    base = projection.get_base_layer() if hasattr(projection, "get_base_layer") else None
    if type(base) is not torch.nn.Linear or not hasattr(projection, "lora_A"):
        return f"a projection is a {kind}, not a plain linear layer (an adapter)"
    if set(projection.lora_A) != {ADAPTER_NAME} or getattr(projection, "merged", False):
        return f"a projection's LoRA is not the drafter adapter alone, unmerged ({kind})"
    variant = getattr(projection, "lora_variant", {}) or {}
    if (ADAPTER_NAME in variant or (getattr(projection, "lora_bias", {}) or {}).get(ADAPTER_NAME, False)
            or type(projection.lora_dropout[ADAPTER_NAME]) is not torch.nn.Identity):
        return "the drafter LoRA uses DoRA, biases or dropout, which only transformers' forward runs"
    return None


def _lora_parts(projection) -> tuple | None:
    """(A (r, in), B (out, r), scaling) of the drafter LoRA on ``projection`` (its own tensors), None without one."""
    from packed_ss.models.lora import ADAPTER_NAME

    if not hasattr(projection, "lora_A"):
        return None
    return (projection.lora_A[ADAPTER_NAME].weight.detach(), projection.lora_B[ADAPTER_NAME].weight.detach(),
            float(projection.scaling[ADAPTER_NAME]))


def _base_linear(projection):
    """The plain linear layer under a LoRA-carrying projection (the projection itself when plain)."""
    return projection.get_base_layer() if hasattr(projection, "get_base_layer") else projection


def _frozen(tensor: torch.Tensor | None) -> torch.nn.Parameter | None:
    return None if tensor is None else torch.nn.Parameter(tensor.detach(), requires_grad=False)


def _joined(*linears) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One (sum of outs, in) weight, and one bias (None when no part has one), from linears over the same input."""
    linears = [_base_linear(linear) for linear in linears]
    weight = torch.cat([linear.weight.detach() for linear in linears]).contiguous()
    if all(linear.bias is None for linear in linears):
        return weight, None
    bias = torch.cat([linear.bias.detach() if linear.bias is not None else
                      torch.zeros(linear.out_features, dtype=weight.dtype, device=weight.device) for linear in linears])
    return weight, bias


def _held_once(linears, fused: torch.Tensor) -> None:
    """Make each of ``linears``' weights a view of its rows of ``fused``: the network's own modules and the native
    forward then read one copy of the projection weights (an 8B model's would otherwise sit twice in GPU memory)."""
    start = 0
    for linear in map(_base_linear, linears):
        rows = linear.out_features
        linear.weight = torch.nn.Parameter(fused[start:start + rows], requires_grad=linear.weight.requires_grad)
        start += rows


def _sliced_loras(projections) -> tuple:
    """((start, end, A, B, scaling), ...): the drafter LoRA of each of ``projections`` (fused into one matrix in this
    order) with the columns of the fused output it adds to."""
    found, start = [], 0
    for projection in projections:
        end = start + projection.out_features
        parts = _lora_parts(projection)
        if parts is not None:
            found.append((start, end, *parts))
        start = end
    return tuple(found)


class NativeLayer(torch.nn.Module):
    """One decoder layer's weights: fused q|k|v (and its bias), o, fused gate|up, down, the two norms (and q/k norms).
    The network's separate q, k, v, gate and up weights become views of the fused ones (held once)."""

    def __init__(self, layer):
        super().__init__()
        attention, mlp = layer.self_attn, layer.mlp
        qkv, qkv_bias = _joined(attention.q_proj, attention.k_proj, attention.v_proj)
        gate_up, _ = _joined(mlp.gate_proj, mlp.up_proj)
        _held_once((attention.q_proj, attention.k_proj, attention.v_proj), qkv)
        _held_once((mlp.gate_proj, mlp.up_proj), gate_up)
        self.qkv, self.qkv_bias = _frozen(qkv), _frozen(qkv_bias)
        o, down = _base_linear(attention.o_proj), _base_linear(mlp.down_proj)
        self.o, self.o_bias = _frozen(o.weight), _frozen(o.bias)
        self.gate_up, self.down = _frozen(gate_up), _frozen(down.weight)
        # the drafter LoRA (packed_ss.models.lora), where it is loaded: per fused matrix, the columns it adds to
        self.lora_qkv = _sliced_loras((attention.q_proj, attention.k_proj, attention.v_proj))
        self.lora_o = _sliced_loras((attention.o_proj,))
        self.lora_gate_up = _sliced_loras((mlp.gate_proj, mlp.up_proj))
        self.lora_down = _sliced_loras((mlp.down_proj,))
        self.norm_in = _frozen(layer.input_layernorm.weight)
        self.norm_out = _frozen(layer.post_attention_layernorm.weight)
        q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        # qwen3's per-head RMSNorm weights of q and k, one row per head of [q | k] (Hq + Hkv, hd): both normed at once
        if q_norm is None:
            self.qk_norm = None
        else:
            size = q_norm.weight.shape[0]  # hd
            heads = (attention.q_proj.out_features // size, attention.k_proj.out_features // size)
            self.qk_norm = _frozen(torch.cat((q_norm.weight.detach().expand(heads[0], -1),
                                              k_norm.weight.detach().expand(heads[1], -1))))
        self.scaling = float(attention.scaling)


class NativeDecoder(torch.nn.Module):
    """The network of a transformers Llama-family causal LM (:data:`NATIVE_TYPES`), as one plain forward.

    The embedding and LM head share the checkpoint's tensors; each layer's fused matrices replace the network's
    separate projection weights, which become views of them (the weights are held once). Check
    :func:`native_problem` first.
    """

    def __init__(self, model):
        super().__init__()
        config, base = model.config, model.model
        self.layers = torch.nn.ModuleList(NativeLayer(layer) for layer in base.layers)
        self.embed = _frozen(base.embed_tokens.weight)
        self.norm = _frozen(base.norm.weight)
        self.head = _frozen(model.get_output_embeddings().weight)
        self.eps = float(config.rms_norm_eps)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        rotary = base.rotary_emb
        self.register_buffer("inv_freq", rotary.inv_freq.detach().float().clone(), persistent=False)
        self.rope_scale = float(getattr(rotary, "attention_scaling", 1.0))
        rope = getattr(config, "rope_parameters", None) or {}
        beta = rope.get("llama_4_scaling_beta") if config.model_type == "ministral3" else None
        self.llama4 = (float(beta), float(rope["original_max_position_embeddings"])) if beta is not None else None

    @property
    def layer_count(self) -> int:
        return len(self.layers)

    # Whether RMSNorm runs as torch's rms_norm (one fused kernel on CUDA) instead of written out (8 kernels on a
    # half-precision GPU call, faster on the CPU); None: on CUDA tensors. Both normalise in float32 and round before
    # the weight multiplies, as transformers does. On the CPU rms_norm is those very operations (bitwise the same,
    # tests/test_native.py); CUDA's kernel sums the squares in another order, so it may differ by an ulp
    # (tests/test_cuda.py compares with a tolerance). float64 stays written out: transformers normalises in float32
    # whatever the dtype, and rms_norm would compute in float64.
    fused_norm: bool | None = None

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """RMSNorm as transformers computes it: normalised in float32, rounded to the model's dtype, then times the
        weight in the model's dtype."""
        if x.dtype != torch.float64 and (self.fused_norm or (self.fused_norm is None and x.is_cuda)):
            # rms_norm without a weight: x / rms(x) in float32 (it upcasts half precision), cast back to x's dtype
            return weight * F.rms_norm(x, (x.shape[-1],), None, self.eps)
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * y.to(x.dtype)

    @staticmethod
    def _adapted(result: torch.Tensor, x: torch.Tensor, loras: tuple, gate: torch.Tensor | None) -> torch.Tensor:
        """``result`` (R, out) of a (fused) projection of ``x`` plus the drafter LoRA on its columns, gated per row:
        (B A x * gate) * scaling, as peft and :class:`DrafterLora`'s hook compute it; as is when ``gate`` is None."""
        if gate is None or not loras:
            return result
        for start, end, a, b, scaling in loras:
            result[:, start:end] += F.linear(F.linear(x, a), b) * gate[:, None] * scaling
        return result

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
        """RoPE: x cos + rotate_half(x) sin, with rotate_half(x) = [-x2 | x1]. ``signed_sin`` is [-sin | sin] over the
        two halves, so the negation is folded into it (bitwise the same: negation is exact), one kernel fewer."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * signed_sin

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, bias: torch.Tensor, cache: torch.Tensor,
                hidden_only: bool = False, keep: torch.Tensor | None = None,
                attention: str = "written", gate: torch.Tensor | None = None,
                slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One call over [cache | new rows].

        Args:
            ids, positions: (R,) token ids and absolute positions.
            bias: (R, Kc + R) additive attention mask (0 where a row may attend, -inf elsewhere) over the first Kc
                cache slots, then the call's own rows; (R, Kc) when ``slots`` is given (the rows are in the cache).
            cache: (L, 2, Hkv, Kc', hd) keys (index 0) and values (1); only its first Kc slots are read.
            hidden_only: return final-norm hidden states (n, H) instead of logits (n, V).
            keep: (n,) rows to return (default all R), selected before the LM head.
            attention: ``"written"`` (default): scores, softmax and values as separate kernels (without ``slots``:
                over the cache and over the call's own keys apart, never copying the cache); ``"sdpa"``: one
                ``scaled_dot_product_attention`` (without ``slots``: over [cache | new keys], a copy of the Kc cached
                keys per layer). :data:`ATTENTIONS`.
            gate: (R,) the drafter LoRA's multiplier per row in the model's dtype (1: a proposal row, 0: not), or
                None: the adapter is off for the call (paper Appendix F.2; what :class:`DrafterLora`'s hooks do on
                transformers' forward, in the same order of operations).
            slots: (R,) cache slots (< Kc) the new rows' keys and values are written to, in place, before each layer
                attends over its Kc cache slots alone; or None (default): the cache is only read.
        Returns: (logits or hidden states of the kept rows, the new rows' keys and values (L, 2, Hkv, R, hd), or
        None when ``slots`` wrote them into the cache).
        """
        rows = ids.shape[0]
        cached = bias.shape[-1] - (0 if slots is not None else rows)  # Kc: the cache slots each layer reads
        hq, hkv, hd = self.heads, self.kv_heads, self.head_dim
        group = hq // hkv
        x = F.embedding(ids, self.embed)
        freqs = positions[:, None].float() * self.inv_freq[None]
        cos = (torch.cat((freqs, freqs), -1).cos() * self.rope_scale).to(x.dtype)[:, None]  # (R, 1, hd)
        sin = (freqs.sin() * self.rope_scale).to(x.dtype)
        signed_sin = torch.cat((-sin, sin), -1)[:, None]  # [-sin | sin]: rotate_half's sign (see _rotate)
        if self.llama4 is not None:  # Nemotron-Labs-Diffusion: queries scaled from position 16,384 on
            beta, original = self.llama4
            q_scale = (1 + beta * torch.log(1 + torch.floor(positions.float() / original))).to(x.dtype)[:, None, None]
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        # in place, a long call's query rows attend in chunks (ATTENTION_BYTES); the mask is repeated per chunk then
        chunk = rows if slots is None else attention_chunk(rows, cached, hq, hkv)
        if chunk == rows:
            bias = bias.repeat(group, 1)  # (G R, Kc + R): query rows are grouped per key/value head
            if attention == "sdpa":
                bias = bias.to(x.dtype)  # SDPA takes a float mask of the queries' dtype (0 and -inf are exact in any)
        softmax_dtype = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else None
        new_kv = [] if slots is None else None
        for index, layer in enumerate(self.layers):
            normed = self._rms(x, layer.norm_in)
            h = self._adapted(F.linear(normed, layer.qkv, layer.qkv_bias), normed, layer.lora_qkv, gate)
            qk, v = h[:, :(hq + hkv) * hd].view(rows, hq + hkv, hd), h[:, (hq + hkv) * hd:].view(rows, hkv, hd)
            if layer.qk_norm is not None:
                qk = self._rms(qk, layer.qk_norm)
            qk = self._rotate(qk, cos, signed_sin)  # q's and k's heads at once: half the elementwise kernels
            q, k = qk[:, :hq], qk[:, hq:]
            if self.llama4 is not None:
                q = q * q_scale
            q = q.view(rows, hkv, group, hd).permute(1, 2, 0, 3).reshape(hkv, group * rows, hd)
            kv = torch.stack((k.transpose(0, 1), v.transpose(0, 1)))  # (2, Hkv, R, hd)
            if slots is None:
                new_kv.append(kv)
            else:  # the rows join the cache first; attention then reads the cache alone
                cache[index].index_copy_(2, slots, kv)
            old_k, old_v = cache[index, 0, :, :cached], cache[index, 1, :, :cached]  # (Hkv, Kc, hd)
            if slots is not None and chunk < rows:
                out = self._attend_chunked(q, old_k, old_v, bias, layer.scaling, attention, softmax_dtype, chunk)
            elif slots is not None:
                out = self._attend(q, old_k, old_v, bias, layer.scaling, attention, softmax_dtype)
            elif attention == "sdpa":
                keys, values = torch.cat((old_k, kv[0]), 1), torch.cat((old_v, kv[1]), 1)  # (Hkv, Kc + R, hd)
                out = self._attend(q, keys, values, bias, layer.scaling, attention, softmax_dtype)
            else:  # over the cache and the call's own keys apart: the cache is never copied
                scores = torch.cat((q @ old_k.transpose(1, 2), q @ kv[0].transpose(1, 2)), -1) * layer.scaling + bias
                weights = torch.softmax(scores, -1, dtype=softmax_dtype).to(q.dtype)
                out = weights[..., :cached] @ old_v + weights[..., cached:] @ kv[1]  # (Hkv, G R, hd)
            out = out.view(hkv, group, rows, hd).permute(2, 0, 1, 3).reshape(rows, hq * hd)
            x = x + self._adapted(F.linear(out, layer.o, layer.o_bias), out, layer.lora_o, gate)
            normed = self._rms(x, layer.norm_out)
            g, up = self._adapted(F.linear(normed, layer.gate_up), normed, layer.lora_gate_up, gate).chunk(2, -1)
            inner = F.silu(g) * up
            x = x + self._adapted(F.linear(inner, layer.down), inner, layer.lora_down, gate)
        if keep is not None:
            x = x.index_select(0, keep)
        x = self._rms(x, self.norm)
        return (x if hidden_only else F.linear(x, self.head)), (None if new_kv is None else torch.stack(new_kv))

    @classmethod
    def _attend_chunked(cls, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                        scaling: float, attention: str, softmax_dtype: torch.dtype | None, chunk: int) -> torch.Tensor:
        """:meth:`_attend` with the queries taken ``chunk`` rows at a time: ``bias`` (R, S) not yet repeated per
        group; the same (Hkv, G R, hd) out. Every row's attention is its own, so the result is the whole call's."""
        hkv, grouped, hd = q.shape
        rows = bias.shape[0]
        group = grouped // rows
        q = q.view(hkv, group, rows, hd)
        out = torch.empty_like(q)
        for start in range(0, rows, chunk):
            stop = min(rows, start + chunk)
            part = bias[start:stop].repeat(group, 1)  # (G c, S)
            if attention == "sdpa":
                part = part.to(q.dtype)
            out[:, :, start:stop] = cls._attend(q[:, :, start:stop].reshape(hkv, group * (stop - start), hd), keys,
                                                values, part, scaling, attention, softmax_dtype
                                                ).view(hkv, group, stop - start, hd)
        return out.view(hkv, grouped, hd)

    @staticmethod
    def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scaling: float,
                attention: str, softmax_dtype: torch.dtype | None) -> torch.Tensor:
        """Attention of the grouped queries q (Hkv, G R, hd) over ``keys`` and ``values`` (Hkv, S, hd) with the
        additive mask ``bias`` (G R, S): (Hkv, G R, hd). ``"sdpa"`` takes a mask of the queries' dtype and runs on
        :func:`sdpa_backends` (on CUDA: never cuDNN's kernel)."""
        if attention == "sdpa":
            if not q.is_cuda:  # torch's own kernel choice: no context to enter on a CPU call's every layer
                return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=bias,
                                                      scale=scaling)[0]
            with sdpa_pinned(q.device):
                return F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=bias,
                                                      scale=scaling)[0]
        weights = torch.softmax((q @ keys.transpose(1, 2)) * scaling + bias, -1, dtype=softmax_dtype).to(q.dtype)
        return weights @ values


def weights_signature(model) -> tuple:
    """What a :class:`NativeDecoder`'s copies of the network's weights (fused, cast) were made from: per parameter its
    storage, in-place version, dtype and device. A ``model.float()``, ``.to(device)``, ``load_state_dict`` or any
    in-place edit of a weight changes it."""
    return tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in model.parameters())


def native_decoder(model) -> NativeDecoder:
    """The network's :class:`NativeDecoder`, kept on it (every adapter of the network shares it) and made again, with
    everything compiled from the old one dropped, when the network's weights changed since it was made
    (:func:`weights_signature`: a float64 network turned float32 had kept a float64 decoder, so its "float32" calls
    ran in float64)."""
    found = getattr(model, NATIVE, None)
    signature = weights_signature(model)
    if found is None or getattr(model, NATIVE_SIGNATURE, None) != signature:
        for name in (NATIVE_COMPILED, NATIVE_FAILURE, NATIVE_SHAPES):
            model.__dict__.pop(name, None)
        found = NativeDecoder(model).eval()
        object.__setattr__(model, NATIVE, found)
        object.__setattr__(model, NATIVE_SIGNATURE, weights_signature(model))  # as the decoder left them
    return found


def compiled_parts(model) -> tuple | None:
    """What the network's compiled native calls depend on and have made: ``(its NativeDecoder, the compiled function,
    the variants compiled)``, or None when nothing was compiled. A later load of the same checkpoint in the same
    dtype adopts them (:func:`adopt_compiled`) instead of compiling again: dynamo's compiled graphs are guarded by the
    decoder they were made for, so a new decoder per load compiled every shape again and spent the recompile budget
    (one visitor's reloads turned compiling off for every visitor, issue 54)."""
    function = getattr(model, NATIVE_COMPILED, None)
    if function is None:
        return None
    return getattr(model, NATIVE), function, getattr(model, NATIVE_SHAPES)


def adopt_compiled(model, parts: tuple) -> None:
    """Give the freshly loaded network ``model`` the :func:`compiled_parts` of an earlier load of the same checkpoint
    and dtype (its weights' values are those of the decoder adopted, so its calls give the same logits)."""
    decoder, function, shapes = parts
    for name, value in ((NATIVE, decoder), (NATIVE_COMPILED, function), (NATIVE_SHAPES, shapes),
                        (NATIVE_SIGNATURE, weights_signature(model))):
        object.__setattr__(model, name, value)


class NativeKV:
    """Per-layer views of a native cache, shaped as transformers' cache layers: ``keys`` and ``values``
    (1, Hkv, K, hd) each (what :meth:`DualModeModel.cached_kv` reads)."""

    def __init__(self, tensor: torch.Tensor):
        self.keys, self.values = tensor[0][None], tensor[1][None]


class NativeCache:
    """The (L, 2, Hkv, K, hd) cache tensor and its per-layer views (``layers``)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.layers = [NativeKV(layer) for layer in tensor]


class NativeCalls(StaticCalls):
    """The static cache and calls of :class:`StaticCalls`, run by the network's :class:`NativeDecoder`.

    Eager calls attend over the C cached keys only; compiled calls over the whole capacity, padded as
    :func:`~packed_ss.models.static.padded_rows` says, through ``torch.compile`` with :data:`COMPILE_OPTIONS`.
    """

    def __init__(self, model, hidden_only: bool, compiled: bool = False, compiler=None):
        self.native = native_decoder(model)
        super().__init__(model, hidden_only, compiled, compiler)

    # --- compiling (per network, as StaticCalls does for transformers' forward) ---------------
    def _compile(self, compiler):
        found = getattr(self.model, NATIVE_COMPILED, None)
        if found is not None or getattr(self.model, NATIVE_FAILURE, None) is not None:
            return found
        settings = dynamo_settings()
        try:
            if settings.disable and compiler is None:
                raise RuntimeError("torch.compile is disabled in this process (TORCH_COMPILE_DISABLE or TORCHDYNAMO_DISABLE)")
            function = (compiler or torch.compile)(self.native, dynamic=False, fullgraph=True)
        except Exception as error:  # noqa: BLE001 - any compiler set-up failure: eager, with one line
            object.__setattr__(self.model, NATIVE_FAILURE, error)
            return None
        object.__setattr__(self.model, NATIVE_COMPILED, function)
        object.__setattr__(self.model, NATIVE_SHAPES, [])
        return function

    compiled_attribute, failure_attribute, shapes_attribute = NATIVE_COMPILED, NATIVE_FAILURE, NATIVE_SHAPES
    compiled_code = NativeDecoder.forward.__code__
    # NativeDecoder.forward's attention (ATTENTIONS) for this adapter's eager calls: one SDPA over the cache, which
    # in place copies nothing (0-4% faster than written out on the embedded model here, 11-12% at an 834-token
    # prompt: scripts/call_form_ab.py --compare attention, docs/speed.md). torch.compile's calls attend written out
    # (COMPILED_ATTENTION), as they were measured.
    attention = "sdpa"

    # --- the cache ----------------------------------------------------------------------------
    def _allocate(self, tokens: int, keep: int = 0) -> None:
        capacity = -(-tokens // CAPACITY_STEP) * CAPACITY_STEP
        native = self.native
        tensor = torch.zeros(native.layer_count, 2, native.kv_heads, capacity, native.head_dim,
                             dtype=native.embed.dtype, device=native.embed.device)
        if self.cache is not None and keep:  # grown mid-run: carry the prefix over
            tensor[:, :, :, :keep] = self.cache.tensor[:, :, :, :keep]
        self.cache = NativeCache(tensor)
        self.capacity = capacity

    def _set_length(self, length: int) -> None:
        pass  # the length lives in self.length only; the masks carry it

    def crop_left(self, drop: int) -> None:
        keep = self.length - drop
        tensor = self.cache.tensor
        tensor[:, :, :, :keep] = tensor[:, :, :, drop:self.length].clone()
        self.length = keep

    # --- one call -----------------------------------------------------------------------------
    gated_graphs = False  # whether calls with the drafter LoRA on run compiled too (else eagerly)
    # Whether the forward writes the call's keys and values into the cache itself (NativeDecoder.forward's
    # ``slots``: the Rp rows at slots C .. C + Rp - 1, padding rows past the length, unread) and attends over the
    # cache alone. None: eager calls do (2-5% faster on the CPU than the read-only form); torch.compile's calls
    # keep the cache read-only (compiled in place, AR took 1.40x and Packed-SS 1.23x as long on the embedded model:
    # inductor copies the mutated cache; scripts/call_form_ab.py --compiled). The graph path: True (every call).
    in_place: bool | None = None

    def _writes_cache(self, compiled: bool) -> bool:
        return self.in_place if self.in_place is not None else not compiled

    def prepare(self, layout, eager: bool = False, adapter_rows: tuple[int, ...] = ()) -> tuple:
        """Host work of a call: padded rows, ids, positions, the additive mask and, in place, the cache slots of the
        rows; and the drafter LoRA's row gate (1 on ``adapter_rows``; none when empty: the adapter is off); grows
        the cache when the call does not fit. Compiled calls see all K slots; eager ones the C cached slots (and,
        in place, their own C .. C + R - 1)."""
        rows, cached = layout.rows, self.length
        compiled = (self.compiled and not eager and PREFILL not in layout.regions
                    and (not adapter_rows or self.gated_graphs))
        total = padded_rows(rows, self.block_size) if compiled else rows
        if cached + total > self.capacity:
            self._allocate(cached + total, keep=cached)
        in_place = self._writes_cache(compiled)
        # the mask's cache columns (Kc): compiled calls read every slot, eager ones the cached (and in place, own) ones
        columns = self.capacity if compiled else cached + (total if in_place else 0)
        own = cached if in_place else columns  # where the call's own rows sit among the mask's columns
        ids = np.zeros((3, total), dtype=np.int64)
        ids[0, :rows], ids[1, :rows] = layout.token_ids, layout.position_ids
        ids[0, rows:] = layout.token_ids[-1]  # padding rows: any token at position 0, seeing only themselves
        ids[2] = cached + np.arange(total)  # in place: the rows' cache slots
        # the additive mask, written in place (4x faster than a boolean mask turned into floats at 64 x 2,048)
        bias = np.full((total, columns + (0 if in_place else total)), -np.inf,
                       dtype=_numpy_dtype(self.cache.tensor.dtype))
        bias[:rows, :cached] = 0
        bias[:rows, own:own + rows][layout.mask.numpy()] = 0
        padding = np.arange(rows, total)
        bias[padding, own + padding] = 0
        gate = None
        if adapter_rows:
            gate = torch.zeros(total, dtype=self.cache.tensor.dtype)
            gate[list(adapter_rows)] = 1
        # (ids, positions, slots) as one (3, Rp) tensor: one copy to the device, not three
        return (torch.from_numpy(ids), torch.from_numpy(bias), in_place), rows, total, compiled, gate

    def execute(self, prepared: tuple, need: tuple[int, ...], defer: bool = False) -> tuple[torch.Tensor, bool]:
        """Run a call made by :meth:`prepare`; returns (logits of the rows ``need``, False), or their final hidden
        states and True when ``defer`` (the caller applies the LM head to the rows it needs), and writes the new
        rows' keys and values at the cache's length (or the call did, :attr:`in_place`), which advances by R."""
        (index, bias, in_place), rows, total, compiled, gate = prepared
        device = self.cache.tensor.device
        keep = torch.as_tensor(need, dtype=torch.long, device=device)
        inputs = (index, bias, self.cache.tensor, defer, in_place)
        result = None
        if compiled:
            # a variant per output and form: compiled graphs of one (Rp, K) that dynamo tells apart
            variant = ("hidden" if defer else "logits", in_place)
            result = (self._compiled_call(inputs, total, variant) if gate is None
                      else self._gated_call(inputs, total, gate))
        if result is None:
            if device.type != "cpu":  # the host's inputs, on the model's device (a GPU's eager calls)
                index, bias, gate = (None if t is None else t.to(device, non_blocking=True)
                                     for t in (index, bias, gate))
            out, new_kv = self.native(index[0], index[1], bias, self.cache.tensor, defer, keep, self.attention, gate,
                                      index[2] if in_place else None)
        else:
            out, new_kv = result
            out = out.index_select(0, keep)
        if new_kv is not None:
            self.cache.tensor[:, :, :, self.length:self.length + rows] = new_kv[:, :, :, :rows]
        self.length += rows
        return out, defer

    def _gated_call(self, inputs, total: int, gate: torch.Tensor):
        """A compiled call with the drafter LoRA on (rows gated by ``gate``), or None: run it eagerly (the CPU's
        compiled calls never take one, :attr:`gated_graphs`)."""
        return None

    def _call_compiled(self, inputs, known: bool = False):
        import torch._inductor.config

        tuned = self.native.embed.dtype in TUNED_DTYPES
        index, bias, cache, hidden_only, in_place = inputs  # in place only where asked (slower here)
        args = (index[0], index[1], bias, cache, hidden_only, None, COMPILED_ATTENTION, None,
                index[2] if in_place else None)
        if known:  # nothing compiles: inductor's settings and the autotuner's warnings do not apply (about 20 us)
            return self._function(*args)
        options = COMPILE_OPTIONS if tuned else FROZEN_OPTIONS
        # the C++ wrapper is the CPU's (CUDA's native calls replay graphs); PACKED_SS_CPP_WRAPPER=0 leaves it out
        if cache.device.type != "cpu" or os.environ.get("PACKED_SS_CPP_WRAPPER", "1") == "0":
            options = {k: v for k, v in options.items() if k != "cpp_wrapper"}
        # float32 on a CPU: a register blocking of inductor's micro-GEMM that suits few-row products (gemm_blocking;
        # PACKED_SS_GEMM_BLOCKING=0 leaves torch's), keyed into inductor's cache by a do-nothing post-grad pass
        blocking = (cache.device.type == "cpu" and self.native.embed.dtype == torch.float32
                    and os.environ.get("PACKED_SS_GEMM_BLOCKING", "1") != "0")
        key = blocking_key() if blocking else None
        if key is not None:
            options = {**options, "post_grad_custom_post_pass": key}
        with (torch._inductor.config.patch(options), few_row_blocking() if key is not None else nullcontext(),
              warnings.catch_warnings()):
            warnings.filterwarnings("ignore", message="TypedStorage is deprecated")  # inductor's autotuner, not ours
            return self._function(*args)


def _numpy_dtype(dtype: torch.dtype):
    """The mask's dtype: float64 for float64 models, else float32 (scores of half-precision models are promoted)."""
    return np.float64 if dtype == torch.float64 else np.float32

