"""The graph path's bookkeeping on the CPU (issue 55): :class:`GraphCalls` with a recorder that keeps CUDA graphs'
semantics, so that everything around the capture is tested without a GPU.

A CUDA graph binds its kernels to addresses: it reads its own input buffers and the cache tensor it was recorded on,
and every replay writes the same output buffers. :class:`HostRecorder` does the same on the CPU: a "replay" runs the
recorded call on the buffers and cache tensor of the recording and copies its results into the outputs of the first
call. A :class:`GraphCalls` that forgot to copy a call's inputs in, kept a graph over a cache tensor it replaced, or
handed out a graph's outputs past the next replay gives wrong logits here as it would on a GPU. (What this cannot
catch: host-side Python that a real capture would freeze; ``tests/test_cuda.py`` runs the real graphs on a GPU.)
"""

from __future__ import annotations

import weakref

import pytest
import torch
from helpers import tiny_llama

from packed_ss.config import DecodeConfig
from packed_ss.engine import generate
from packed_ss.layout import prefill_layout, verify_layout
from packed_ss.models.graphs import GraphCalls
from packed_ss.schedules import LOSSLESS


class HostRecorder:
    """CUDA graph semantics on the CPU (module docstring). The graphs of one network share a memory pool on a GPU,
    where one graph's replay may write over another's outputs: here every replay fills the other graphs' outputs
    with NaN. ``recorded`` counts recordings."""

    def __init__(self):
        self.recorded = 0
        self.adapters = weakref.WeakSet()
        self._outputs = []

    @staticmethod
    def problem(device) -> None:
        return None

    def record(self, call, device):
        outputs = call()
        self.recorded += 1
        self._outputs.append(outputs)

        def replay():
            for other in self._outputs:
                if other is not outputs:
                    for tensor in other:
                        tensor.fill_(float("nan"))
            for buffer, value in zip(outputs, call(), strict=True):
                buffer.copy_(value)

        return outputs, replay

    @staticmethod
    def release() -> None:
        pass


class HostGraphCalls(GraphCalls):
    recorder_class = HostRecorder


class FailingRecorder(HostRecorder):
    """Runs out of GPU memory at every recording of ``fail_at`` rows; ``attempts`` counts recordings tried."""

    fail_at = 8
    attempts = 0

    def record(self, call, device):
        self.attempts += 1
        if call()[0].shape[0] == self.fail_at:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().record(call, device)


class FailingGraphCalls(GraphCalls):
    recorder_class = FailingRecorder


def on_graphs(model, calls_class=HostGraphCalls, attention: str = "written"):
    """``model`` (a DualModeModel on the native path) with its calls replayed through ``calls_class``, attending as
    ``attention`` says (:data:`packed_ss.models.native.ATTENTIONS`)."""
    model.static = calls_class(model.model, model.supports_deferred_rows, compiled=True, attention=attention)
    return model


@pytest.mark.parametrize("attention", ["written", "sdpa"])
def test_every_lossless_schedule_on_the_graph_path_gives_ars_tokens_with_the_papers_call_shapes(attention):
    """Float64 model (no near-ties), B = 4: each run's tokens equal eager AR's; every recorded call has 1 row (AR)
    or a multiple of B rows (padded_rows), and a second run of a schedule records nothing new."""
    model = on_graphs(tiny_llama(seed=6, logit_scale=3.0), attention=attention)
    assert model.path == "native" and model.graphs, model.compile_note
    eager = tiny_llama(seed=6, logit_scale=3.0)
    prompt = [4, 9, 2, 7, 3]
    # a fixed branch count: Partial-branch SS's own pick follows the measured call cost, and with it its call shapes
    config = DecodeConfig(block_size=4, max_new_tokens=24, branches=2)
    ar = generate(eager, prompt, config, "ar").token_ids
    assert generate(model, prompt, config, "ar").token_ids == ar
    for name in LOSSLESS:
        assert generate(model, prompt, config, name).token_ids == ar, name
        recorded = model.static._recorder.recorded
        assert generate(model, prompt, config, name).token_ids == ar, name
        assert model.static._recorder.recorded == recorded, (name, model.static.shapes)  # replays only
    rows = {rows for rows, _ in model.static.shapes}
    assert rows and all(r == 1 or r % 4 == 0 for r in rows), rows
    assert model.graphs and model.compile_note is None
    assert model.static.compile_s > 0  # recording time is reported apart
    other = HostGraphCalls(model.model, model.supports_deferred_rows, compiled=True)
    assert other._recorder is model.static._recorder  # one recorder (one memory pool) per network
    assert generate(on_graphs(model), prompt, config, "packed").token_ids == ar  # a second adapter's own graphs


