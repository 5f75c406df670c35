"""The native forward's calls replayed as CUDA graphs (issue 55): a GPU call that costs what the GPU must do.

On a GPU, transformers' forward cost the same 15-18 ms for an NLD-shaped 1.34B model at 1 to 256 rows: launching
kernels, not reading weights (about 0.6 ms at the H200's bandwidth). A CUDA graph records one call's kernels once and
replays them with a single launch. :class:`GraphCalls` records :class:`~packed_ss.models.native.NativeDecoder`'s call
once per padded row count Rp (:func:`~packed_ss.models.static.padded_rows`: 1, then multiples of the run's block size
B, which covers every schedule's calls at that B) over the adapter's static cache of capacity K: the additive mask
carries the cache's length, so one graph replays at every length and after every rollback. A graph's inputs (ids,
positions, the rows' cache slots, the (Rp, K) mask) are buffers of its own, copied into before each replay. The
forward writes the new rows' keys and values into the cache at those slots (C .. C + Rp - 1, the padding rows' past the
length, unread) and attends over the cache alone (:attr:`~packed_ss.models.native.NativeCalls.in_place`), so a layer
copies no keys; the caller copies the rows it needs before the next replay writes over the graph's outputs.

Recording takes two untimed calls and the capture, at the first call of each (Rp, K) on a cache; its time goes to
``compile_s`` (reported apart from decoding time, as compiling is). A capture that fails (out of GPU memory, an
operation CUDA graphs cannot record) gives the network eager native calls from then on, with one line naming why
(``note``); without a CUDA device nothing is recorded and :func:`graph_problem` says so. A cache outlives its use:
when a run needs another capacity, or its adapter is collected, the cache goes with its graphs to the network's
:class:`SpareCaches`, and the next run of that capacity, on any adapter, takes it. A server that makes an adapter per
run and race lane thus records each shape a few times in all, not in every run's timed calls, and every run still
attends over its own capacity (race lanes are timed alike). The network's
:class:`CudaRecorder` records every adapter's calls into one memory pool; the CPU tests give :class:`GraphCalls` a
recorder with the same semantics (``tests/test_graphs.py``).

Shape legend: Rp padded rows of the call, K cache capacity, L layers, Hkv key/value heads, hd head size, H hidden
size, V vocabulary.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref

import torch

from packed_ss.models.native import ATTENTIONS, NATIVE_FAILURE, NativeCalls
from packed_ss.models.static import CAPACITY_STEP

GRAPHS = "packed_ss_graph_calls"  # attribute of the network marking its calls as graph-replayed (for `compiled`)
RECORDER = "packed_ss_graph_recorder"  # ... and holding the recorder (one memory pool) of every adapter's graphs
SPARE = "packed_ss_graph_spare_caches"  # ... and the caches with graphs no adapter holds (SpareCaches)
# The graph path's attention (NativeDecoder.forward): "written" until scripts/gpu_check.py has measured "sdpa" against
# it on a GPU (graph_call_cost gives both, each call over the floor).
GRAPH_ATTENTION = "written"
SPARE_CACHES = 8  # per network: caches with their graphs kept for later runs and adapters (SpareCaches)


def graph_problem(device: torch.device) -> str | None:
    """Why calls on ``device`` cannot be replayed as CUDA graphs, or None when they can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (the model is on {device.type})"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    return None


