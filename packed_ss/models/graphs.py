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

Recording takes two untimed calls and the capture. It never runs inside a timed call: a run's shapes are recorded in
an untimed rehearsal before its clock starts (:meth:`GraphCalls.rehearsing`, :func:`packed_ss.engine.decode`), largest
first, so that smaller graphs reuse the pool's memory; a shape first met later is recorded before its call's clock
(:meth:`GraphCalls.record`) and its time is reported as ``recorded_ms`` of the call and iteration, outside their wall
time. Recording time goes to ``compile_s`` as well (reported apart from decoding time, as compiling is). Captures run
one at a time in the process, and a server runs them at its compute gate only (nothing else may touch the device
while a stream captures). A capture that runs out of memory frees the spare caches and tries once more; if that fails
too, that shape's calls run eagerly (``budget_note``). Any other capture failure (an operation CUDA graphs cannot
record) gives the network eager native calls from then on, with one line naming why (``note``); one that leaves
torch's capture state unusable turns graphs off in the whole process (:attr:`CudaRecorder.broken`). Without a CUDA
device nothing is recorded and :func:`graph_problem` says so. A cache outlives its use:
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
import warnings
import weakref

import torch

from packed_ss.models.native import ATTENTIONS, NATIVE_FAILURE, NativeCalls, sdpa_names
from packed_ss.models.static import CAPACITY_STEP

GRAPHS = "packed_ss_graph_calls"  # attribute of the network marking its calls as graph-replayed (for `compiled`)
RECORDER = "packed_ss_graph_recorder"  # ... and holding the recorder (one memory pool) of every adapter's graphs
SPARE = "packed_ss_graph_spare_caches"  # ... and the caches with graphs no adapter holds (SpareCaches)
# The graph path's attention (NativeDecoder.forward): "written" until scripts/gpu_check.py has measured "sdpa" against
# it on a GPU (graph_call_cost gives both, each call over the floor). Eager calls (the prefill) always use "sdpa".
GRAPH_ATTENTION = "written"
SPARE_CACHES = 8  # per network: caches with their graphs kept for later runs and adapters (SpareCaches)
SPARE_FRACTION = 8  # ... holding at most 1/8 of the device's memory (CPU tests: SPARE_BYTES_HOST)
SPARE_BYTES_HOST = 1 << 30
GRAPHS_PER_CACHE = 24  # graphs kept per cache (the oldest recorded goes first): shapes of every B once used add up


def graph_problem(device: torch.device) -> str | None:
    """Why calls on ``device`` cannot be replayed as CUDA graphs, or None when they can."""
    if device.type != "cuda":
        return f"CUDA graphs need a CUDA device (the model is on {device.type})"
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    return CudaRecorder.broken


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is the device running out of memory: torch's OutOfMemoryError, or a CUDA error that says so
    (an allocation inside a capture can surface as ``CUDA error: out of memory``, a RuntimeError)."""
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def one_line(error: BaseException) -> str:
    """``error``'s kind and first line, at most 200 characters: what a note keeps of a failure (never the error
    itself, whose traceback would keep the failed capture's tensors alive)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first[:200]}"


