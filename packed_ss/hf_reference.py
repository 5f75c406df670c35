"""transformers' own decoding on the same weights, as reference rows for the benchmark.

``hf-greedy`` is ``generate(do_sample=False)``; ``hf-lookup`` is transformers' prompt-lookup decoding,
``generate(prompt_lookup_num_tokens=W, max_matching_ngram_size=2)`` with W = B - 1, the peer this
project's ``lookup`` schedule re-implements; ``hf-greedy-compiled`` is greedy ``generate`` with
``cache_implementation="static"`` and its compiled forward (``CompileConfig``, CUDA graphs on CUDA), the
strongest AR a transformers user can pick. Its static cache is sized like the engine's (the run's need rounded
up to :data:`~packed_ss.models.static.CAPACITY_STEP`), so both compile once per capacity. All are timed like
the engine's runs: wall time of the decoding only (the prompt tensor is built before the clock starts),
CUDA-synchronised, and the model's forward calls counted as NFE. They run greedy only and need a ``transformers`` network
(``model.model``); the drafter adapter is not used.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

HF_REFERENCES = ("hf-greedy", "hf-lookup", "hf-greedy-compiled")
NGRAM_SIZE = 2  # max_matching_ngram_size, as the engine's lookup (packed_ss.schedules.lookup.MAX_NGRAM)


class ReferenceFailed(RuntimeError):
    """transformers' ``generate`` failed for a reference row (e.g. no working C++ compiler for
    ``hf-greedy-compiled``); the message is one line naming the row."""


@dataclass(frozen=True)
class ReferenceRun:
    """What the benchmark reads from a run (the fields :class:`packed_ss.records.RunRecord` shares).

    Units: seconds; ``model_s`` and ``other_s`` are NaN (n/a): transformers' loop is not split.
    """

    schedule: str
    token_ids: tuple[int, ...]
    nfe: int
    wall_s: float
    stop_reason: str
    records: tuple = ()
    iterations: int = 0
    rows: int = 0
    mean_acceptance_length: float = float("nan")
    max_rows_per_call: int | None = None  # n/a: transformers' calls are not recorded
    verify_iterations: int = 0  # iterations that verified a draft, where the loop counts them (vLLM's counters)
    per_position_acceptance: tuple[float, ...] = ()  # accepted drafts at each position / drafts, where counted

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    @property
    def model_s(self) -> float:
        return float("nan")

    @property
    def other_s(self) -> float:
        return float("nan")

    @property
    def tokens_per_nfe(self) -> float:
        return self.tokens / self.nfe if self.nfe else float("nan")

    @property
    def throughput(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else float("nan")


def reference_problem(model, temperature: float, drafter_lora: bool, check_model: bool = True) -> str | None:
    """Why the reference rows cannot run with these settings (and this model, unless ``check_model`` is
    False), or None."""
    if check_model and (getattr(model, "model", None) is None or not hasattr(model.model, "generate")):
        return "the transformers reference rows need a transformers model"
    if temperature != 0:
        return "the transformers reference rows run greedy only (--temperature 0)"
    if drafter_lora:
        return "the transformers reference rows do not use the drafter adapter: turn --drafter-lora off"
    return None


def hf_generate(model, prompt_ids: Sequence[int], max_new_tokens: int, kind: str, block_size: int) -> ReferenceRun:
    """Decode ``prompt_ids`` with transformers' ``generate`` (``kind`` in :data:`HF_REFERENCES`).

    Args:
        model: a :class:`~packed_ss.models.DualModeModel` (its ``model`` is the network).
        max_new_tokens: L in tokens; generation also stops at the model's EOS.
        block_size: B; ``hf-lookup`` drafts up to W = B - 1 tokens per call.
    Raises: ValueError for an unknown ``kind``; ReferenceFailed when ``generate`` fails.
    """
    if kind not in HF_REFERENCES:
        raise ValueError(f"unknown reference {kind!r}; choose one of {', '.join(HF_REFERENCES)}")
    network = model.model
    extra = dict(prompt_lookup_num_tokens=block_size - 1, max_matching_ngram_size=NGRAM_SIZE) if kind == "hf-lookup" else {}
    if kind == "hf-greedy-compiled":
        extra = compiled_generate_options(model, len(prompt_ids) + max_new_tokens)
    eos = model.eos_token_id
    inputs = torch.tensor([list(prompt_ids)], device=model.device)
    calls = [0]

    def count(*_):
        calls[0] += 1

    hook = network.register_forward_pre_hook(count)
    try:
        sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
        sync()
        start = time.perf_counter()
        try:
            with torch.no_grad():
                out = network.generate(inputs, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos,
                                       pad_token_id=eos if eos is not None else 0, **extra)
        except Exception as error:  # noqa: BLE001 - whatever transformers raises: one line naming the row
            first = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
            raise ReferenceFailed(f"{kind}: transformers' generate failed ({type(error).__name__}: {first}); "
                                  f"leave that row out") from None
        sync()
        wall = time.perf_counter() - start
    finally:
        hook.remove()
    tokens = tuple(out[0, len(prompt_ids):].tolist())
    reason = "eos" if eos is not None and eos in tokens else "limit"
    return ReferenceRun(kind, tokens, calls[0], wall, reason)


def compiled_generate_options(model, tokens: int) -> dict:
    """``generate`` options of ``hf-greedy-compiled`` for a run of ``tokens`` tokens (prompt + new tokens)."""
    from transformers import CompileConfig

    from packed_ss.models.static import CAPACITY_STEP

    cuda = model.device.type == "cuda"
    compile_config = CompileConfig(fullgraph=False, dynamic=False, mode="reduce-overhead" if cuda else "default")
    compile_config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    return dict(cache_implementation="static", max_cache_len=-(-tokens // CAPACITY_STEP) * CAPACITY_STEP,
                compile_config=compile_config)
