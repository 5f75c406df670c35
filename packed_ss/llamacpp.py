"""llama.cpp as a reference lane: the same weights in GGUF, decoding the project's own token ids (issue #38).

``llamacpp-ar`` is llama.cpp's plain greedy loop (one row per call after the prefill); ``llamacpp-lookup`` is prompt
lookup on llama.cpp, with the engine's own n-gram drafts (:func:`packed_ss.schedules.lookup.ngram_draft`, W = B - 1)
verified in one call and the rejected rows dropped from llama.cpp's cache. Both pick tokens as the engine's greedy
schedules do (argmax with the never-emit ids excluded), so their outputs must equal ``ar``'s: the benchmark checks it.
They are timed like :mod:`packed_ss.hf_reference`'s rows: the decoding only, prefill included; NFE counts
llama.cpp's decode calls.

The GGUF file is written by :func:`write_gguf` with the ``gguf`` package (llama.cpp's own Python writer): every
tensor in float32, the query and key projections' rows reordered for llama.cpp's RoPE (adjacent pairs rather than
halves), and no tokenizer (``no_vocab``: llama.cpp gets token ids, never text). :func:`gguf_mismatches` reads it
back and compares every tensor with the checkpoint's.

Both packages are an optional extra (``pip install -r requirements-llamacpp.txt``), never needed by the app or tests.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from packed_ss.hf_reference import ReferenceFailed, ReferenceRun

LLAMACPP_REFERENCES = ("llamacpp-ar", "llamacpp-lookup")
EXTRA = "pip install -r requirements-llamacpp.txt"
LANE = "packed_ss_llamacpp"  # attribute of the transformers network holding its llama.cpp model (made once)


def llamacpp_problem(model=None) -> str | None:
    """Why the llama.cpp lanes cannot run here (a package missing, a model llama.cpp's ``llama`` architecture does
    not describe), or None."""
    for package in ("llama_cpp", "gguf"):
        try:
            __import__(package)
        except ImportError:
            return f"the llama.cpp lanes need llama-cpp-python and gguf ({EXTRA}; {package} is missing)"
    if model is not None:
        return gguf_problem(getattr(model, "model", model))
    return None


def gguf_problem(network) -> str | None:
    """Why :func:`write_gguf` cannot describe ``network`` (a transformers causal LM) as llama.cpp's ``llama``, or None."""
    config = network.config
    if getattr(config, "model_type", None) != "llama":
        return f"the GGUF writer handles Llama checkpoints, not model type {getattr(config, 'model_type', None)!r}"
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope != "default" or getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "the GGUF writer handles default RoPE without biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"the GGUF writer handles SiLU MLPs, not {config.hidden_act!r}"
    return None


def _pairs_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q or k projection reordered from transformers' RoPE halves to llama.cpp's adjacent pairs."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, -1).swapaxes(1, 2).reshape(weight.shape)


def _halves_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of :func:`_pairs_order`."""
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensors(network) -> dict[str, tuple[str, np.ndarray]]:
    """GGUF name -> (the checkpoint's name, float32 array as written) for every tensor of ``network``."""
    config = network.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    out = {}
    for name, tensor in network.state_dict().items():
        array = tensor.detach().to(torch.float32).cpu().numpy()
        if name in names:
            target = names[name]
        else:
            _, _, layer, rest = name.split(".", 3)  # model.layers.N.<part>.weight
            target = f"blk.{layer}.{parts[rest.rsplit('.', 1)[0]]}.weight"
        if target.endswith("attn_q.weight"):
            array = _pairs_order(array, heads)
        elif target.endswith("attn_k.weight"):
            array = _pairs_order(array, kv_heads)
        out[target] = (name, np.ascontiguousarray(array))
    return out


def write_gguf(network, path: str | Path) -> Path:
    """Write ``network`` (a transformers Llama causal LM) as a float32 GGUF file for llama.cpp.

    Raises: ValueError when :func:`gguf_problem` names a reason; ImportError without the ``gguf`` package.
    """
    import gguf

    problem = gguf_problem(network)
    if problem:
        raise ValueError(problem)
    config = network.config
    rope = getattr(config, "rope_parameters", None) or {}
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("packed-ss")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads))
    writer.add_key_length(int(config.head_dim))
    writer.add_value_length(int(config.head_dim))
    writer.add_rope_dimension_count(int(config.head_dim))
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_tokenizer_model("no_vocab")  # token ids only: llama.cpp never sees text
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name, (_, array) in gguf_tensors(network).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def gguf_mismatches(network, path: str | Path) -> list[str]:
    """The checkpoint tensors that the GGUF file at ``path`` does not hold exactly (q/k rows put back in
    transformers' order), and any tensor either side lacks; empty when every tensor is equal."""
    import gguf

    heads, kv_heads = network.config.num_attention_heads, network.config.num_key_value_heads
    written = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    state = network.state_dict()
    problems = []
    for target, (name, _) in gguf_tensors(network).items():
        if target not in written:
            problems.append(f"{name}: not in the file")
            continue
        tensor = written.pop(target)
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        array = np.asarray(tensor.data, dtype=np.float32).reshape(shape)
        if target.endswith("attn_q.weight"):
            array = _halves_order(array, heads)
        elif target.endswith("attn_k.weight"):
            array = _halves_order(array, kv_heads)
        want = state[name].detach().to(torch.float32).cpu().numpy()
        if array.shape != want.shape or not np.array_equal(array, want):
            problems.append(f"{name}: differs")
    problems += [f"{name}: in the file only" for name in written]
    return problems