def _calls(model, lengths_at: int):
    """Logits of a 1 + 7 row verify call at growing cache lengths, a rollback after the fourth, and a call that
    grows the cache past its capacity (a new cache tensor: the graphs over the old one must go)."""
    model.reset(40, block_size=8)  # capacity 256
    prompt = prefill_layout([3 + i % 20 for i in range(lengths_at)], 0, model.mask_token_id)
    model.forward(prompt, prompt.verify_rows)
    got = []
    for step in range(7):
        length = model.cache_length
        if step == 6:  # past the capacity: the cache grows inside the run
            filler = verify_layout([7] * (256 - length), [], length)
            model.forward(filler, ())
            length = model.cache_length
        layout = verify_layout([5 + step], [6] * 7, length)
        got.append(model.forward(layout, layout.verify_rows).logits.clone())
        if step == 3:
            model.rollback(length)
    return got


@pytest.mark.parametrize("attention", ["written", "sdpa"])
def test_replays_equal_eager_calls_at_growing_lengths_after_a_rollback_and_after_the_cache_grows(attention):
    """Twice: the first run grows the cache (a new tensor: graphs over the old one must go), the second keeps the
    grown capacity and replays at shorter lengths than the graphs were recorded at. Either attention against the
    CPU's eager calls (written out), whose capacity follows each run."""
    graphs = on_graphs(tiny_llama(seed=3), attention=attention)
    eager = tiny_llama(seed=3)
    for run in range(2):
        for a, b in zip(_calls(graphs, 30 + run), _calls(eager, 30 + run), strict=True):
            torch.testing.assert_close(a, b)
        assert graphs.static.capacity > 256 and graphs.static.shapes  # it grew, and calls after that replayed graphs


def test_a_run_takes_a_spare_cache_of_its_capacity_with_its_graphs_instead_of_recording_again():
    """Each run's reset sized the cache to that run and dropped the graphs, so a short, a
    long and again a short run recorded the short run's graphs twice. Now the cache it leaves goes to the network's
    spares with its graphs, and the next run of that capacity takes it; each run still attends over its own
    capacity (256 here for the short run, as on a fresh adapter)."""
    model = on_graphs(tiny_llama(seed=6, logit_scale=3.0))
    eager = tiny_llama(seed=6, logit_scale=3.0)
    short, long = DecodeConfig(block_size=4, max_new_tokens=24), DecodeConfig(block_size=4, max_new_tokens=300)
    prompt = [4, 9, 2, 7, 3]
    want = {config: generate(eager, prompt, config, "packed").token_ids for config in (short, long)}
    assert generate(model, prompt, short, "packed").token_ids == want[short]
    assert generate(model, prompt, long, "packed").token_ids == want[long]
    recorded = model.static._recorder.recorded
    for config in (short, long, short):
        assert generate(model, prompt, config, "packed").token_ids == want[config]
        assert model.static.capacity == (256 if config is short else 512)
    assert model.static._recorder.recorded == recorded


