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

Recording takes two untimed calls and the capture, at the first call of each (Rp, K) of an adapter; its time goes to
``compile_s`` (reported apart from decoding time, as compiling is). A capture that fails (out of GPU memory, an
operation CUDA graphs cannot record) gives the network eager native calls from then on, with one line naming why
(``note``); without a CUDA device nothing is recorded and :func:`graph_problem` says so. An adapter's calls outlive
it: when it is collected they go, cache and graphs, to the network's next adapter (:meth:`GraphCalls.reused`), so a
server that makes an adapter per run records each shape a few times in all, not in every run's timed calls; and the
cache's capacity only grows, so a shorter run replays a longer one's graphs. The network's
:class:`CudaRecorder` records every adapter's calls into one memory pool; the CPU tests give :class:`GraphCalls` a
recorder with the same semantics (``tests/test_graphs.py``).

Shape legend: Rp padded rows of the call, K cache capacity, L layers, Hkv key/value heads, hd head size, H hidden
size, V vocabulary.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import torch

from packed_ss.models.native import ATTENTIONS, NATIVE_FAILURE, NativeCalls, native_decoder

GRAPHS = "packed_ss_graph_calls"  # attribute of the network marking its calls as graph-replayed (for `compiled`)
RECORDER = "packed_ss_graph_recorder"  # ... and holding the recorder (one memory pool) of every adapter's graphs
KEPT = "packed_ss_graph_calls_kept"  # ... and the calls of collected adapters, for later ones (GraphCalls.reused)
# The graph path's attention (NativeDecoder.forward): "written" until scripts/gpu_check.py has measured "sdpa" against
# it on a GPU (graph_call_cost gives both, each call over the floor).
GRAPH_ATTENTION = "written"
KEPT_CALLS = 8  # per network: adapters' calls (caches and graphs) kept for later adapters (GraphCalls.reused)


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


class GraphCalls(NativeCalls):
    """:class:`~packed_ss.models.native.NativeCalls` whose padded calls replay CUDA graphs instead of
    ``torch.compile`` (see the module docstring). Graphs are this adapter's own: they read its cache tensor.

    Attributes (besides :class:`~packed_ss.models.static.StaticCalls`'): ``shapes`` the (Rp, K) recorded, in first-use
    order; ``compile_s`` seconds spent recording (untimed calls and captures); ``attention`` how its calls attend
    (:data:`~packed_ss.models.native.ATTENTIONS`, default :data:`GRAPH_ATTENTION`)."""

    recorder_class = CudaRecorder  # what records a call (tests on the CPU give one that keeps CUDA graphs' semantics)

    def __init__(self, model, hidden_only: bool, compiled: bool = False, compiler=None,
                 attention: str = GRAPH_ATTENTION):
        self._graphs: dict[tuple[int, int, bool, bool], CallGraph] = {}  # (Rp, K, hidden only, gated)
        self.attention = attention  # eager calls and recorded graphs alike
        recorder = getattr(model, RECORDER, None)
        if type(recorder) is not self.recorder_class:
            recorder = self.recorder_class()
            object.__setattr__(model, RECORDER, recorder)
        recorder.adapters.add(self)
        self._recorder = recorder
        super().__init__(model, hidden_only, compiled, compiler)

    @property
    def attention(self) -> str:
        """How calls attend (:data:`~packed_ss.models.native.ATTENTIONS`); setting another drops the graphs recorded
        with the old one. Raises: ValueError for an unknown name."""
        return self._attention

    @attention.setter
    def attention(self, value: str) -> None:
        if value not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {value!r}")
        if value != getattr(self, "_attention", value):
            self._graphs.clear()
        self._attention = value

    # --- adapters' calls kept for the next adapter -------------------------------------------
    _pool_lock = threading.Lock()  # adapters are made and collected in any of a server's threads

    @classmethod
    def reused(cls, model, hidden_only: bool, compiled: bool = False, owner=None) -> "GraphCalls":
        """Calls for a new adapter ``owner`` of ``model``: those an adapter of the network left when it was
        collected, with their cache and recorded graphs (emptied: length 0), or new ones. When ``owner`` is
        collected its calls go back for the next adapter (at most :data:`KEPT_CALLS` kept per network).

        Why: graphs are an adapter's own (they read its cache tensor), and a server makes an adapter per run and
        race lane; new calls would record every shape again inside the run's first timed calls."""
        calls = None
        if compiled:
            with cls._pool_lock:
                kept = getattr(model, KEPT, [])
                for index in range(len(kept) - 1, -1, -1):
                    candidate = kept[index]
                    if (type(candidate) is cls and candidate.compiled and candidate._hidden_only == bool(hidden_only)
                            and candidate.attention == GRAPH_ATTENTION and candidate.native is native_decoder(model)):
                        calls = kept.pop(index)
                        break
        if calls is not None:
            calls.rollback(0)
            calls.compile_s, calls.budget_note = 0.0, None  # this adapter's own recording time from here
        else:
            calls = cls(model, hidden_only, compiled)
        if owner is not None:
            weakref.finalize(owner, calls._keep).atexit = False  # nothing to keep for a process that ends
        return calls

    def _keep(self) -> None:
        """Offer these calls to the network's next adapter (their owner is gone)."""
        if not self.compiled or not self._graphs:
            return
        with self._pool_lock:
            kept = getattr(self.model, KEPT, None)
            if kept is None:
                kept = []
                object.__setattr__(self.model, KEPT, kept)
            if len(kept) < KEPT_CALLS and all(other is not self for other in kept):
                kept.append(self)

    def _compile(self, compiler):
        if getattr(self.model, NATIVE_FAILURE, None) is not None:
            return None
        problem = self._recorder.problem(self.device)
        if problem is not None:
            object.__setattr__(self.model, NATIVE_FAILURE, RuntimeError(problem))
            return None
        object.__setattr__(self.model, GRAPHS, True)
        return self  # a marker: calls go through _compiled_call

    failure_line = "CUDA graphs off ({first}); native calls run eagerly"

    @property
    def shapes(self) -> list[tuple[int, int]]:
        return list(dict.fromkeys(key[:2] for key in self._graphs))

    def reset(self, tokens: int = 0, block_size: int | None = None) -> None:
        """As :meth:`StaticCalls.reset`, but the capacity only grows: a graph reads the cache tensor it was recorded
        on, so a shorter run than the last keeps the larger cache and replays its graphs (the mask carries the
        length) instead of recording them again on a smaller one."""
        if self.cache is not None:
            tokens = max(tokens, self.capacity)
        super().reset(tokens, block_size)

    def _allocate(self, tokens: int, keep: int = 0) -> None:
        super()._allocate(tokens, keep)
        self._graphs.clear()  # they read the cache tensor they were recorded on

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
        key = (total, self.capacity, bool(hidden_only), gate is not None)
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
                with self._pool_lock:  # and the calls kept for later adapters, with their caches
                    getattr(self.model, KEPT, []).clear()
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
            for (rows, capacity, hidden_only, gated), graph in self._graphs.items():
                if capacity != self.capacity or hidden_only or gated:
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