class CudaRecorder:
    """Records calls as CUDA graphs sharing one memory pool: one recorder per network, for every adapter's graphs
    (a session's adapter would otherwise hold a pool of its own, sized by its largest call). Sharing is safe because
    model calls run one at a time (the server's compute gate; one thread elsewhere) and a graph's outputs are copied
    out before the next replay: whatever another graph's replay overwrites is dead by then.

    Attributes: ``adapters``, the :class:`GraphCalls` recording through it (a failure turns graphs off for all);
    ``captures``, graphs recorded through it. Class attribute ``broken``: why torch's capture state is unusable in
    this process after a failed capture (graphs are then off for every network), or None.
    """

    # One capture at a time in the process: torch's capture stream and allocator state are shared.
    _capturing = threading.Lock()
    broken: str | None = None

    def __init__(self):
        self._pool = None
        self._stream = None  # warm-up and capture run on it, on the model's device
        self._recorded = weakref.WeakSet()  # graphs of this pool still alive
        self.adapters = weakref.WeakSet()
        self.captures = 0

    problem = staticmethod(graph_problem)

    def record(self, call, device: torch.device):
        """Record ``call()`` (no arguments: it reads buffers of its caller's): returns (its outputs, written by every
        replay, and the replay function). Two untimed calls on the capture stream come first (cuBLAS handles,
        workspace, the caching allocator), as capture requires. Runs with ``device`` current, whatever the
        thread's current device is, and leaves the thread's current stream as it found it and joined to the capture
        stream, even when capture fails. Raises what the capture raised, after :meth:`_recover`."""
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
                # thread_local: a server's other threads may touch the host side meanwhile (never the device: every
                # capture runs at the compute gate)
                with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
                    outputs = call()
            except BaseException:
                self._recover(stream, device)
                raise
            finally:
                torch.cuda.set_stream(previous)  # a capture that raised leaves its stream current
                with contextlib.suppress(RuntimeError):  # joined on failure too (a broken stream cannot be)
                    previous.wait_stream(stream)
            self._recorded.add(graph)
            self.captures += 1
        return outputs, graph.replay

    def _recover(self, stream, device: torch.device) -> None:
        """After a failed capture: end the allocator's routing of new blocks into the pool, which torch leaves on
        when ending the capture itself raised, and check that the device serves ordinary work again. Where the
        stream still captures or the allocator refuses, :attr:`broken` says so and graphs go off in the process."""
        index = device.index if device.index is not None else torch.cuda.current_device()
        with contextlib.suppress(RuntimeError):  # raises "not currently recording" when torch ended it itself
            torch._C._cuda_endAllocateToPool(index, self._pool)
        try:
            with torch.cuda.stream(stream):
                capturing = torch.cuda.is_current_stream_capturing()
            if not capturing:
                torch.cuda.empty_cache()
        except RuntimeError as error:
            capturing, why = True, one_line(error)
        else:
            why = "the capture stream is still capturing"
        if capturing and CudaRecorder.broken is None:
            CudaRecorder.broken = f"a failed CUDA graph capture left torch's capture state unusable ({why})"
            print(f"note: {CudaRecorder.broken}; CUDA graphs are off in this process", flush=True)

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
    as :meth:`replay` takes them): they write what that call writes, where it writes it. ``attention`` "sdpa" is
    recorded with the SDPA kernels :func:`~packed_ss.models.native.sdpa_backends` allows (``backends``, by name)."""

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
        self.backends = sdpa_names(device) if attention == "sdpa" else None  # the SDPA kernels it may have used
        self._load(first)
        (self.out,), self._replay = recorder.record(  # the outputs' tuple: (logits or hidden states,)
            lambda: native(self.ids, self.positions, self.bias, cache, hidden_only, None, attention, self.gate,
                           self.slots)[:1],
            device)

    @property
    def bytes(self) -> int:
        """Device bytes this graph's own buffers hold (inputs and outputs; its kernels' temporaries live in the
        network's pool)."""
        return sum(t.nbytes for t in (self.index, self.bias, self.gate, self.out) if t is not None)

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

    @property
    def bytes(self) -> int:
        """Device bytes held: the cache tensor and its graphs' buffers."""
        return self.cache.tensor.nbytes + sum(getattr(graph, "bytes", 0) for graph in self.graphs.values())


