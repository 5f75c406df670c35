"""The float32 AVX-512 micro-GEMM blocking swapped in around the compiled calls' code generation
(packed_ss/models/gemm_blocking.py): what it changes, that torch's table comes back, and the cache key."""

from __future__ import annotations

import pytest
import torch

from packed_ss.models.gemm_blocking import BLOCKING, _ours, _registry, blocking_key, blocking_problem, few_row_blocking

pytestmark = pytest.mark.skipif(blocking_problem() is not None, reason=str(blocking_problem()))


def _snapshot():
    (table, _, vec_isa), _ = _registry()
    return table, vec_isa, {cls: list(configs) for cls, configs in table.items()}


def test_inside_every_float32_avx512_config_uses_the_blocking_and_nothing_else_changes():
    table, vec_isa, before = _snapshot()
    with few_row_blocking() as changed:
        assert changed
        inside = {cls: list(configs) for cls, configs in table.items()}
    assert inside.keys() == before.keys()
    swapped = 0
    for cls, configs in inside.items():
        for new, old in zip(configs, before[cls], strict=True):
            if _ours(old, vec_isa):
                swapped += 1
                assert tuple(new.register_blocking) == BLOCKING
                assert new.input_dtype == old.input_dtype and new.vec_isa_cls is old.vec_isa_cls
            else:
                assert new == old  # bfloat16, float16, int8, AVX2, AMX: torch's own
    assert swapped >= 1


def test_torch_table_is_back_after_the_block_and_after_an_error():
    table, _, before = _snapshot()
    with few_row_blocking():
        pass
    assert {cls: list(c) for cls, c in table.items()} == before
    with pytest.raises(RuntimeError, match="inside"):
        with few_row_blocking():
            raise RuntimeError("inside")
    assert {cls: list(c) for cls, c in table.items()} == before


def test_the_cache_key_names_the_blocking_and_the_pass_changes_no_graph():
    key = blocking_key()
    assert key is not None
    assert str(BLOCKING) in key.uuid()
    graph = torch.fx.symbolic_trace(lambda x: x * 2 + 1).graph
    before = [(n.op, n.target) for n in graph.nodes]
    key(graph)
    assert [(n.op, n.target) for n in graph.nodes] == before