class LlamaCppModel:
    """llama.cpp's model and context for one network, from a GGUF file this module wrote and checked.

    Raises: ReferenceFailed (one line) when the file does not hold the checkpoint's tensors or llama.cpp fails to
    load it.
    """

    def __init__(self, model, context: int | None = None):
        import atexit

        from llama_cpp import Llama

        network = model.model
        self.folder = tempfile.TemporaryDirectory(prefix="packed-ss-gguf-")
        path = write_gguf(network, Path(self.folder.name) / "model-f32.gguf")
        wrong = gguf_mismatches(network, path)
        if wrong:
            raise ReferenceFailed(f"llama.cpp lanes: the GGUF file does not hold the checkpoint ({wrong[0]}; "
                                  f"{len(wrong)} tensors)")
        threads = torch.get_num_threads()
        context = context or int(model.max_length)
        try:
            self.llm = Llama(str(path), n_ctx=context, n_batch=context, n_ubatch=context, n_threads=threads,
                             n_threads_batch=threads, logits_all=True, verbose=False, n_gpu_layers=0)
        except Exception as error:  # noqa: BLE001 - llama.cpp's load failures: one line
            raise ReferenceFailed(f"llama.cpp could not load the GGUF file ({type(error).__name__}: {error})") from None
        atexit.register(self.llm.close)  # before the interpreter tears down what llama-cpp-python's __del__ needs
        self.never_emit = np.asarray(model.never_emit_ids, dtype=np.int64)
        self.context = context

    def _pick(self, row: int) -> int:
        logits = np.array(self.llm.scores[row], dtype=np.float32)
        logits[self.never_emit] = -np.inf
        return int(logits.argmax())

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos: int | None, width: int = 0
                 ) -> tuple[tuple[int, ...], int, float]:
        """Greedy decoding of ``prompt_ids``: plain (``width`` 0) or with n-gram drafts of up to ``width`` tokens
        verified in one call. Returns (new token ids, decode calls, wall seconds)."""
        from packed_ss.schedules.lookup import ngram_draft

        if len(prompt_ids) + max_new_tokens + width + 1 > self.context:
            raise ReferenceFailed(f"llama.cpp lanes: a run needs more than {self.context} positions")
        llm = self.llm
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(prompt_ids))  # the prefill: row n-1 predicts the first new token
        calls, prompt_len = 1, len(prompt_ids)
        token = self._pick(prompt_len - 1)
        prefix = [*prompt_ids, token]  # the verified prefix, grown with every token taken
        while len(prefix) - prompt_len < max_new_tokens and token != eos:
            left = max_new_tokens - (len(prefix) - prompt_len)
            draft = ngram_draft(prefix, min(width, left - 1)) if width else []
            base = len(prefix) - 1  # the row of the last token, evaluated now
            llm.n_tokens = base  # the cache holds the prefix except its last token
            llm.eval([token, *draft])
            calls += 1
            for offset in range(len(draft) + 1):
                token = self._pick(base + offset)
                prefix.append(token)
                if offset == left - 1 or token == eos or offset == len(draft) or token != draft[offset]:
                    break
        wall = time.perf_counter() - start
        return tuple(prefix[prompt_len:]), calls, wall


def llamacpp_generate(model, prompt_ids: Sequence[int], max_new_tokens: int, kind: str,
                      block_size: int) -> ReferenceRun:
    """Decode ``prompt_ids`` greedily with llama.cpp (``kind`` in :data:`LLAMACPP_REFERENCES`).

    The llama.cpp model is made once per network (GGUF written and checked at the first run).
    Raises: ValueError for an unknown ``kind``; ReferenceFailed when llama.cpp or its packages are missing or fail.
    """
    if kind not in LLAMACPP_REFERENCES:
        raise ValueError(f"unknown reference {kind!r}; choose one of {', '.join(LLAMACPP_REFERENCES)}")
    problem = llamacpp_problem(model)
    if problem:
        raise ReferenceFailed(f"{kind}: {problem}")
    lane = getattr(model.model, LANE, None)
    if lane is None:
        lane = LlamaCppModel(model)
        object.__setattr__(model.model, LANE, lane)
    width = block_size - 1 if kind == "llamacpp-lookup" else 0
    tokens, calls, wall = lane.generate(prompt_ids, max_new_tokens, model.eos_token_id, width)
    eos = model.eos_token_id
    reason = "eos" if eos is not None and eos in tokens else "limit"
    return ReferenceRun(kind, tokens, calls, wall, reason)