def test_a_graphs_outputs_are_copied_before_the_next_replay_writes_over_them():
    """Two calls of the same shape in a row: the first call's logits still hold its own values afterwards."""
    model = on_graphs(tiny_llama(seed=5))
    model.reset(64, block_size=4)
    prompt = prefill_layout([3, 4, 5, 6], 0, model.mask_token_id)
    model.forward(prompt, prompt.verify_rows)
    first = model.forward(verify_layout([7], [8, 9, 10], 4), (0, 1, 2, 3)).logits
    kept = first.clone()
    model.forward(verify_layout([11], [12, 13, 14], 8), (0, 1, 2, 3))
    torch.testing.assert_close(first, kept, rtol=0, atol=0)


def test_replaying_a_graph_again_to_time_it_leaves_the_cache_as_it_was():
    """A graph writes its call's keys and values into the cache, so replaying it on its last call's inputs (what
    replay_ms times) writes that call's slots again; after a rollback they hold other tokens. Within cache_kept they
    come back: the cache, and the next call's logits, equal an eager twin's."""
    from packed_ss.layout import packed_layout

    model, eager = on_graphs(tiny_llama(seed=3)), tiny_llama(seed=3)
    for adapter in (model, eager):
        adapter.reset(40, block_size=4)
        prompt = prefill_layout([3, 4, 5, 6], 0, 1)
        adapter.forward(prompt, prompt.verify_rows)
        packed = packed_layout(6, [7, 8, 9], 3, 4, 1)  # an 8-row graph writing slots 4..11
        adapter.forward(packed, packed.verify_rows + packed.draft_rows)
        adapter.rollback(5)  # h = 0 accepted: slots 5.. are free again
        for cached in range(5, 9):
            adapter.forward(verify_layout([10 + cached], [], cached), (0,))
    graph = next(graph for key, graph in model.static._graphs.items() if key[0] == 8)
    with graph.cache_kept():
        graph.replay_again()
    for (k, v), (k_eager, v_eager) in zip(model.cached_kv(), eager.cached_kv(), strict=True):
        assert torch.equal(k, k_eager) and torch.equal(v, v_eager)
    after = [adapter.forward(verify_layout([20], [], 9), (0,)).logits for adapter in (model, eager)]
    torch.testing.assert_close(after[0], after[1], rtol=0, atol=1e-12)


def test_out_of_gpu_memory_while_recording_frees_the_spares_tries_once_more_then_serves_that_shape_eagerly():
    """A capture that runs out of memory twice: that shape's calls run eagerly with one line, the spares' memory went
    before the second try, and the network's other graphs stay (a 1-row graph still replays)."""
    import gc

    from packed_ss.models.graphs import SPARE

    model = on_graphs(tiny_llama(seed=6, logit_scale=3.0), FailingGraphCalls)
    eager = tiny_llama(seed=6, logit_scale=3.0)
    prompt = [4, 9, 2, 7, 3]
    config = DecodeConfig(block_size=4, max_new_tokens=24)
    ar = generate(eager, prompt, config, "ar").token_ids
    spare = on_graphs(model.share(), FailingGraphCalls)
    assert generate(spare, prompt, DecodeConfig(block_size=4, max_new_tokens=300), "ar").token_ids[:24] == ar
    del spare
    gc.collect()
    spares = getattr(model.model, SPARE)
    assert len(spares) == 1
    assert generate(model, prompt, config, "ar").token_ids == ar and model.static._graphs  # a 1-row graph
    recorder = model.static._recorder
    attempts = recorder.attempts
    with pytest.warns(RuntimeWarning, match="out of GPU memory while recording the graph of 8 rows"):
        assert generate(model, prompt, config, "packed").token_ids == ar  # Packed-SS's 2B = 8-row calls
    assert recorder.attempts - attempts == 2 and len(spares) == 0  # tried twice, the spares freed in between
    note = model.compile_note
    assert "8 rows" in note and "eagerly" in note and "\n" not in note, note
    assert model.graphs and (1, 256, False, False, "written") in model.static._graphs
    replays, attempts = model.static.replays, recorder.attempts
    assert generate(model, prompt, config, "packed").token_ids == ar  # not tried again: eager 8-row calls
    assert generate(model, prompt, config, "ar").token_ids == ar and model.static.replays > replays
    assert recorder.attempts == attempts


