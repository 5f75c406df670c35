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
    assert blocking_key((4, 48, 1)).uuid() != key.uuid()  # another blocking, another cache entry
    graph = torch.fx.symbolic_trace(lambda x: x * 2 + 1).graph
    before = [(n.op, n.target) for n in graph.nodes]
    key(graph)
    assert [(n.op, n.target) for n in graph.nodes] == before


@pytest.mark.slow
def test_compiled_float32_calls_are_generated_inside_the_blocking_unless_switched_off(monkeypatch):
    """The compiled native path enters few_row_blocking (with its cache key in inductor's settings) when a float32
    call compiles on a CPU, gives the eager path's tokens, and leaves it out under PACKED_SS_GEMM_BLOCKING=0."""
    import torch._inductor.config

    from helpers import tiny_llama
    from packed_ss import DecodeConfig, generate
    from packed_ss.models import DualModeModel
    from packed_ss.models import native

    entered = []

    def recording(*args):
        entered.append(torch._inductor.config.post_grad_custom_post_pass)
        return few_row_blocking(*args)

    monkeypatch.setattr(native, "few_row_blocking", recording)
    prompt, config = [2, 3, 4, 5, 6, 7], DecodeConfig(block_size=4, max_new_tokens=6)
    for seed, switch, expect in ((5, "1", True), (6, "0", False)):
        monkeypatch.setenv("PACKED_SS_GEMM_BLOCKING", switch)
        entered.clear()
        made = tiny_llama(seed=seed, logit_scale=3.0)
        made.model.float()  # the float64 decoder made with it is made again in float32 (native_decoder)
        eager = DualModeModel(made.model, made.tokenizer, 1, 0)
        compiled = DualModeModel(made.model, made.tokenizer, 1, 0, compiled=True)
        assert native.native_decoder(made.model).embed.dtype == torch.float32
        assert generate(compiled, prompt, config, "ar").token_ids == generate(eager, prompt, config, "ar").token_ids
        assert compiled.compiled and compiled.compile_note is None
        assert bool(entered) is expect
        assert all(str(BLOCKING) in key.uuid() for key in entered)


def test_two_blocks_entered_at_once_leave_torch_table_whichever_exits_first():
    """A compile and a call that compiles on another thread may both be inside: each puts back only what it
    swapped, so the table ends as torch's in either order of exit."""
    table, _, before = _snapshot()
    for first_out in ("outer", "inner"):
        outer, inner = few_row_blocking(), few_row_blocking()
        outer.__enter__()
        inner.__enter__()
        order = (outer, inner) if first_out == "outer" else (inner, outer)
        order[0].__exit__(None, None, None)
        order[1].__exit__(None, None, None)
        assert {cls: list(c) for cls, c in table.items()} == before, first_out