class CudaRecorder:
    """Records calls as CUDA graphs sharing one memory pool: one recorder per network, for every adapter's graphs
    (a session's adapter would otherwise hold a pool of its own, sized by its largest call). Sharing is safe because
    model calls run one at a time (the server's compute gate; one thread elsewhere) and a graph's outputs are copied
    out before the next replay: whatever another graph's replay overwrites is dead by then.

    Attributes: ``adapters``, the :class:`GraphCalls` recording through it (a failure turns graphs off for all).
    """

    # One capture at a time in the process: torch's capture stream and allocator state are shared (a model loading
    # in one thread, outside the compute gate, records its warm-up's graphs while another thread may be recording).
    _capturing = threading.Lock()

    def __init__(self):
        self._pool = None
        self._stream = None  # warm-up and capture run on it, on the model's device
        self._recorded = weakref.WeakSet()  # graphs of this pool still alive
        self.adapters = weakref.WeakSet()

    problem = staticmethod(graph_problem)

    def record(self, call, device: torch.device):
        """Record ``call()`` (no arguments: it reads buffers of its caller's): returns (its outputs, written by every
        replay, and the replay function). Two untimed calls on the capture stream come first (cuBLAS handles,
        workspace, the caching allocator), as capture requires. Runs with ``device`` current, whatever the
        thread's current device is, and leaves the thread's current stream as it found it, even when capture
        fails."""
        with self._capturing, torch.cuda.device(device):
            if self._stream is None:
                self._stream = torch.cuda.Stream(device)
            if not self._recorded:  # torch cannot capture into a pool whose graphs are all gone: a new pool
                self._pool = torch.cuda.graph_pool_handle()
            stream, previous = self._stream, torch.cuda.current_stream(device)
            graph = torch.cuda.CUDAGraph()
            try:
                stream.wait_stream(previous)
                with torch.cuda.stream(stream):
                    for _ in range(2):
                        call()
                # thread_local: a server's other threads may touch the device (copies of results) meanwhile
                with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                    outputs = call()
            finally:
                torch.cuda.set_stream(previous)  # a capture that raised leaves its stream current
            previous.wait_stream(stream)
            self._recorded.add(graph)
        return outputs, graph.replay

    @staticmethod
    def release() -> None:
        """Return what a failed recording left to the device (nothing where torch's capture state is broken)."""
        try:
            torch.cuda.empty_cache()
        except RuntimeError:
            pass


