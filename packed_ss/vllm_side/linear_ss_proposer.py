"""Linear-SS inside vLLM: the model's own diffusion drafter as a vLLM proposer (``method: "custom_class"``).

Runs in vLLM's environment (``bash scripts/make_vllm_env.sh``), never in the project's: it imports torch, safetensors
and vLLM only. Its folder goes on ``PYTHONPATH`` and vLLM is given the class path::

    speculative_config={"method": "custom_class", "model": "linear_ss_proposer.LinearSSProposer",
                        "num_speculative_tokens": W}

What it does per engine step, for every request that decodes (paper Section 2.3, Table 2, Linear-SS's first call):

* after vLLM's verify has committed tokens, the request's prefix P is ``token_ids_cpu[row, :n]``;
* one forward over ``[P[c:n-1] | P[n-1], MASK x W]``: the prefix rows not yet in the proposer's own cache (causal;
  their keys and values are kept, so the prefix is never computed twice) and the draft block (bidirectional within
  itself, over the whole prefix; mask ``J(B)`` of Appendix D.1; its keys are never kept);
* the block's W mask rows give q^(1..W): the draft is their argmax (greedy) or one draw from each (T > 0).

vLLM then verifies the draft in its own causal call (Linear-SS's second call) and its rejection sampler accepts d with
probability min(1, p(d) / q(d)) (Algorithm 2). vLLM 0.32.0 hands a custom proposer's draft probabilities to that
sampler only through its runner (``_draft_probs``, which it fills itself for model-based proposers only), so at
T > 0 the proposer writes them there; with no runner found it says so once and vLLM verifies the drafts as point
masses, which is lossless too (the draft is a function of the prefix and the proposer's seed) but accepts less.

The weights are the ones vLLM holds: the drafter calls vLLM's own layers (embedding, norms, fused ``qkv_proj`` and
``gate_up_proj``, rotary embedding, ``o_proj``, ``down_proj``, LM head) and only its attention is this module's (vLLM's
attention needs its per-step context and its causal-only metadata). A drafter LoRA (a peft folder, ``PACKED_SS_DRAFTER_LORA``;
Appendix F.2) is added on the draft block's rows only, as in the engine; the cached prefix rows stay the base model's.

Environment: ``PACKED_SS_DRAFTER_LORA`` (a peft adapter folder), ``PACKED_SS_PROPOSER_LOG`` (a file: one JSON line per
draft, ``{"prefix": [ids], "draft": [ids], "q_max": [max q per row], "temperature": T, "q_to_verifier": whether
vLLM's sampler got q}``, for call-for-call checks).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import torch

log = logging.getLogger("linear_ss_proposer")
CACHE_STEP = 256  # the proposer's key/value buffers grow by this many positions at a time


class PrefixCache:
    """One request's keys and values of its prefix less its last token, per layer: ``(kv_heads, capacity, head_dim)``
    buffers of which the first ``len(tokens)`` positions are filled."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
        self.tokens: list[int] = []
        self.keys = [torch.empty(kv_heads, 0, head_dim, dtype=dtype) for _ in range(layers)]
        self.values = [torch.empty(kv_heads, 0, head_dim, dtype=dtype) for _ in range(layers)]

    def common(self, tokens) -> int:
        """How many leading tokens this cache shares with ``tokens`` (its keys for them stay valid)."""
        n = min(len(self.tokens), len(tokens))
        for i in range(n):
            if self.tokens[i] != tokens[i]:
                return i
        return n

    def keep(self, length: int) -> None:
        del self.tokens[length:]

    def copy(self, length: int) -> "PrefixCache":
        """A new cache holding this one's first ``length`` positions."""
        twin = PrefixCache(len(self.keys), self.keys[0].shape[0], self.keys[0].shape[2], self.keys[0].dtype)
        twin.tokens = self.tokens[:length]
        for layer in range(len(self.keys)):
            twin.append(layer, self.keys[layer][:, :length], self.values[layer][:, :length], 0)
        return twin

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor, start: int) -> None:
        """Store ``(kv_heads, e, head_dim)`` keys and values at positions ``start .. start + e - 1``."""
        end = start + keys.shape[1]
        if end > self.keys[layer].shape[1]:
            grown = (end // CACHE_STEP + 1) * CACHE_STEP
            for buffers in (self.keys, self.values):
                old = buffers[layer]
                new = old.new_empty(old.shape[0], grown, old.shape[2])
                new[:, :start] = old[:, :start]
                buffers[layer] = new
        self.keys[layer][:, start:end] = keys
        self.values[layer][:, start:end] = values


class DrafterLora:
    """A peft LoRA folder read with safetensors: per (layer, module) the pair ``(A (r, in), B (out, r))`` and the
    scale alpha / r. Targets: ``q_proj k_proj v_proj o_proj gate_proj up_proj down_proj``."""

    MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __init__(self, folder: Path, dtype: torch.dtype):
        from safetensors.torch import load_file

        config = json.loads((folder / "adapter_config.json").read_text())
        self.scale = float(config.get("lora_alpha", config["r"])) / float(config["r"])
        state = load_file(str(folder / "adapter_model.safetensors"))
        self.pairs: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        for key, tensor in state.items():
            if ".lora_A." not in key:
                continue
            path = key.split(".lora_A.")[0]
            module = path.rsplit(".", 1)[-1]
            parts = path.split(".")
            if module not in self.MODULES or "layers" not in parts:
                raise ValueError(f"drafter LoRA {folder}: cannot place {key!r} (LoRA on {', '.join(self.MODULES)} only)")
            layer = int(parts[parts.index("layers") + 1])
            self.pairs[(layer, module)] = (tensor.to(dtype), state[key.replace(".lora_A.", ".lora_B.")].to(dtype))

    def delta(self, layer: int, module: str, x: torch.Tensor) -> torch.Tensor | None:
        """The LoRA update (rows, out) of ``module`` in ``layer`` for inputs ``x`` (rows, in), or None."""
        pair = self.pairs.get((layer, module))
        if pair is None:
            return None
        a, b = pair
        return (x @ a.T) @ b.T * self.scale


class LinearSSProposer:
    """vLLM's ``custom_class`` proposer running Linear-SS's drafting call (see the module docstring).

    ``propose`` returns one draft (W token ids) per row of vLLM's input batch, an empty list for a row that has no
    new token this step or too little room left before ``max_model_len``.
    Raises: ValueError at start-up when the model's config has no ``mask_token_id`` (not a dual-mode checkpoint).
    """

    def __init__(self, vllm_config):
        self.width = int(vllm_config.speculative_config.num_speculative_tokens)
        hf = vllm_config.model_config.hf_config
        self.mask_id = getattr(hf, "mask_token_id", None)
        if self.mask_id is None:
            raise ValueError("the model's config has no mask_token_id: Linear-SS drafts with the mask token of a "
                             "dual-mode checkpoint")
        self.max_len = int(vllm_config.model_config.max_model_len)
        self.generator = torch.Generator().manual_seed(int(vllm_config.model_config.seed or 0))
        self.model = None
        self.runner = None
        self.caches: dict[int, PrefixCache] = {}  # by input-batch row, checked against its tokens each step
        self.lora: DrafterLora | None = None
        self.calls = 0
        self.log_path = os.environ.get("PACKED_SS_PROPOSER_LOG")
        if "vllm" in sys.modules:  # vLLM's process: its CPU build's T > 0 sampling needs one correction
            import cpu_sampling_fix

            if cpu_sampling_fix.apply():
                log.warning("Linear-SS proposer: corrected vLLM's expand_batch_to_tokens (uninitialised "
                            "temperatures at T > 0 on its CPU build; cpu_sampling_fix.py)")
        self._pending: list[dict] = []  # this step's log entries

    def load_model(self, target_model) -> None:
        """Take vLLM's own target module (called by vLLM's CPU runner, which is the caller's ``self``)."""
        self.model = target_model
        caller = sys._getframe(1).f_locals.get("self")
        self.runner = caller if hasattr(caller, "input_batch") and hasattr(caller, "_draft_probs") else None
        if self.runner is None:
            log.warning("Linear-SS proposer: vLLM's runner was not found; drafts are greedy and verified as point "
                        "masses at every temperature (lossless, fewer accepted at T > 0)")
        inner = target_model.model
        attention = inner.layers[0].self_attn
        self.layers = list(inner.layers)
        self.kv_heads, self.heads = attention.num_kv_heads, attention.num_heads
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.q_size, self.kv_size = attention.q_size, attention.kv_size
        self.dtype = inner.embed_tokens.weight.dtype
        folder = os.environ.get("PACKED_SS_DRAFTER_LORA")
        if folder:
            self.lora = DrafterLora(Path(folder), self.dtype)

    # --- vLLM's interface ------------------------------------------------------------------------------------------
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, **_) -> list[list[int]]:
        drafts: list[list[int]] = []
        probs: list[torch.Tensor | None] = []
        caches: dict[int, PrefixCache] = {}
        taken: dict[int, PrefixCache] = {}  # by id: the caches rows took this step
        for row, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[row])
            if not len(sampled) or n + self.width + 1 > self.max_len:
                drafts.append([])
                probs.append(None)
                continue
            prefix = token_ids_cpu[row, :n].tolist()
            cache = self._cache_for(row, prefix, taken)
            caches[row] = taken[id(cache)] = cache
            temperature = self._temperature(row)
            draft, q = self._draft(cache, prefix, temperature)
            drafts.append(draft)
            probs.append(q)
        self.caches = caches  # a request that left the batch leaves its cache behind
        handed = self._hand_over(drafts, probs)
        if self._pending:
            with open(self.log_path, "a") as handle:
                for entry in self._pending:
                    handle.write(json.dumps({**entry, "q_to_verifier": handed}) + "\n")
            self._pending.clear()
        return drafts

    # --- the drafting call -----------------------------------------------------------------------------------------
    def _cache_for(self, row: int, prefix: list[int], taken: dict[int, PrefixCache]) -> PrefixCache:
        """The cache sharing the longest start with ``prefix`` less its last token (the row's own when it is still
        the same request; rows move when vLLM condenses its batch), trimmed to what it shares. A cache another row
        already took this step is copied up to what they share (requests with one prompt in one batch)."""
        wanted = prefix[:-1]
        best, best_len = None, -1
        others = [c for r, c in self.caches.items() if r != row]
        for cache in [self.caches.get(row), *others, *taken.values()]:
            if cache is None:
                continue
            length = cache.common(wanted)
            if length > best_len:
                best, best_len = cache, length
            if length == len(wanted) and id(cache) not in taken:
                break
        if best is None or best_len <= 0:
            return PrefixCache(len(self.layers), self.kv_heads, self.head_dim, self.dtype)
        if id(best) in taken:
            return best.copy(best_len)
        best.keep(best_len)
        return best

    @torch.inference_mode()
    def _draft(self, cache: PrefixCache, prefix: list[int], temperature: float):
        """One forward ``[P[c:n-1] | P[n-1], MASK x W]``; returns the draft and, at T > 0, q (W, V) float32."""
        c, n, width = len(cache.tokens), len(prefix), self.width
        extension = prefix[c:n - 1]
        e, block = len(extension), 1 + width
        ids = torch.tensor(extension + [prefix[-1]] + [self.mask_id] * width, dtype=torch.long)
        positions = torch.arange(c, n + width, dtype=torch.long)
        rows = e + block
        # mask: the extension is causal over the cache and itself; the block sees everything, itself bidirectionally
        allowed = torch.ones(rows, c + rows, dtype=torch.bool)
        allowed[:e, c:c + rows] = torch.ones(e, rows, dtype=torch.bool).tril()
        allowed[:e, c + e:] = False
        lora_rows = slice(e, rows)
        x = self.model.model.embed_input_ids(ids) if hasattr(self.model.model, "embed_input_ids") \
            else self.model.model.embed_tokens(ids)
        for index, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            qkv, _ = attn.qkv_proj(h)
            if self.lora is not None:
                qkv = qkv.clone()
                for module, part in (("q_proj", slice(0, self.q_size)),
                                     ("k_proj", slice(self.q_size, self.q_size + self.kv_size)),
                                     ("v_proj", slice(self.q_size + self.kv_size, None))):
                    update = self.lora.delta(index, module, h[lora_rows])
                    if update is not None:
                        qkv[lora_rows, part] += update
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = attn.rotary_emb(positions, q, k)
            if getattr(attn, "do_llama_4_scaling", False):  # NLD / Ministral3: the query scale past its window
                q = (q * attn._get_llama_4_attn_scale(positions)).to(q.dtype)
            q = q.reshape(rows, self.heads, self.head_dim).transpose(0, 1)
            k = k.reshape(rows, self.kv_heads, self.head_dim).transpose(0, 1)
            v = v.reshape(rows, self.kv_heads, self.head_dim).transpose(0, 1)
            # every row's keys go into the buffer, read back as one view; only the extension's count as cached
            # (the block's are past the cache's length and overwritten by the next step's)
            cache.append(index, k, v, c)
            keys, values = cache.keys[index][:, :c + rows], cache.values[index][:, :c + rows]
            group = self.heads // self.kv_heads
            if group > 1:
                keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
            out = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=allowed,
                                                                   scale=self.scaling)
            out = out.transpose(0, 1).reshape(rows, self.q_size)
            o, _ = attn.o_proj(out)
            if self.lora is not None and (update := self.lora.delta(index, "o_proj", out[lora_rows])) is not None:
                o = o.clone()
                o[lora_rows] += update
            x = x + o
            h = layer.post_attention_layernorm(x)
            x = x + self._mlp(index, layer.mlp, h, lora_rows)
        cache.tokens.extend(extension)
        hidden = self.model.model.norm(x[e + 1:])
        logits = self.model.compute_logits(hidden).float()
        logits[:, self.mask_id] = float("-inf")  # the mask token is never drafted (the engine's never-emit ids)
        self.calls += 1
        if temperature <= 0:
            draft, q = logits.argmax(-1).tolist(), None
            q_max = torch.softmax(logits.double(), -1).amax(-1).tolist()
        else:
            q = torch.softmax(logits.double() / temperature, -1)
            draft = torch.multinomial(q, 1, generator=self.generator).squeeze(1).tolist()
            q_max = q.amax(-1).tolist()
            q = q.float()
        if self.log_path:
            self._pending.append({"prefix": prefix, "draft": draft, "q_max": q_max, "temperature": temperature})
        return draft, q

    def _mlp(self, index: int, mlp, h: torch.Tensor, lora_rows: slice) -> torch.Tensor:
        if self.lora is None or not any(key[0] == index and key[1] in ("gate_proj", "up_proj", "down_proj")
                                        for key in self.lora.pairs):
            return mlp(h)
        gate_up, _ = mlp.gate_up_proj(h)
        gate_up = gate_up.clone()
        half = gate_up.shape[-1] // 2
        for module, part in (("gate_proj", slice(0, half)), ("up_proj", slice(half, None))):
            update = self.lora.delta(index, module, h[lora_rows])
            if update is not None:
                gate_up[lora_rows, part] += update
        inner = mlp.act_fn(gate_up)
        out, _ = mlp.down_proj(inner)
        update = self.lora.delta(index, "down_proj", inner[lora_rows])
        if update is not None:
            out = out.clone()
            out[lora_rows] += update
        return out

    # --- T > 0 -----------------------------------------------------------------------------------------------------
    def _temperature(self, row: int) -> float:
        """The row's sampling temperature; 0 (greedy drafts, lossless at any T) when no runner was found."""
        if self.runner is None:
            return 0.0
        return float(self.runner.input_batch.temperature_cpu[row])

    def _hand_over(self, drafts: list[list[int]], probs: list[torch.Tensor | None]) -> bool:
        """Give vLLM's rejection sampler q for the drafts just made (rows, W, V), where any row sampled; returns
        whether it did."""
        if self.runner is None or all(q is None for q in probs):
            return False
        vocab = next(q for q in probs if q is not None).shape[-1]
        table = torch.zeros(len(drafts), self.width, vocab, dtype=torch.float32)
        for row, (draft, q) in enumerate(zip(drafts, probs)):
            if q is not None:
                table[row] = q
            elif draft:  # a greedy row: a point mass on each draft token
                table[row, torch.arange(len(draft)), torch.tensor(draft)] = 1.0
        self.runner._draft_probs = table
        self.runner._draft_prob_req_ids = list(self.runner.input_batch.req_ids)
        return True