class SpareCaches:
    """The network's caches that no adapter holds, with their graphs, newest last: at most ``limit`` of them and
    ``limit_bytes`` bytes (:attr:`RecordedCache.bytes`; the oldest go first, and their memory with them). A cache
    comes back through a queue, which a finalizer may fill from any thread at any moment (:meth:`give`, no lock
    taken); :meth:`take` and :meth:`clear` drain it under a lock of the instance's own."""

    making = threading.Lock()  # a network's first adapters may be made in two threads at once (never a finalizer)

    def __init__(self, limit: int = SPARE_CACHES, limit_bytes: int = SPARE_BYTES_HOST):
        self.limit, self.limit_bytes = limit, limit_bytes
        self._returned = queue.SimpleQueue()
        self._spare: list[RecordedCache] = []
        self._lock = threading.Lock()

    def give(self, recorded: RecordedCache) -> None:
        """Keep ``recorded`` for a later run (safe in a finalizer: it takes no lock)."""
        if recorded.graphs:
            self._returned.put(recorded)

    def take(self, capacity: int, wanted=()) -> RecordedCache | None:
        """The spare cache of ``capacity`` tokens holding most of the graph keys ``wanted`` (the newest among
        equals), taken out, or None."""
        wanted = set(wanted)
        with self._lock:
            self._drain()
            best = None
            for index in range(len(self._spare) - 1, -1, -1):
                spare = self._spare[index]
                if spare.capacity == capacity:
                    held = len(wanted & spare.graphs.keys())
                    if best is None or held > best[0]:
                        best = (held, index)
            return None if best is None else self._spare.pop(best[1])

    def clear(self) -> None:
        """Drop every spare cache (a capture failed or memory ran short)."""
        with self._lock:
            self._drain()
            self._spare.clear()

    def __len__(self) -> int:
        with self._lock:
            self._drain()
            return len(self._spare)

    @property
    def bytes(self) -> int:
        """Device bytes the spares hold."""
        with self._lock:
            self._drain()
            return sum(spare.bytes for spare in self._spare)

    def _drain(self) -> None:
        while True:
            try:
                self._spare.append(self._returned.get_nowait())
            except queue.Empty:
                break
        excess = len(self._spare) - self.limit
        if excess > 0:
            del self._spare[:excess]
        held = sum(spare.bytes for spare in self._spare)
        while self._spare and held > self.limit_bytes:
            held -= self._spare.pop(0).bytes


def spare_bytes(device: torch.device) -> int:
    """What a network's spare caches may hold on ``device``: 1/:data:`SPARE_FRACTION` of a CUDA device's memory,
    :data:`SPARE_BYTES_HOST` elsewhere (the CPU tests' recorders)."""
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_properties(device).total_memory // SPARE_FRACTION
    return SPARE_BYTES_HOST


def _spare_caches(model) -> SpareCaches:
    """The network's :class:`SpareCaches`, made on first use (once, whichever thread makes the first adapter)."""
    with SpareCaches.making:
        found = getattr(model, SPARE, None)
        if found is None:
            found = SpareCaches(limit_bytes=spare_bytes(next(model.parameters()).device))
            object.__setattr__(model, SPARE, found)
    return found


def _give_back(spares: SpareCaches, model, held: list) -> None:
    """A collected adapter's cache goes to the network's spares, unless graphs are off for the network (finalizer:
    it holds neither the adapter nor its calls, and takes no lock: a collection may run in a thread that holds
    any lock at all)."""
    if held and getattr(model, NATIVE_FAILURE, None) is None:
        spares.give(held.pop())