class CallGraph:
    """One recorded call of Rp rows over a cache of capacity K: its input buffers, their replay, its output buffers.

    The call writes the cache, so the untimed calls of the recording run on the first call's own inputs (``first``,
    as :meth:`replay` takes them): they write what that call writes, where it writes it."""

    def __init__(self, native, cache: torch.Tensor, hidden_only: bool, recorder, first: tuple,
                 attention: str = GRAPH_ATTENTION):
        device = cache.device
        index, bias, gate = first
        self.index = torch.empty_like(index, device=device)  # (3, Rp): ids, positions, the rows' cache slots
        self.ids, self.positions, self.slots = self.index
        self.bias = torch.empty_like(bias, device=device)  # (Rp, K)
        # the drafter LoRA on: its per-row multiplier a buffer too (paper Appendix F.2)
        self.gate = None if gate is None else torch.empty_like(gate, device=device)
        # the graph reads these buffers and this cache tensor, wherever a replay finds them (all kept alive)
        self.cache = cache
        self._load(first)
        (self.out,), self._replay = recorder.record(  # the outputs' tuple: (logits or hidden states,)
            lambda: native(self.ids, self.positions, self.bias, cache, hidden_only, None, attention, self.gate,
                           self.slots)[:1],
            device)

    def _load(self, inputs: tuple) -> None:
        index, bias, gate = inputs
        self.index.copy_(index, non_blocking=True)
        self.bias.copy_(bias, non_blocking=True)
        if self.gate is not None:
            self.gate.copy_(gate, non_blocking=True)

    def replay(self, index: torch.Tensor, bias: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        """The call on these inputs (host or device tensors of the recorded shapes: ``index`` (3, Rp) the rows' ids,
        positions and cache slots, ``bias`` the (Rp, K) mask, ``gate`` (Rp,) or None): it writes the rows' keys and
        values into the cache at their slots and returns the logits or hidden states of every row (Rp, V or H), the
        graph's own buffer, which the next replay writes over: the caller copies the rows it keeps before then."""
        self._load((index, bias, gate))
        self._replay()
        return self.out

    def replay_again(self) -> None:
        """The graph once more, on the inputs already in its buffers (timing). It writes its last call's keys and
        values into the cache again, at that call's slots, which a rollback since may have given to other tokens:
        replay it within :meth:`cache_kept`."""
        self._replay()

    @contextlib.contextmanager
    def cache_kept(self):
        """The cache's slots this graph writes, as they were on entry, restored on exit (:meth:`replay_again`)."""
        kept = self.cache.index_select(3, self.slots)
        try:
            yield
        finally:
            self.cache.index_copy_(3, self.slots, kept)


class RecordedCache:
    """A (L, 2, Hkv, K, hd) cache (:class:`~packed_ss.models.native.NativeCache`) and the graphs recorded over it,
    keyed (Rp, K, hidden only, gated, attention)."""

    def __init__(self, cache):
        self.cache = cache
        self.graphs: dict[tuple, CallGraph] = {}

    @property
    def capacity(self) -> int:
        return self.cache.tensor.shape[3]


class SpareCaches:
    """The network's caches that no adapter holds, with their graphs, newest last, at most :data:`SPARE_CACHES`
    (the oldest goes, and its memory with it). A cache comes back through a queue, which a finalizer may fill from
    any thread at any moment (:meth:`give`, no lock taken); :meth:`take` and :meth:`clear` drain it under a lock."""

    making = threading.Lock()  # a network's first adapters may be made in two threads at once

    def __init__(self, limit: int = SPARE_CACHES):
        self.limit = limit
        self._returned = queue.SimpleQueue()
        self._spare: list[RecordedCache] = []
        self._lock = threading.Lock()

    def give(self, recorded: RecordedCache) -> None:
        """Keep ``recorded`` for a later run (safe in a finalizer)."""
        if recorded.graphs:
            self._returned.put(recorded)

    def take(self, capacity: int) -> RecordedCache | None:
        """The newest spare cache of ``capacity`` tokens, taken out, or None."""
        with self._lock:
            self._drain()
            for index in range(len(self._spare) - 1, -1, -1):
                if self._spare[index].capacity == capacity:
                    return self._spare.pop(index)
        return None

    def clear(self) -> None:
        """Drop every spare cache (a capture failed: graphs are off for the network)."""
        with self._lock:
            self._drain()
            self._spare.clear()

    def __len__(self) -> int:
        with self._lock:
            self._drain()
            return len(self._spare)

    def _drain(self) -> None:
        while True:
            try:
                self._spare.append(self._returned.get_nowait())
            except queue.Empty:
                break
        excess = len(self._spare) - self.limit
        if excess > 0:
            del self._spare[:excess]


def _spare_caches(model) -> SpareCaches:
    """The network's :class:`SpareCaches`, made on first use (once, whichever thread makes the first adapter)."""
    with SpareCaches.making:
        found = getattr(model, SPARE, None)
        if found is None:
            found = SpareCaches()
            object.__setattr__(model, SPARE, found)
    return found


def _give_back(model, held: list) -> None:
    """A collected adapter's cache goes to the network's spares, unless graphs are off for the network (finalizer:
    it holds neither the adapter nor its calls)."""
    if held and getattr(model, NATIVE_FAILURE, None) is None:
        _spare_caches(model).give(held.pop())


class GraphCalls(NativeCalls):
    """:class:`~packed_ss.models.native.NativeCalls` whose padded calls replay CUDA graphs instead of
    ``torch.compile`` (see the module docstring). Graphs belong to the cache they read: the adapter's current one,
    which may come with graphs from the network's spares (:class:`SpareCaches`).

    Attributes (besides :class:`~packed_ss.models.static.StaticCalls`'): ``shapes`` the (Rp, K) recorded on the
    current cache, in first-use order; ``compile_s`` seconds this adapter spent recording (untimed calls and
    captures); ``attention`` how its calls attend (:data:`~packed_ss.models.native.ATTENTIONS`, default
    :data:`GRAPH_ATTENTION`)."""

    recorder_class = CudaRecorder  # what records a call (tests on the CPU give one that keeps CUDA graphs' semantics)

    def __init__(self, model, hidden_only: bool, compiled: bool = False, compiler=None,
                 attention: str = GRAPH_ATTENTION):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self.attention = attention  # eager calls and recorded graphs alike (graphs are keyed by it)
        self._graphs: dict[tuple, CallGraph] = {}  # the current cache's graphs: (Rp, K, hidden only, gated, attention)
        self._held: list[RecordedCache] = []  # the current cache and its graphs (to the spares when collected)
        self._spares = _spare_caches(model)
        recorder = getattr(model, RECORDER, None)
        if type(recorder) is not self.recorder_class:
            recorder = self.recorder_class()
            object.__setattr__(model, RECORDER, recorder)
        recorder.adapters.add(self)
        self._recorder = recorder
        super().__init__(model, hidden_only, compiled, compiler)
        weakref.finalize(self, _give_back, model, self._held).atexit = False  # nothing to keep at exit

    def _compile(self, compiler):
        if getattr(self.model, NATIVE_FAILURE, None) is not None:
            return None
        problem = self._recorder.problem(self.device)
        if problem is not None:
            object.__setattr__(self.model, NATIVE_FAILURE, RuntimeError(problem))
            return None
        object.__setattr__(self.model, GRAPHS, True)
        return GRAPHS  # a marker, not None (not self: no cycle delays the finalizer): calls go through _compiled_call

    failure_line = "CUDA graphs off ({first}); native calls run eagerly"

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return list(dict.fromkeys(key[:2] for key in self._graphs))

    def _allocate(self, tokens: int, keep: int = 0) -> None:
        """A cache of the run's capacity: a spare one of the network's, with its graphs, or a new one; the cache
        held before goes to the spares (a graph reads the cache tensor it was recorded on). ``keep``: tokens of
        the prefix carried over (the cache grew mid-run)."""
        capacity = -(-tokens // CAPACITY_STEP) * CAPACITY_STEP
        found = self._spares.take(capacity) if self.compiled else None
        if found is None:
            try:
                super()._allocate(tokens, keep)
            except torch.OutOfMemoryError:  # the spares' caches give their memory back first, then once more
                self._spares.clear()
                self._recorder.release()
                super()._allocate(tokens, keep)
            found = RecordedCache(self.cache)
        else:
            if keep:
                found.cache.tensor[:, :, :, :keep] = self.cache.tensor[:, :, :, :keep]
            self.cache, self.capacity = found.cache, capacity
        if self._held and self.compiled:
            self._spares.give(self._held.pop())
        self._held[:] = [found]
        self._graphs = found.graphs

    gated_graphs = True  # calls with the drafter LoRA on replay graphs of their own (the gate a buffer)
    in_place = True  # every call writes its rows' keys and values into the cache (a graph mutates the buffer)

    def _compiled_call(self, inputs, total: int, variant=None):
        return self._replayed(inputs, total, None)

    def _gated_call(self, inputs, total: int, gate: torch.Tensor):
        return self._replayed(inputs, total, gate)

    def _replayed(self, inputs, total: int, gate: torch.Tensor | None):
        """The call replayed from its graph (recorded first where there is none), or None: run it eagerly."""
        index, bias, cache, hidden_only, in_place = inputs
        if self._function is None or not self.compiled or not in_place:  # graphs record the in-place form only
            return None
        key = (total, self.capacity, bool(hidden_only), gate is not None, self.attention)
        graph = self._graphs.get(key)
        if graph is None:
            start = time.perf_counter()
            failure = None
            try:
                graph = CallGraph(self.native, cache, bool(hidden_only), self._recorder,
                                  (index, bias, gate), self.attention)
            except Exception as error:  # noqa: BLE001 - out of memory, an unrecordable operation: eager, one line
                failure = (RuntimeError(f"out of GPU memory while recording the graph of {total} rows")
                           if isinstance(error, torch.cuda.OutOfMemoryError) else error.with_traceback(None))
            if failure is not None:  # outside the handler: its frames (and the tensors they hold) are gone
                self._give_up(failure)
                for adapter in list(self._recorder.adapters):  # every adapter's graphs: the pool's memory goes
                    adapter._graphs.clear()
                self._spares.clear()  # and the spare caches' graphs, with the caches
                self._recorder.release()
                return None
            self._graphs[key] = graph
            self.compile_s += time.perf_counter() - start
        return graph.replay(index, bias, gate), None  # the keys and values are in the cache

    def replay_ms(self, repeats: int = 10) -> dict[int, float]:
        """Rp -> the device time (ms, CUDA events) of one replay of the graph of Rp rows, on the inputs of its last
        call, for each graph recorded at the cache's current capacity (logit graphs): the mean of ``repeats``
        back-to-back replays after one queued first, so neither the host's input copies nor its launch latency
        count. Empty without graphs. The cache is as it was before (:meth:`CallGraph.cache_kept`).

        Raises: ValueError when ``repeats`` < 1."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        found = {}
        with torch.cuda.device(self.device):
            for (rows, capacity, hidden_only, gated, attention), graph in self._graphs.items():
                if capacity != self.capacity or hidden_only or gated or attention != self.attention:
                    continue
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                with graph.cache_kept():  # the replays write their last call's slots: the cache comes back
                    graph.replay_again()  # queued ahead: the timed replays start as soon as it ends
                    start.record()
                    for _ in range(repeats):
                        graph.replay_again()
                    end.record()
                    end.synchronize()
                found[rows] = start.elapsed_time(end) / repeats
        return found