def test_a_capture_that_fails_otherwise_turns_graphs_off_for_the_network_and_keeps_nothing_of_the_failure():
    """An operation the capture refuses: every adapter's graphs and the spares go, the session goes on eagerly, and the
    note is one line; the error the network keeps holds no traceback (whose frames would keep the failed graph's
    cache and buffers alive on the network)."""
    import gc

    from packed_ss.models.native import NATIVE_FAILURE

    class Refusing(HostRecorder):
        def record(self, call, device):
            if call()[0].shape[0] == 8:
                raise RuntimeError("operation not permitted when stream is capturing")
            return super().record(call, device)

    class RefusingGraphCalls(GraphCalls):
        recorder_class = Refusing

    model = on_graphs(tiny_llama(seed=6, logit_scale=3.0), RefusingGraphCalls)
    other = on_graphs(model.share(), RefusingGraphCalls)
    eager = tiny_llama(seed=6, logit_scale=3.0)
    prompt, config = [4, 9, 2, 7, 3], DecodeConfig(block_size=4, max_new_tokens=24)
    ar = generate(eager, prompt, config, "ar").token_ids
    assert generate(other, prompt, config, "ar").token_ids == ar and other.static._graphs
    with pytest.warns(RuntimeWarning, match="CUDA graphs off"):
        assert generate(model, prompt, config, "packed").token_ids == ar
    assert not model.graphs and not other.graphs and not other.static._graphs
    assert model.compile_note.startswith("CUDA graphs off") and "\n" not in model.compile_note
    kept = getattr(model.model, NATIVE_FAILURE)
    assert kept.__traceback__ is None and kept.__context__ is None and kept.__cause__ is None
    assert generate(model, prompt, config, "linear").token_ids == ar  # the session stays usable, eagerly
    gc.collect()


def test_the_server_names_the_calls_it_runs_and_zerogpu_keeps_them_eager(monkeypatch):
    """The default (compiled=None) is CUDA graphs on a CUDA device and eager calls on a CPU; ZeroGPU, where no
    recorded graph may outlive a request's GPU call, keeps eager calls unless --compile asks."""
    import serve.server
    from serve.models import ModelStore
    from serve.server import Server

    assert ModelStore(device="cuda", compiled=None).calls == "CUDA graphs"
    assert ModelStore(device="cpu", compiled=None).calls == "eager"
    assert ModelStore(device="cuda", compiled=False).calls == "eager"
    assert ModelStore(device="cuda", compiled=None, path="transformers").calls == "eager"
    assert ModelStore(device="cpu", compiled=True).calls == "compiled"
    monkeypatch.setattr(serve.server, "has_spaces", lambda: True)
    assert Server(device="cuda", compiled=None).store.compiled is False
    assert Server(device="cuda", compiled=True).store.compiled is True


def test_the_benchmark_report_names_cuda_graphs_when_its_calls_replayed_them():
    from packed_ss.bench.report import _header

    config = {"block_sizes": {"packed": 8}, "temperature": 0.0, "samples": 1, "max_new_tokens": 16, "seed": 0,
              "warmup": True}
    meta = {"prompts_measured": 1, "compiled": True, "compiled_shapes": [[16, 256]], "compile_s_warm_up": 0.4}
    graphs = "\n".join(_header({"meta": {**meta, "graphs": True}, "config": config}))
    compiled = "\n".join(_header({"meta": meta, "config": config}))
    assert "CUDA graphs of the native forward" in graphs and "torch.compile" not in graphs
    assert "torch.compile" in compiled and "CUDA graphs" not in compiled


