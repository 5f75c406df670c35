"""The graph path fit for a GPU (issue 64), tested on the CPU with recorders that keep what a real capture forbids.

* Nothing else may run on the device while a stream captures: :class:`WatchfulRecorder` fails any call from another
  thread during a capture (CUDA: "operation not permitted when stream is capturing").
* No timed call records: :class:`ClockedRecorder` fails a capture that starts while a call's clock runs.
* A collection may run in any thread holding any lock: the finalizer that returns a cache takes none.
* Spares are bounded in bytes, and a reused one carries nothing of its last run.
* Long prompts: eager calls attend by SDPA in query chunks, whose temporaries are computed from the shapes.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch
from helpers import tiny_llama
from test_graphs import HostGraphCalls, HostRecorder, on_graphs

from packed_ss.config import DecodeConfig
from packed_ss.engine import generate
from packed_ss.models.graphs import GraphCalls, RecordedCache, SpareCaches
from packed_ss.schedules import LOSSLESS


class WatchfulRecorder(HostRecorder):
    """A capture that takes a while and, like CUDA's, cannot have another thread's call beside it: ``beside`` lists
    the calls that came during one (class-wide: the device is one, whichever network captures)."""

    capturing: int | None = None
    beside: list = []

    def record(self, call, device):
        WatchfulRecorder.capturing = threading.get_ident()
        try:
            time.sleep(0.02)  # a capture is slow next to a tiny model's call: other threads' calls would land in it
            return super().record(call, device)
        finally:
            WatchfulRecorder.capturing = None


class WatchfulGraphCalls(GraphCalls):
    recorder_class = WatchfulRecorder


@pytest.fixture
def watchful(monkeypatch):
    """Every native call checks that no other thread is capturing; every compiled adapter replays graphs through
    :class:`WatchfulRecorder`."""
    from packed_ss.models.adapter import DualModeModel
    from packed_ss.models.native import NativeCalls, NativeDecoder

    forward = NativeDecoder.forward

    def checked(self, *args, **kwargs):
        capturing = WatchfulRecorder.capturing
        if capturing is not None and capturing != threading.get_ident():
            WatchfulRecorder.beside.append(threading.current_thread().name)
            raise RuntimeError("operation not permitted when stream is capturing")
        return forward(self, *args, **kwargs)

    def calls(self, compiled):
        kind = WatchfulGraphCalls if compiled else NativeCalls
        return kind(self.model, self.supports_deferred_rows, compiled)

    monkeypatch.setattr(NativeDecoder, "forward", checked)
    monkeypatch.setattr(DualModeModel, "_calls", calls)
    WatchfulRecorder.beside = []
    return WatchfulRecorder


def test_a_model_loaded_while_another_visitor_computes_records_its_graphs_at_the_gate_only(tiny_model_dir, watchful):
    """A visitor's choice of another precision loads a model, whose warm-up records graphs; another visitor computes
    the whole time. Every capture takes a turn of the compute gate, so no call of the other visitor's ever lands in one
    (the server's warm-up ran outside the gate, and a GPU would fail both calls)."""
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    store = ModelStore(str(tiny_model_dir), device="cpu", compiled=True, dtype="float64")
    tasks = GpuTasks(store, ComputeGate())
    first = store.get("")
    assert first.graphs
    config, done, errors = DecodeConfig(block_size=4, max_new_tokens=6), threading.Event(), []

    def visitor():
        try:
            while not done.is_set():
                tasks.generate(("", ""), [3, 4, 5], config, "packed")
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    other = threading.Thread(target=visitor, name="visitor")
    other.start()
    try:
        loaded = store.get("", "float32")  # loads, then warms up (recording graphs) while the visitor computes
    finally:
        done.set()
        other.join()
    assert loaded.graphs and loaded is not first
    assert not errors and not watchful.beside, (errors, watchful.beside)


class ClockedRecorder(HostRecorder):
    """Fails a capture that starts while a call's clock runs (the adapter's two device syncs bracket the clock)."""

    clock_running = False
    shapes: list = []

    def record(self, call, device):
        if ClockedRecorder.clock_running:
            raise AssertionError("a graph was recorded inside a timed call")
        ClockedRecorder.shapes.append(call()[0].shape[0])
        return super().record(call, device)


class ClockedGraphCalls(GraphCalls):
    recorder_class = ClockedRecorder


@pytest.fixture
def clocked(monkeypatch):
    """The adapter's clock, made visible: its first sync of a call starts the clock, the second stops it. Compiled
    adapters replay graphs through :class:`ClockedRecorder`."""
    from packed_ss.models.adapter import DualModeModel
    from packed_ss.models.native import NativeCalls

    def sync(self):
        ClockedRecorder.clock_running = not ClockedRecorder.clock_running

    def calls(self, compiled):
        return (ClockedGraphCalls if compiled else NativeCalls)(self.model, self.supports_deferred_rows, compiled)

    monkeypatch.setattr(DualModeModel, "_sync", sync)
    monkeypatch.setattr(DualModeModel, "_calls", calls)
    ClockedRecorder.clock_running, ClockedRecorder.shapes = False, []
    return ClockedRecorder


def test_a_race_on_a_fresh_model_records_every_lanes_shapes_before_its_clock_and_none_inside(clocked):
    """Every lane of a race on a model with no graph yet: its shapes are recorded in the untimed rehearsal at its first
    turn, never inside a timed call, and no iteration reports recording time."""
    from serve.gpu import GpuTasks
    from serve.limits import ComputeGate
    from serve.models import ModelStore

    model = tiny_llama(seed=6, logit_scale=3.0, compiled=True)
    assert model.graphs
    tasks = GpuTasks(ModelStore(preloaded={"m": model}), ComputeGate())
    config = DecodeConfig(block_size=4, max_new_tokens=24)
    turns, runs, _ = tasks._race(("m", ""), [4, 9, 2, 7, 3], config, ["ar", "linear", "quadratic", "packed"])
    assert all(run.records for run in runs)
    assert sorted(set(clocked.shapes)) == [1, 4, 8, 20], clocked.shapes  # AR, B, 2B and B(B + 1) rows
    assert all(run.recorded_s == 0.0 for run in runs), [run.recorded_s for run in runs]
    assert len({run.token_ids for run in runs}) == 1


def test_a_shape_first_met_after_the_rehearsal_is_recorded_before_its_clock_and_left_out_of_the_wall_time(clocked):
    """A rehearsal sees the first iterations only; a shape met later (a drafting-only call here, made by hand) is
    recorded before its call's clock, and its recording time is reported apart: ``recorded_ms`` of the call, out of
    the iteration's wall time."""
    from packed_ss.iteration import close_iteration
    from packed_ss.layout import draft_layout, prefill_layout
    from packed_ss.records import CallRecord

    model = on_graphs(tiny_llama(seed=6, logit_scale=3.0), ClockedGraphCalls)
    model.reset(40, block_size=4)
    prompt = prefill_layout([3, 4, 5, 6], 0, model.mask_token_id)
    model.forward(prompt, prompt.verify_rows)
    drafting = draft_layout(7, 3, model.cache_length, model.mask_token_id)
    out = model.forward(drafting, drafting.draft_rows)
    assert clocked.shapes == [4] and out.recorded_ms > 0.0
    again = model.forward(draft_layout(8, 3, model.cache_length, model.mask_token_id), drafting.draft_rows)
    assert again.recorded_ms == 0.0 and model.static.replays == 2  # both calls replayed the one graph
    started = time.perf_counter() - 1.0  # an iteration of 1 s, 0.9 s of it recording
    record = close_iteration(1, "linear", [CallRecord(drafting, 50.0, recorded_ms=900.0)], started, None,
                             prefix_len_before=4, prefix_len_after=4)
    assert record.recorded_ms == 900.0 and record.wall_ms < 1000.0 - 800.0


def test_a_rehearsal_records_its_shapes_largest_first():
    """Calls of 4, 8 and 1 rows met while rehearsing run eagerly; on leaving, their graphs are recorded 8, 4, 1 (smaller
    captures then reuse the pool's memory), and the same calls then replay them."""
    from packed_ss.layout import draft_layout, packed_layout, prefill_layout, verify_layout

    model, eager = on_graphs(tiny_llama(seed=6), ClockedGraphCalls), tiny_llama(seed=6)
    ClockedRecorder.clock_running, ClockedRecorder.shapes = False, []

    def calls(adapter):
        adapter.reset(40, block_size=4)
        prompt = prefill_layout([3, 4, 5, 6], 0, adapter.mask_token_id)
        adapter.forward(prompt, prompt.verify_rows)
        out = []
        for layout in (draft_layout(7, 3, 4, 1), packed_layout(6, [7, 8, 9], 3, 4, 1), verify_layout([7], [], 4)):
            out.append(adapter.forward(layout, tuple(range(layout.rows))).logits)
            adapter.rollback(4)
        return out

    with model.rehearsing():
        calls(model)
    assert ClockedRecorder.shapes == [8, 4, 1] and model.static.replays == 0
    for a, b in zip(calls(model), calls(eager), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert model.static.replays == 3 and ClockedRecorder.shapes == [8, 4, 1]


def test_the_finalizer_that_returns_a_cache_takes_no_lock():
    """A collection runs the finalizer in whichever thread triggers it, holding whatever that thread holds: with the
    lock that makes a network's spares held, it hung that thread and every later adapter creation."""
    base = tiny_llama(seed=6, logit_scale=3.0)
    spares_before = None

    def collect_holding_the_lock():
        nonlocal spares_before
        adapter = on_graphs(base.share())
        generate(adapter, [4, 9, 2], DecodeConfig(block_size=4, max_new_tokens=4), "packed")
        spares_before = adapter.static._spares
        with SpareCaches.making:
            del adapter
            gc.collect()

    worker = threading.Thread(target=collect_holding_the_lock, daemon=True)
    worker.start()
    worker.join(timeout=300)  # a hang, not a slow machine: the run itself takes well under a second
    assert not worker.is_alive(), "the finalizer waited for a lock its own thread held"
    assert len(spares_before) == 1  # the cache came back all the same


def test_spare_caches_are_bounded_in_bytes_and_a_reused_one_is_emptied():
    """The oldest spares go once the bytes they hold pass the bound; a spare taken again holds zeros past what the
    run carries over (a float16 cache's overflowed stale keys turned whole graph rows into NaN)."""
    from packed_ss.models.native import NativeCache

    def recorded(fill: float) -> RecordedCache:
        cache = RecordedCache(NativeCache(torch.full((1, 2, 1, 256, 4), fill)))  # 8 KiB
        cache.graphs[(4, 256, False, False, "written")] = "a graph"
        return cache

    spares = SpareCaches(limit=8, limit_bytes=3 * 8192)
    for fill in range(5):
        spares.give(recorded(float(fill)))
    assert len(spares) == 3 and spares.bytes <= 3 * 8192
    assert [float(s.cache.tensor[0, 0, 0, 0, 0]) for s in spares._spare] == [2.0, 3.0, 4.0]  # the newest kept

    model, eager = on_graphs(tiny_llama(seed=6, logit_scale=3.0)), tiny_llama(seed=6, logit_scale=3.0)
    prompt, config = [4, 9, 2, 7, 3], DecodeConfig(block_size=4, max_new_tokens=24)
    generate(model, prompt, config, "packed")
    model.static.cache.tensor[:, :, :, 100:].fill_(float("nan"))  # stale slots no mask lets a row read
    second = on_graphs(model.share())
    spare = model.static._held[0]
    del model
    gc.collect()
    assert generate(second, prompt, config, "packed").token_ids == generate(eager, prompt, config, "packed").token_ids
    assert second.static.cache is spare.cache and bool(torch.isfinite(second.static.cache.tensor).all())


def test_eager_calls_on_the_graph_path_attend_by_sdpa_and_graphs_as_asked():
    model = on_graphs(tiny_llama(seed=6))
    assert model.static.attention == "sdpa" and model.static.graph_attention == "written"


@pytest.mark.parametrize("attention", ["sdpa", "written"])
def test_a_long_calls_queries_attend_in_chunks_with_the_same_logits(monkeypatch, attention):
    """In place, a call whose attention temporaries pass the budget takes its query rows in chunks: float64 logits
    and the cache equal the one-piece call's, and each chunk's temporaries stay within the budget."""
    import packed_ss.models.native as native
    from packed_ss.layout import prefill_layout

    def run(budget: int):
        monkeypatch.setattr(native, "ATTENTION_BYTES", budget)
        model = tiny_llama(seed=4, layers=2)
        model.static.attention = attention
        model.reset(200, block_size=4)
        layout = prefill_layout([3 + i % 19 for i in range(150)], 0, model.mask_token_id)
        logits = model.forward(layout, layout.verify_rows).logits
        return logits, model.static.cache.tensor.clone()

    seen = []
    attend = native.NativeDecoder._attend

    def watched(q, keys, values, bias, scaling, how, softmax_dtype):
        seen.append(bias.shape)
        return attend(q, keys, values, bias, scaling, how, softmax_dtype)

    whole, cache = run(1 << 30)
    monkeypatch.setattr(native.NativeDecoder, "_attend", staticmethod(watched))
    budget = 150 * (native.SCORE_BYTES * 4 + native.MASK_BYTES) * 40  # about 40 of the 150 rows at once
    chunked, chunked_cache = run(budget)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-12)
    assert torch.equal(chunked_cache, cache)
    assert len(seen) > 2 and all(rows * keys * (native.SCORE_BYTES * 4 + native.MASK_BYTES) <= budget
                                 for rows, keys in seen), seen  # (G c, S): heads = G here (4 heads, 4 kv heads)


def test_an_8k_prompt_on_nld_3b_shapes_needs_under_2_gb_of_attention_temporaries():
    """NLD-3B: 32 query heads, 8 key/value heads. In one piece an 8,192-token prefill's scores alone would take
    about 34 GB (what a GPU's eager prefill built before); in chunks, mask included, under 2 GB."""
    from packed_ss.models.native import SCORE_BYTES, attention_chunk, attention_temporaries

    rows = keys = 8192
    assert rows * keys * 32 * SCORE_BYTES > 30 * 2**30
    assert attention_temporaries(rows, keys, 32, 8) < 2 * 2**30
    assert 1 <= attention_chunk(rows, keys, 32, 8) < rows
    assert attention_chunk(16, 512, 32, 8) == 16  # a decoding call stays in one piece
    with pytest.raises(ValueError, match="must be >= 1"):
        attention_chunk(0, 512, 32, 8)


def test_a_call_out_of_device_memory_is_one_line_naming_what_it_needed(monkeypatch):
    from packed_ss.models.native import NativeDecoder

    model = tiny_llama(seed=6)

    def short_of_memory(self, *args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 5.00 GiB")

    monkeypatch.setattr(NativeDecoder, "forward", short_of_memory)
    with pytest.raises(ValueError, match=r"out of device memory in a call of \d+ rows over \d+ keys: its attention "
                                         r"needs up to [0-9.]+ KiB beside the [0-9.]+ KiB KV cache") as caught:
        generate(model, [4, 9, 2, 7, 3], DecodeConfig(block_size=4, max_new_tokens=4), "packed")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", LOSSLESS)
def test_every_lossless_schedule_after_its_rehearsal_gives_ars_tokens_at_t_above_zero_too(name):
    """The rehearsal runs on the run's own adapter and must leave nothing of itself: sampled runs (their seed's draws)
    and greedy ones equal an eager adapter's. Partial-branch SS gets a fixed branch count (by default it picks one
    from the measured call cost, which a busy machine changes, and with it the calls and draws of a sampled run)."""
    eager, model = tiny_llama(seed=6, logit_scale=3.0), on_graphs(tiny_llama(seed=6, logit_scale=3.0), HostGraphCalls)
    for config in (DecodeConfig(block_size=4, max_new_tokens=20, branches=2),
                   DecodeConfig(block_size=4, max_new_tokens=20, temperature=0.8, seed=3, branches=2)):
        a, b = generate(model, [4, 9, 2, 7, 3], config, name), generate(eager, [4, 9, 2, 7, 3], config, name)
        assert a.token_ids == b.token_ids and a.nfe == b.nfe, (name, config.temperature)


def test_the_race_says_when_graphs_were_recorded_inside_its_lanes():
    from types import SimpleNamespace

    from serve.race import recording_note

    runs = [SimpleNamespace(schedule="ar", recorded_s=0.0), SimpleNamespace(schedule="packed", recorded_s=0.25)]
    assert recording_note(runs) == (" CUDA graphs recorded inside the race (packed 250 ms) were left out of those "
                                    "lanes' times.")
    assert recording_note(runs[:1]) == ""


def test_a_process_whose_capture_state_broke_runs_every_network_eagerly_with_one_line():
    class Broken(HostRecorder):
        broken = "a failed CUDA graph capture left torch's capture state unusable (the capture stream is capturing)"

    class BrokenGraphCalls(GraphCalls):
        recorder_class = Broken

    eager, model = tiny_llama(seed=6, logit_scale=3.0), on_graphs(tiny_llama(seed=6, logit_scale=3.0), BrokenGraphCalls)
    config = DecodeConfig(block_size=4, max_new_tokens=12)
    with pytest.warns(RuntimeWarning, match="capture state unusable"):
        assert generate(model, [4, 9, 2], config, "packed").token_ids == generate(eager, [4, 9, 2], config,
                                                                                  "packed").token_ids
    assert not model.graphs and model.static.captures == 0 and "\n" not in model.compile_note


@pytest.mark.parametrize("capturing", [False, True])
def test_after_a_failed_capture_the_allocator_stops_filling_the_pool_and_a_stream_left_capturing_breaks_graphs(
        monkeypatch, capturing):
    """What :meth:`CudaRecorder._recover` does with torch's CUDA calls, observed through stand-ins: it ends the
    allocator's routing into the pool (harmless when torch ended it itself: that raises), and where the stream is
    still capturing, graphs go off in the process (``broken``) instead of every later call failing."""
    import contextlib

    from packed_ss.models.graphs import CudaRecorder

    ended, emptied = [], []

    def end(index, pool):
        ended.append((index, pool))
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    monkeypatch.setattr(torch._C, "_cuda_endAllocateToPool", end, raising=False)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    monkeypatch.setattr(CudaRecorder, "broken", None)
    recorder = CudaRecorder()
    recorder._pool = (0, 7)
    recorder._recover(object(), torch.device("cuda", 0))
    assert ended == [(0, (0, 7))]
    assert (CudaRecorder.broken is not None) == capturing and bool(emptied) != capturing
    if capturing:
        assert "capture stream is still capturing" in CudaRecorder.broken


def test_a_cache_keeps_a_bounded_number_of_graphs(monkeypatch):
    import packed_ss.models.graphs as graphs
    from packed_ss.layout import draft_layout, prefill_layout

    monkeypatch.setattr(graphs, "GRAPHS_PER_CACHE", 2)
    model = on_graphs(tiny_llama(seed=6))
    model.reset(60, block_size=2)
    prompt = prefill_layout([3, 4, 5, 6], 0, model.mask_token_id)
    model.forward(prompt, prompt.verify_rows)
    for width in (2, 4, 6):  # calls of 2, 4 and 6 rows: three graphs, two kept (the newest)
        layout = draft_layout(7, width - 1, 4, model.mask_token_id)
        model.forward(layout, layout.draft_rows)
        model.rollback(4)
    assert [key[0] for key in model.static._graphs] == [4, 6]
