"""Compiled calls across loads (issue 54, item 2): one visitor's reloads turned compiling off for everyone.

A fit on ``assets/model``, then requests on two other models (pushing it out of the two held), twice: every later
fit said "torch.compile failed (FailOnRecompileLimitHit)". Dynamo guards each compiled graph by the decoder it was
made for, so each load compiled every shape again, and its per-function limit, once met, failed every compile.
Now a reload of the same checkpoint and dtype adopts the graphs of the first load, and a process compiles at most
``COMPILE_BUDGET`` variants of a function: a new shape past it runs eagerly and the compiled ones stay compiled.
Compiled here with dynamo's ``eager`` backend (the guards and the budget are dynamo's; inductor is not needed).
"""

import functools

import pytest
import torch

from helpers import tiny_llama
from packed_ss.cost import warm_probe
from packed_ss.models import static
from packed_ss.models.native import NativeDecoder


@pytest.fixture
def dynamo_eager(monkeypatch):
    """torch.compile with dynamo's eager backend, from a clean dynamo state (and clean again afterwards)."""
    import torch._dynamo

    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    yield
    torch._dynamo.reset()


def variants() -> int:
    return static.compiled_variants(NativeDecoder.forward.__code__)


def test_a_reloaded_checkpoint_adopts_the_graphs_compiled_for_its_first_load(tmp_path, dynamo_eager):
    from serve.models import ModelStore

    first = tiny_llama(seed=0)
    first.model.save_pretrained(tmp_path / "m")
    first.tokenizer.save_pretrained(tmp_path / "m")
    other = tiny_llama(seed=1)
    other.model.save_pretrained(tmp_path / "o")
    other.tokenizer.save_pretrained(tmp_path / "o")
    store = ModelStore(str(tmp_path / "m"), allowed=[str(tmp_path / "o")], capacity=1, dtype="float64")
    loaded = store.get(None)
    warm_probe(loaded.share(compiled=True))
    compiled = variants()
    assert compiled > 0
    for _ in range(3):  # the other model pushes it out; it comes back
        store.get(str(tmp_path / "o"))
        again = store.get(None)
        assert again is not loaded
        probe = again.share(compiled=True)
        warm_probe(probe)
        assert probe.compiled and probe.compile_note is None
    assert variants() == compiled  # nothing compiled again


def test_past_the_budget_new_shapes_run_eagerly_and_compiling_stays_on(monkeypatch, dynamo_eager):
    model = tiny_llama(seed=0)
    eager = model.share(compiled=False)
    adapter = model.share(compiled=True)
    warm_probe(adapter)
    spent = variants()
    monkeypatch.setattr(static, "COMPILE_BUDGET", spent)
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import generate

    config = DecodeConfig(block_size=5, max_new_tokens=12)  # B = 5: row counts the probe did not compile
    ids = [3, 4, 5, 6]
    expected = generate(eager, ids, config, "packed").tokens
    got = generate(adapter, ids, config, "packed")
    assert got.tokens == expected
    assert variants() == spent  # no variant past the budget
    assert adapter.compiled and "compile budget" in adapter.compile_note
    warm_probe(adapter)  # the shapes compiled before still run compiled
    assert variants() == spent