# --- the drafter LoRA on the native forward and its graphs ---------------------------------------------------------
def _lora_calls(model):
    """Logits of a prefill, a gated Packed-SS call (the adapter on its proposal rows), an ungated drafting call (every
    row a proposal) and a verify call (the adapter off), on ``model``'s static cache (a model without the adapter:
    the same calls, none with it)."""
    from packed_ss.layout import draft_layout, packed_layout

    from helpers import NLD_BOS_ID

    model.reset(64, block_size=4)
    prompt = [NLD_BOS_ID, 40, 41, 42, 43]
    first = prefill_layout(prompt[:-1], 0, model.mask_token_id)
    got = [model.forward(first, first.verify_rows).logits]
    packed = packed_layout(prompt[-1], [44, 45], 3, model.cache_length, model.mask_token_id)
    adapted = (lambda rows: {"adapter_rows": rows}) if model.drafter_lora else (lambda rows: {})
    got.append(model.forward(packed, packed.verify_rows + packed.draft_rows, **adapted(packed.proposal_rows)).logits)
    model.rollback(len(prompt))
    drafting = draft_layout(46, 3, model.cache_length, model.mask_token_id)
    got.append(model.forward(drafting, drafting.draft_rows, **adapted(tuple(range(drafting.rows)))).logits)
    model.rollback(len(prompt))
    verify = verify_layout([47], [48, 49], model.cache_length)
    got.append(model.forward(verify, verify.verify_rows).logits)
    return got


