"""A correction for vLLM 0.32.0's CPU build: its speculative sampling at T > 0 reads uninitialised temperatures.

``vllm.v1.sample.rejection_sampler.expand_batch_to_tokens`` repeats each request's temperature (and top-k, top-p) once
per draft token. Without Triton's CPU backend it runs ``vllm.utils.cpu_triton_utils._expand_kernel_impl``, which hands
the C++ kernel an int64 *copy* of its float output (``_ensure_int64``) and never copies it back: the tensor it returns
is the ``new_empty`` it started from. The verifier's logits are then divided by whatever that memory held, so at
T > 0 every speculative method (n-gram, draft model, a custom proposer) keeps drafts at a wrong rate and draws
corrections from a wrong distribution. Greedy decoding never calls it and is exact.

:func:`apply` replaces the function in the module that calls it with the same expansion written in torch, once per
process, and only where the probe shows the fault.
"""

from __future__ import annotations

import torch


def expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int, replace_from=0,
                           replace_to=0) -> torch.Tensor:
    """``x`` (batch,) repeated per request's token count from ``cu_num_tokens`` (batch,) cumulative counts, to
    ``(num_tokens,)``, with ``replace_from`` values replaced by ``replace_to`` (vLLM's own contract)."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    expanded = torch.repeat_interleave(x, counts, output_size=num_tokens)
    return torch.where(expanded == replace_from, torch.as_tensor(replace_to, dtype=x.dtype), expanded)


def faulty(module) -> bool:
    """Whether ``module.expand_batch_to_tokens`` expands ``[1.0, 0.5]`` over ``[1, 3]`` tokens wrongly."""
    got = module.expand_batch_to_tokens(torch.tensor([1.0, 0.5]), torch.tensor([1, 3], dtype=torch.int32), 3)
    return not torch.equal(got, torch.tensor([1.0, 0.5, 0.5]))


def apply() -> bool:
    """Correct vLLM's rejection sampler in this process when it is faulty; returns whether it was."""
    from vllm.v1.sample import rejection_sampler

    if getattr(rejection_sampler, "_packed_ss_corrected", False) or not faulty(rejection_sampler):
        return False
    rejection_sampler.expand_batch_to_tokens = expand_batch_to_tokens
    rejection_sampler._packed_ss_corrected = True
    return True