class GraphCalls(NativeCalls):
    """:class:`~packed_ss.models.native.NativeCalls` whose padded calls replay CUDA graphs instead of
    ``torch.compile`` (see the module docstring). Graphs belong to the cache they read: the adapter's current one,
    which may come with graphs from the network's spares (:class:`SpareCaches`).

    Attributes (besides :class:`~packed_ss.models.static.StaticCalls`'): ``shapes`` the (Rp, K) recorded on the
    current cache, in first-use order; ``compile_s`` seconds this adapter spent recording (untimed calls and
    captures); ``captures`` graphs this adapter recorded and ``replays`` calls it replayed; ``graph_attention``
    how its graphs attend (:data:`~packed_ss.models.native.ATTENTIONS`, default :data:`GRAPH_ATTENTION`; eager
    calls attend as :attr:`~packed_ss.models.native.NativeCalls.attention` says)."""

    recorder_class = CudaRecorder  # what records a call (tests on the CPU give one that keeps CUDA graphs' semantics)

    def __init__(self, model, hidden_only: bool, compiled: bool = False, compiler=None,
                 attention: str = GRAPH_ATTENTION):
        if attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
        self.graph_attention = attention  # recorded graphs (keyed by it); eager calls keep NativeCalls.attention
        self._graphs: dict[tuple, CallGraph] = {}  # the current cache's graphs: (Rp, K, hidden only, gated, attention)
        self._held: list[RecordedCache] = []  # the current cache and its graphs (to the spares when collected)
        self._wanted: dict[tuple, tuple] | None = None  # while rehearsing: shapes met without a graph, and inputs
        self.captures = self.replays = 0
        self._spares = _spare_caches(model)
        recorder = getattr(model, RECORDER, None)
        if type(recorder) is not self.recorder_class:
            recorder = self.recorder_class()
            object.__setattr__(model, RECORDER, recorder)
        recorder.adapters.add(self)
        self._recorder = recorder
        super().__init__(model, hidden_only, compiled, compiler)
        weakref.finalize(self, _give_back, self._spares, model, self._held).atexit = False  # nothing kept at exit

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
        """A cache of the run's capacity: a spare one of the network's, with its graphs (the one holding most of
        this adapter's current shapes), emptied, or a new one; the cache held before goes to the spares (a graph
        reads the cache tensor it was recorded on). ``keep``: tokens of the prefix carried over (the cache grew
        mid-run)."""
        capacity = -(-tokens // CAPACITY_STEP) * CAPACITY_STEP
        wanted = [(key[0], capacity, *key[2:]) for key in self._graphs]
        found = self._spares.take(capacity, wanted) if self.compiled else None
        if found is None:
            try:
                super()._allocate(tokens, keep)
            except torch.OutOfMemoryError:  # the spares' caches give their memory back first, then once more
                self._spares.clear()
                self._recorder.release()
                super()._allocate(tokens, keep)
            found = RecordedCache(self.cache)
        else:
            # stale keys of an earlier run (in float16 an overflowed one would turn a graph call's rows into NaN:
            # graphs attend over the whole capacity) go; the mask carries the length
            found.cache.tensor.zero_()
            if keep:
                found.cache.tensor[:, :, :, :keep] = self.cache.tensor[:, :, :, :keep]
            self.cache, self.capacity = found.cache, capacity
        if self._held and self.compiled:
            self._spares.give(self._held.pop())
        self._held[:] = [found]
        self._graphs = found.graphs

    def release_spares(self) -> None:
        """Drop the network's spare caches and their graphs (a call ran out of memory)."""
        self._spares.clear()
        self._recorder.release()

    gated_graphs = True  # calls with the drafter LoRA on replay graphs of their own (the gate a buffer)
    in_place = True  # every call writes its rows' keys and values into the cache (a graph mutates the buffer)

    def _key(self, total: int, hidden_only: bool, gated: bool) -> tuple:
        return total, self.capacity, bool(hidden_only), gated, self.graph_attention

    def _recordable(self, prepared) -> bool:
        (_, _, in_place), _, _, compiled, _ = prepared
        return compiled and in_place and self._usable()  # graphs record the in-place form only

    def _usable(self) -> bool:
        """Whether this adapter's calls may replay or record graphs now; a process whose capture state broke turns
        them off here (one line)."""
        if self._function is None or not self.compiled:
            return False
        broken = getattr(self._recorder, "broken", None)  # CudaRecorder's is the process's
        if broken is not None:
            self._give_up(RuntimeError(broken))
            return False
        return True

    def record(self, prepared: tuple, defer: bool = False) -> float:
        """Record the graph that the call :meth:`prepare` made will replay, where this cache has none: before the
        call's clock starts (the caller reports the time apart). While :meth:`rehearsing`, the shape is only noted
        and the call runs eagerly. Returns the seconds spent recording (0.0 when nothing was recorded)."""
        if not self._recordable(prepared):
            return 0.0
        (index, bias, _), _, total, _, gate = prepared
        key = self._key(total, defer, gate is not None)
        if key in self._graphs or key in self._recorder_refusals():
            return 0.0
        if self._wanted is not None:
            self._wanted.setdefault(key, (index.clone(), bias.clone(), None if gate is None else gate.clone()))
            return 0.0
        return self._record(key, (index, bias, gate))

    def _recorder_refusals(self) -> dict:
        """Shapes whose capture ran out of memory twice on this network (their calls run eagerly)."""
        refusals = getattr(self._recorder, "too_large", None)
        if refusals is None:
            refusals = {}
            self._recorder.too_large = refusals
        return refusals

    def _record(self, key: tuple, inputs: tuple) -> float:
        """Capture the graph of ``key`` on ``inputs`` into this cache's graphs; returns the seconds it took. Out of
        memory: the spares go and it is tried once more, then the shape runs eagerly; another failure turns graphs off
        for the network (every adapter's and spare's graphs go, and the pool's memory with them)."""
        start = time.perf_counter()
        total, _, hidden_only, _, attention = key
        failure = None
        for attempt in range(2):
            failure = None
            try:
                graph = CallGraph(self.native, self.cache.tensor, hidden_only, self._recorder, inputs, attention)
            except Exception as error:  # noqa: BLE001 - out of memory, an unrecordable operation: eager, one line
                failure = (out_of_memory(error), one_line(error))
            if failure is None or not failure[0] or attempt:
                break
            # outside the handler (its frames, and the tensors they hold, are gone): free the spares, once more
            self._spares.clear()
            self._recorder.release()
        seconds = time.perf_counter() - start
        self.compile_s += seconds
        if failure is None:
            while len(self._graphs) >= GRAPHS_PER_CACHE:  # the oldest graph goes, its buffers with it
                del self._graphs[next(iter(self._graphs))]
            self._graphs[key] = graph
            self.captures += 1
        elif failure[0] and CudaRecorder.broken is None:
            self._recorder_refusals()[key] = failure[1]
            self._recorder.release()
            self.budget_note = (f"out of GPU memory while recording the graph of {total} rows over {key[1]} cached "
                                f"keys ({failure[1]}): those calls run eagerly")
            warnings.warn(self.budget_note, RuntimeWarning, stacklevel=4)
        else:
            why = CudaRecorder.broken or failure[1]
            self._give_up(RuntimeError(f"recording the graph of {total} rows failed: {why}"))
            for adapter in list(self._recorder.adapters):  # every adapter's graphs: the pool's memory goes
                adapter._graphs.clear()
            self._spares.clear()  # and the spare caches' graphs, with the caches
            self._recorder.release()
        return seconds

    @contextlib.contextmanager
    def rehearsing(self):
        """Within the block, calls without a graph run eagerly and only note their shape and inputs; on leaving, every
        shape noted is recorded, the largest first (later, smaller captures reuse the pool's memory). What
        :func:`packed_ss.engine.decode` runs before a run's clock starts. Yields nothing."""
        self._wanted = {}
        try:
            yield
        finally:
            wanted, self._wanted = self._wanted, None
        for key in sorted(wanted, key=lambda key: (-key[0], key)):
            if self.compiled and key[1] == self.capacity and key not in self._graphs:
                self._record(key, wanted[key])

    def _compiled_call(self, inputs, total: int, variant=None):
        return self._replayed(inputs, total, None)

    def _gated_call(self, inputs, total: int, gate: torch.Tensor):
        return self._replayed(inputs, total, gate)

    def _replayed(self, inputs, total: int, gate: torch.Tensor | None):
        """The call replayed from its graph, or None: run it eagerly (no graph: :meth:`record` was not called or
        could not record it, or a rehearsal noted the shape)."""
        index, bias, cache, hidden_only, in_place = inputs
        if not in_place or not self._usable():
            return None
        graph = self._graphs.get(self._key(total, hidden_only, gate is not None))
        if graph is None:
            return None
        self.replays += 1
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
                if capacity != self.capacity or hidden_only or gated or attention != self.graph_attention:
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
