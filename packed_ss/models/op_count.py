"""Operations per decoder layer of the native forward: how many kernels a GPU launches for one layer of a call.

Inside a CUDA graph launches cost little, but every kernel still takes a few microseconds, and at 1-64 rows a layer's
four GEMMs take little more (issue 55: a call within 1.5x of the bandwidth floor). This counts, on any device, the
operators one layer of :class:`~packed_ss.models.native.NativeDecoder` dispatches, views excluded, with torch's
``rms_norm`` counted as the one fused kernel it is on CUDA (on the CPU it decomposes). A layer is the difference
between a 2-layer and a 1-layer model of the same shape, so embedding, rotary tables, mask and LM head are apart.

``python -m packed_ss.models.op_count`` prints the table for the CPU's call form and the graph path's, per attention
(:data:`~packed_ss.models.native.ATTENTIONS`) and dtype.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from unittest import mock

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from packed_ss.models import native

_NOT_KERNELS = frozenset({"detach.default", "lift_fresh.default", "_unsafe_view.default"})


class _Operators(TorchDispatchMode):
    """Counts the operators dispatched under it that are not views."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__ not in _NOT_KERNELS:
            self.counts[func.__name__.removesuffix(".default")] += 1
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class CallForm:
    """How a call runs: ``attention`` (:data:`~packed_ss.models.native.ATTENTIONS`), ``in_place`` (the call writes
    its keys and values into the cache, :attr:`~packed_ss.models.native.NativeCalls.in_place`), ``fused_norm``
    (:attr:`~packed_ss.models.native.NativeDecoder.fused_norm`)."""

    attention: str = "written"
    in_place: bool = False
    fused_norm: bool = False


COMPILED_FORM = CallForm()  # torch.compile's calls on the CPU (every call's form before issue 55)
EAGER_CPU_FORM = CallForm("sdpa", in_place=True)  # eager calls on the CPU (NativeCalls.attention)
GRAPH_FORMS = tuple(CallForm(attention, in_place=True, fused_norm=True) for attention in native.ATTENTIONS)


def _call_counts(layers: int, dtype: torch.dtype, rows: int, cached: int, form: CallForm) -> collections.Counter:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32)
    decoder = native.native_decoder(LlamaForCausalLM(config).to(dtype).eval())
    decoder.fused_norm = form.fused_norm
    capacity = cached + rows
    cache = torch.zeros(layers, 2, 2, capacity, 32, dtype=dtype)
    ids, positions = torch.arange(rows), cached + torch.arange(rows)
    bias = torch.zeros(rows, capacity if form.in_place else cached + rows)
    slots = positions if form.in_place else None
    counter = _Operators()
    fused_rms_norm = F.rms_norm

    def one_kernel(*args, **kwargs):  # as on CUDA: torch's fused rms_norm kernel
        counter.counts["rms_norm"] += 1
        with _disable_current_modes():
            return fused_rms_norm(*args, **kwargs)

    with torch.no_grad(), mock.patch.object(native.F, "rms_norm", one_kernel), counter:
        decoder(ids, positions, bias, cache, False, None, form.attention, None, slots)
    return counter.counts


def operations_per_layer(form: CallForm, dtype: torch.dtype = torch.bfloat16, rows: int = 16,
                         cached: int = 48) -> collections.Counter:
    """Operator name -> how many times one decoder layer dispatches it, for a call of ``rows`` rows (tokens) over
    ``cached`` cached tokens in ``form``; ``sum(...values())`` is the layer's kernel count. A small random Llama of
    GQA shape (8 query heads, 2 key/value heads) in ``dtype``. While counting, ``torch.nn.functional.rms_norm`` is
    patched in the whole process: a diagnostic for scripts and tests, not for a serving process."""
    return _call_counts(2, dtype, rows, cached, form) - _call_counts(1, dtype, rows, cached, form)


def main(argv: list[str] | None = None) -> None:
    import argparse

    argparse.ArgumentParser(prog="python -m packed_ss.models.op_count",
                            description="Operations per decoder layer of the native forward, per call form and dtype "
                                        "(one per kernel a GPU launches; counted on the CPU).").parse_args(argv)
    forms = {"torch.compile's (cache read-only, RMSNorm written out)": COMPILED_FORM,
             "CPU eager (in place, sdpa, RMSNorm written out)": EAGER_CPU_FORM,
             **{f"graph path, {form.attention}": form for form in GRAPH_FORMS}}
    for dtype in (torch.bfloat16, torch.float32):
        for name, form in forms.items():
            counts = operations_per_layer(form, dtype)
            detail = ", ".join(f"{op} {n}" for op, n in counts.most_common())
            print(f"{str(dtype).removeprefix('torch.'):8s} {name:55s} {sum(counts.values()):3d} per layer: {detail}")


if __name__ == "__main__":
    main()