@pytest.mark.parametrize("graphs", [False, True])
def test_the_native_forward_applies_the_drafter_lora_as_peft_and_its_gate_hooks_do(nld_dir, graphs):
    """float64: every call's logits equal transformers' forward with peft's LoRA and the row-gate hooks, eager or
    replayed from graphs (gated calls have graphs of their own); the adapter changes the proposal rows."""
    from packed_ss.models import DualModeModel

    load = dict(device="cpu", dtype="float64", drafter_lora="linear_spec_lora")
    native = DualModeModel.from_pretrained(nld_dir, **load)
    if graphs:
        on_graphs(native)
    reference = DualModeModel.from_pretrained(nld_dir, path="transformers", **load)
    base = DualModeModel.from_pretrained(nld_dir, device="cpu", dtype="float64", path="transformers")
    assert native.path == "native" and reference.path == "transformers"
    mine, theirs, plain = _lora_calls(native), _lora_calls(reference), _lora_calls(base)
    for a, b in zip(mine, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert not torch.allclose(mine[1], plain[1], atol=1e-3) and not torch.allclose(mine[2], plain[2], atol=1e-3)
    torch.testing.assert_close(mine[3], plain[3], rtol=0, atol=1e-10)  # the adapter off: the base model's
    if graphs:
        assert any(key[3] for key in native.static._graphs) and any(not key[3] for key in native.static._graphs)


@pytest.mark.parametrize("name", ["linear", "quadratic", "packed"])
def test_drafter_lora_runs_on_graphs_give_the_reference_runs_tokens_and_proposals(nld_dir, name):
    from packed_ss.models import DualModeModel

    from helpers import NLD_BOS_ID

    load = dict(device="cpu", dtype="float64", drafter_lora="linear_spec_lora")
    graphs = on_graphs(DualModeModel.from_pretrained(nld_dir, **load))
    reference = DualModeModel.from_pretrained(nld_dir, path="transformers", **load)
    config = DecodeConfig(block_size=4, max_new_tokens=16, drafter_lora=True)
    prompt = [NLD_BOS_ID, 50, 51, 52, 53]
    a, b = generate(graphs, prompt, config, name), generate(reference, prompt, config, name)
    assert a.token_ids == b.token_ids and [r.proposals for r in a.records] == [r.proposals for r in b.records]
    assert a.adapter_selected_rows == b.adapter_selected_rows > 0


def test_a_collected_adapters_cache_and_graphs_serve_the_next_adapter_and_a_live_ones_never_do():
    """A server makes an adapter per run and race lane, and each recorded every shape again
    inside its first timed calls (a race on a GPU timed its lanes' recordings). Now a collected adapter's cache goes
    with its graphs to the network's spares, from which the next run of that capacity takes it (emptied: the mask
    carries the length); a live adapter's cache is its own; graphs are keyed by the attention they were recorded
    with."""
    import gc

    eager = tiny_llama(seed=6, logit_scale=3.0)
    # a fixed branch count: Partial-branch SS's own pick follows the measured call cost, and with it its call shapes
    prompt, config = [4, 9, 2, 7, 3], DecodeConfig(block_size=4, max_new_tokens=24, branches=2)
    want = {name: generate(eager, prompt, config, name).token_ids for name in LOSSLESS}
    first = on_graphs(tiny_llama(seed=6, logit_scale=3.0))
    for name in LOSSLESS:
        assert generate(first, prompt, config, name).token_ids == want[name]
    recorder, cache = first.static._recorder, first.static.cache
    recorded = recorder.recorded
    second = on_graphs(first.share())
    assert generate(second, prompt, config, "packed").token_ids == want["packed"]
    assert second.static.cache is not cache and recorder.recorded > recorded  # the first adapter is alive
    del first
    gc.collect()
    recorded = recorder.recorded
    third = on_graphs(second.share())
    for name in LOSSLESS:  # on the first adapter's cache and graphs, after the first adapter's last run
        assert generate(third, prompt, config, name).token_ids == want[name], name
    assert third.static.cache is cache and recorder.recorded == recorded and third.static.compile_s == 0.0
    third.static.graph_attention = "sdpa"  # graphs of another attention are not replayed: recorded anew
    assert generate(third, prompt, config, "packed").token_ids == want["packed"] and recorder.recorded > recorded


def test_spare_caches_are_bounded_and_go_when_graphs_fail():
    import gc

    from packed_ss.models.graphs import SPARE, SPARE_CACHES

    base = tiny_llama(seed=6, logit_scale=3.0)
    prompt, config = [4, 9, 2], DecodeConfig(block_size=4, max_new_tokens=4)
    adapters = [on_graphs(base.share()) for _ in range(SPARE_CACHES + 3)]
    for adapter in adapters:
        generate(adapter, prompt, config, "packed")
    del adapters, adapter
    gc.collect()
    spares = getattr(base.model, SPARE)
    assert len(spares) == SPARE_CACHES  # the oldest went, and their memory with them
    from packed_ss.models.graphs import RecordedCache, SpareCaches

    none_kept = SpareCaches(limit=0)
    recorded = RecordedCache(spares._spare[0].cache)
    recorded.graphs[(1, 256)] = "a graph"
    none_kept.give(recorded)
    assert len(none_kept) == 0 and none_kept.take(256) is None
    failing = on_graphs(base.share(), FailingGraphCalls)
    longer = DecodeConfig(block_size=4, max_new_tokens=300)  # a capacity no spare has: recorded anew
    with pytest.warns(RuntimeWarning, match="out of GPU memory"):
        generate(failing, prompt, longer, "packed")  # Packed-SS's 2B = 8-row call fails to record
    assert failing.static.compiled and len(spares) == 0  # the spares went to make room; graphs stay on


def test_out_of_memory_for_a_new_cache_gives_the_spares_memory_back_and_tries_once_more(monkeypatch):
    import gc

    from packed_ss.models.graphs import SPARE
    from packed_ss.models.native import NativeCalls

    base = tiny_llama(seed=6, logit_scale=3.0)
    eager = tiny_llama(seed=6, logit_scale=3.0)
    prompt, short, long = [4, 9, 2], DecodeConfig(block_size=4, max_new_tokens=4), DecodeConfig(block_size=4,
                                                                                                max_new_tokens=300)
    first = on_graphs(base.share())
    generate(first, prompt, short, "packed")
    del first
    gc.collect()
    spares = getattr(base.model, SPARE)
    assert len(spares) == 1
    allocate, failures = NativeCalls._allocate, []

    def short_of_memory_once(self, tokens, keep=0):
        if not failures:
            failures.append(tokens)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return allocate(self, tokens, keep)

    monkeypatch.setattr(NativeCalls, "_allocate", short_of_memory_once)
    second = on_graphs(base.share())
    assert generate(second, prompt, long, "packed").token_ids == generate(eager, prompt, long, "packed").token_ids
    assert failures and len(spares) == 0 and second.static.capacity == 512
