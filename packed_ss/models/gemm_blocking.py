"""Register blocking of inductor's float32 C++ micro-GEMM on AVX-512, for the few-row products of compiled calls.

Inductor's GEMM template multiplies one register block of ``rows x columns`` outputs at a time, keeping the block's
accumulators in vector registers. torch 2.13 offers three blockings for float32 on AVX-512, (8, 48), (8, 32) and
(16, 16), and picks one by a fixed score that favours the largest: (8, 48) for every projection of the shipped
model. A call of R rows fills R of the block's 8 rows, so R x 3 accumulators. On this project's CPU (AMD EPYC,
Zen 4, one thread) a block past about 12 accumulators runs much slower: the shipped model's projections chained
in one compiled graph took 1,007 us at 6 rows and 2,646 us at 12 with (8, 48), 665 and 1,775 us with (6, 32), and
about the same at 1 and 4 rows (docs/speed.md, ``python scripts/gemm_blocking.py``).

(6, 32) keeps 6 x 2 = 12 accumulators and divides the shipped model's widths, so the projections of the compiled 6- to
12-row calls that speculation makes take 0.59 to 0.67 of their time, and those of 1 and 4 rows as much as before
within the noise. :func:`few_row_blocking` swaps it in around inductor's code generation and puts torch's own back
afterwards; torch's other types and instruction sets keep theirs. No public setting chooses the blocking
(torch 2.13), so this reaches into ``torch._inductor.codegen.cpp_micro_gemm``; where that module's shape differs (a
later torch), nothing is changed and :func:`blocking_problem` says why.

A compiled graph's cache key must differ with the blocking, or a graph compiled with torch's blocking (in inductor's
on-disk cache) would be reused: :func:`blocking_key` gives a do-nothing post-grad pass whose ``uuid`` names the
blocking, inductor's documented way to put a custom change into its cache key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import torch

BLOCKING = (6, 32, 1)  # rows, columns, k of one register block (12 zmm accumulators)


def _registry():
    """``((inductor's micro-GEMM config table, its GemmBlocking, VecAVX512), None)``, or ``(None, the reason)`` where
    this torch lays them out otherwise."""
    try:
        import torch._inductor.lowering  # noqa: F401 - imports the codegen modules in the order they need
        from torch._inductor.codegen import cpp_micro_gemm
        from torch._inductor.cpu_vec_isa import VecAVX512
    except Exception as error:  # noqa: BLE001 - any import failure: torch's blocking stays
        return None, f"inductor's micro-GEMM module did not import ({type(error).__name__}: {error})"
    table = getattr(cpp_micro_gemm, "micro_gemm_configs", None)
    blocking = getattr(cpp_micro_gemm, "GemmBlocking", None)
    if not isinstance(table, dict) or blocking is None:
        return None, "inductor's micro-GEMM table is not where torch 2.13 keeps it"
    return (table, blocking, VecAVX512), None


def _ours(config, vec_isa) -> bool:
    """Whether ``config`` is a plain float32 AVX-512 micro-GEMM (inputs, weights, output and compute float32)."""
    fields = ("vec_isa_cls", "input_dtype", "input2_dtype", "output_dtype", "compute_dtype", "register_blocking")
    if not all(hasattr(config, name) for name in fields) or not dataclasses.is_dataclass(config):
        return False
    return (config.vec_isa_cls is vec_isa and config.input_dtype == torch.float32
            and config.input2_dtype == torch.float32 and config.output_dtype == torch.float32
            and config.compute_dtype == torch.float32)


def blocking_problem() -> str | None:
    """Why :func:`few_row_blocking` would change nothing in this torch, or None when it applies."""
    found, problem = _registry()
    if problem:
        return problem
    table, _, vec_isa = found
    if not any(_ours(config, vec_isa) for configs in table.values() for config in configs):
        return "inductor lists no float32 AVX-512 micro-GEMM"
    return None


@contextmanager
def few_row_blocking(register_blocking: tuple[int, int, int] = BLOCKING) -> Iterator[bool]:
    """Inside: inductor's float32 AVX-512 micro-GEMMs use ``register_blocking`` (rows, columns, k; default
    :data:`BLOCKING`); on exit, also when the body raises, each config this call swapped is put back as torch had it.
    Only what this call changed is put back, so blocks entered by two threads at once (a compile and a guard check
    that compiles) leave torch's table whichever exits first. Yields whether float32 AVX-512 configs use the blocking
    inside (False where :func:`blocking_problem` names a reason; machines without AVX-512 never use these configs)."""
    found, problem = _registry()
    if problem:
        yield False
        return
    table, blocking, vec_isa = found
    swaps = []  # (the config put in, torch's config it replaced)
    try:
        for cls, configs in list(table.items()):
            swapped = []
            for config in configs:
                new = config
                if _ours(config, vec_isa) and tuple(config.register_blocking) != tuple(register_blocking):
                    new = dataclasses.replace(config, register_blocking=blocking(*register_blocking))
                    swaps.append((new, config))
                swapped.append(new)
            table[cls] = swapped
        yield bool(swaps) or any(_ours(c, vec_isa) for configs in table.values() for c in configs)
    finally:
        for cls, configs in list(table.items()):
            table[cls] = [next((old for new, old in swaps if new is config), config) for config in configs]


def blocking_key(register_blocking: tuple[int, int, int] = BLOCKING):
    """A post-grad pass for inductor's ``post_grad_custom_post_pass`` that changes no graph and whose ``uuid`` puts
    ``register_blocking`` (what :func:`few_row_blocking` is given beside it) into inductor's cache key; None where
    this torch has no ``CustomGraphPass``."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        return None

    class BlockingKey(CustomGraphPass):
        def __call__(self, graph) -> None:
            return None

        def uuid(self) -> str:
            return f"packed-ss float32 avx512 micro-gemm blocking {tuple(register_blocking)}"

    return BlockingKey()
