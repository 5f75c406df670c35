"""Per-call cost of a model on this machine: tau + delta * rows + mu * keys + kappa * rows * keys milliseconds
(fitted from a few timed calls; keys = the tokens a call's rows attend to: its cached prefix and its own rows).

Schedules that size their calls from the cost (the partial-branch schedule picks how many branches a call
prepares) read :func:`call_cost`; it is measured once per model object and cached on it. A server predicts a
request's time from it (:func:`serve.limits.worst_case_seconds`).

What the machine allows a call is :class:`Roofline` (:func:`roofline`): the floor of a call of R rows is the larger
of its arithmetic (R rows at the measured GFLOP/s) and one read of the weights (at the measured bandwidth), each
probe timed with CUDA events on CUDA (a large product and a read several times the L2) and with the host clock
elsewhere, and the datasheet's peaks beside the measured ones where the device is known (:data:`SPEC_PEAKS`).
"""

from __future__ import annotations

import os
import re
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager, nullcontext
from dataclasses import dataclass

import numpy as np

PROBE_ROWS = (1, 8, 24, 48)  # rows of the timed calls after the short prefix (the compiled path's shapes too)
PROBE_PREFIX = 64  # cached tokens the timed calls attend to
KEY_PROBE_ROWS = (1, 48, 192)  # rows of the eager calls that measure the cost of keys ...
KEY_PROBE_PREFIXES = (64, 1024)  # ... after these prefixes (the longer one capped by the model's positions)
PROBE_REPEATS = 5  # calls per row count (the median is kept)


@dataclass(frozen=True)
class CallCost:
    """Fitted cost of one call: ``tau_ms + delta_ms * rows + mu_ms * keys + kappa_ms * rows * keys`` milliseconds.

    ``mu_ms``: milliseconds per attended key whatever the rows (reading the cache); ``kappa_ms``: per row and key
    (attention of every row over a long prompt, or of a call of many rows over itself). Both 0 where the fit found
    no growth with the keys (and for fits made before they were measured).
    """

    tau_ms: float
    delta_ms: float
    kappa_ms: float = 0.0
    mu_ms: float = 0.0

    def ms(self, rows: int, keys: int = 0) -> float:
        """Milliseconds of a call of ``rows`` rows attending to ``keys`` keys each (0: the keys left out)."""
        return self.tau_ms + self.delta_ms * rows + self.mu_ms * keys + self.kappa_ms * rows * keys


def call_cost(model, fresh: bool = False, turn: Callable[[], ContextManager] = nullcontext) -> CallCost:
    """The model's :class:`CallCost`, measured on first use and cached on the network (``model.model``, so every
    :meth:`share` of it reuses the fit; on ``model`` itself when it has none) as ``call_cost_fit``
    (``call_cost_fit_compiled`` for compiled calls, whose fit differs). Leaves the model's cache empty.

    Eager calls: a least-squares fit through the median model time of calls of :data:`KEY_PROBE_ROWS` causal rows
    after each of :data:`KEY_PROBE_PREFIXES` and of :data:`PROBE_ROWS` after :data:`PROBE_PREFIX` (about 50 calls).
    Compiled calls: tau and delta from :data:`PROBE_ROWS` after :data:`PROBE_PREFIX` (the shapes a run meets), the
    cost of keys from the eager fit (the same arithmetic; no further shapes compiled).
    A model without real timings (all model times 0, as scripted test models) gets tau = 1 ms, delta = 0.
    ``fresh``: measure again even when a fit is cached (and cache the new one). ``turn``: held around each call (a
    server's compute-gate turn, so that other requests compute between the probe's calls and never during one).
    """
    holder = getattr(model, "model", None) or model
    compiled = getattr(model, "compiled", False)
    key = "call_cost_fit_compiled" if compiled else "call_cost_fit"  # one fit per path
    found = None if fresh else getattr(holder, key, None)
    if found is not None:
        return found
    points = _probe(model, PROBE_PREFIX, PROBE_ROWS, turn)  # (rows, keys, median ms)
    if compiled:
        eager = call_cost(model.share(compiled=False), turn=turn)
        fit = _fit(points, keys=False)
        fit = CallCost(fit.tau_ms, fit.delta_ms, eager.kappa_ms, eager.mu_ms)
    else:
        longest = max(PROBE_PREFIX, getattr(model, "max_length", 10 ** 9) - max(KEY_PROBE_ROWS) - 1)
        for prefix in sorted({min(p, longest) for p in KEY_PROBE_PREFIXES}):
            points += _probe(model, prefix, KEY_PROBE_ROWS, turn)
        fit = _fit(points)
    fit = fit if max(ms for _, _, ms in points) > 0 else CallCost(1.0, 0.0)
    setattr(holder, key, fit)
    return fit


def warm_probe(model) -> None:
    """The calls :func:`call_cost` times, untimed: on compiled calls they compile the probe's shapes (the slow part,
    which a server runs away from its compute gate); leaves the model's cache empty."""
    _probe(model, PROBE_PREFIX, PROBE_ROWS)


def _probe(model, prefix: int, row_counts, turn: Callable[[], ContextManager] = nullcontext
           ) -> list[tuple[int, int, float]]:
    """``(rows, keys, median model ms)`` of :data:`PROBE_REPEATS` calls of each of ``row_counts`` causal rows after a
    ``prefix``-token cached prefix, each call inside ``turn()``; keys are the prefix and the call's rows, or a static
    cache's whole capacity (what its calls attend over). Leaves the model's cache empty."""
    from packed_ss.layout import prefill_layout, verify_layout

    never = set(getattr(model, "never_emit_ids", (model.mask_token_id,)))
    filler = next(t for t in range(1, model.vocab_size) if t not in never)
    model.reset(prefix + max(row_counts))  # a static cache sized for the longest call
    first = prefill_layout([filler] * prefix, 0, model.mask_token_id)
    with turn():
        model.forward(first, first.verify_rows)
    model.rollback(prefix - 1)
    static = getattr(model, "static", None)  # a static cache's calls attend over its whole capacity
    out = []
    for rows in row_counts:
        layout = verify_layout([filler], [filler] * (rows - 1), prefix - 1)
        times = []
        for _ in range(PROBE_REPEATS):
            with turn():
                times.append(model.forward(layout, layout.verify_rows).model_ms)
            model.rollback(prefix - 1)
        out.append((rows, static.capacity if static else prefix + rows, statistics.median(times)))
    model.reset()
    return out


def _fit(points: list[tuple[int, int, float]], keys: bool = True) -> CallCost:
    """Least squares ``ms = tau + delta * rows (+ mu * keys + kappa * rows * keys)`` over ``(rows, keys, ms)``
    points; a term whose coefficient comes out negative (noise) is dropped and the rest refitted. tau is at least
    1e-3 ms."""
    rows = np.array([r for r, _, _ in points], dtype=float)
    seen = np.array([k for _, k, _ in points], dtype=float)
    ms = np.array([m for _, _, m in points], dtype=float)
    columns = {"delta_ms": rows, "mu_ms": seen, "kappa_ms": rows * seen} if keys else {"delta_ms": rows}
    while True:
        design = np.stack([np.ones_like(rows), *columns.values()], 1)
        tau, *rest = np.linalg.lstsq(design, ms, rcond=None)[0]
        found = dict(zip(columns, rest))
        negative = [name for name, value in found.items() if value < 0]
        if not negative:
            break
        del columns[min(negative, key=lambda name: found[name])]
    return CallCost(max(float(tau), 1e-3), *(float(found.get(name, 0.0)) for name in ("delta_ms", "kappa_ms", "mu_ms")))


@dataclass(frozen=True)
class SpecPeak:
    """A device's datasheet peaks: dense bfloat16 arithmetic (TFLOP/s, without 2:4 sparsity) and memory bandwidth
    (GB/s)."""

    tflops_bf16: float
    memory_gbs: float


# Datasheet peaks by the name torch reports (``torch.cuda.get_device_name``), the most specific first: "H100 PCIe"
# before "H100". A key matches as a whole word, so "L4" is not "L40S" and "H200" is not "GH200".
SPEC_PEAKS = (
    ("H100 PCIe", SpecPeak(756.0, 2000.0)),
    ("H100 NVL", SpecPeak(835.0, 3900.0)),
    ("H100", SpecPeak(989.0, 3350.0)),  # SXM: "NVIDIA H100 80GB HBM3"
    ("H200 NVL", SpecPeak(835.0, 4800.0)),
    ("H200", SpecPeak(989.0, 4800.0)),
    ("A100-SXM4-80GB", SpecPeak(312.0, 2039.0)),
    ("A100 80GB PCIe", SpecPeak(312.0, 1935.0)),
    ("A100", SpecPeak(312.0, 1555.0)),  # the 40 GB boards, SXM4 and PCIe
    ("L40S", SpecPeak(362.0, 864.0)),
    ("L4", SpecPeak(121.0, 300.0)),
    ("A10G", SpecPeak(70.0, 600.0)),  # AWS's variant of the A10, with fewer tensor FLOP/s than the A10's 125
)


def spec_peak(name: str) -> SpecPeak | None:
    """The datasheet peaks of the device called ``name`` (as torch reports it), or None for a device not in
    :data:`SPEC_PEAKS` (CPUs included)."""
    for key, peak in SPEC_PEAKS:
        if re.search(rf"(?<![\w-]){re.escape(key)}(?!\w)", name):
            return peak
    return None


@dataclass(frozen=True)
class Roofline:
    """What this machine's arithmetic and memory allow one call, measured once per network.

    Attributes:
        flops_per_row: FLOPs one row costs in the weight matrices (2 per multiply-add, LM head included; the
            embedding lookup and attention over the cache, which grows with the context, left out).
        weight_bytes: bytes of those matrices, read once by every call whatever its row count (a head tied to the
            embeddings counted once: the lookup reads a few rows, the head all of them).
        gflops: measured matrix-multiply throughput (GFLOP/s) of a large square product in the model's dtype
            (:func:`probe_sizes`; CUDA events on CUDA, the host clock elsewhere).
        read_gbs: measured read bandwidth (GB/s): a reduction over a buffer on CUDA several times the L2 (multi-GiB
            where memory allows), elsewhere the weights' size (:func:`probe_sizes`).
        spec_gflops: the datasheet's dense bfloat16 GFLOP/s of the device (:data:`SPEC_PEAKS`) for a 16-bit model,
            else None (an unknown device, a CPU, another dtype).
        spec_read_gbs: the datasheet's memory bandwidth (GB/s), or None for a device not in the table.
    """

    flops_per_row: float
    weight_bytes: int
    gflops: float
    read_gbs: float
    spec_gflops: float | None = None
    spec_read_gbs: float | None = None

    @property
    def compute_ms_per_row(self) -> float:
        """The compute limit: milliseconds of arithmetic per row at the measured GFLOP/s."""
        return self.flops_per_row / (self.gflops * 1e9) * 1000

    @property
    def read_ms(self) -> float:
        """The weight-read limit: milliseconds to read every weight once at the measured bandwidth."""
        return self.weight_bytes / (self.read_gbs * 1e9) * 1000

    @property
    def crossover_rows(self) -> float:
        """Rows at which a call's arithmetic takes as long as its weight read: below, the read is the floor;
        above, the arithmetic."""
        return self.read_ms / self.compute_ms_per_row

    def ms(self, rows: int) -> float:
        """The floor of a call of ``rows`` rows (ms): the larger of its arithmetic and one read of the weights."""
        return max(rows * self.compute_ms_per_row, self.read_ms)

    def over(self, ms: float, rows: int) -> float:
        """How many times its floor (:meth:`ms`) a call of ``rows`` rows that took ``ms`` milliseconds took."""
        return ms / self.ms(rows)


READ_BUFFER_BYTES = 1 << 30  # the CPU's bandwidth probe's largest buffer: beyond every cache, and an 8B model's
# weights are not allocated a second time beside them
CUDA_GEMM_SIDES = (8192, 4096, 2048, 1024)  # CUDA product n x n x n, the largest that fits: 2 * 8192^3 = 1.1 TFLOP,
# about 1.1-1.5 ms on an H100 or H200, so the 5-20 us of a launch are noise
CUDA_FLOAT64_SIDE = 2048  # float64's product: 17 GFLOP, under 20 ms at the 1 TFLOP/s of a device without FP64 units
CPU_GEMM_SIDE = 1024  # the CPU's product: 2 GFLOP, tens of ms on one core, which the host clock times well
CUDA_READ_BYTES = 4 << 30  # CUDA read probe: 4 GiB, over 60x an H100's or H200's 50-60 MB L2 (about 1 ms)
MIN_READ_OVER_L2 = 4  # the CUDA read is at least this many times the L2, or it measures the L2
UNKNOWN_L2_BYTES = 64 << 20  # what an L2 of unreported size is taken to be (the largest on these devices)
PROBE_MEMORY_SHARE = 0.5  # the probes take at most this share of the memory free beside the model
CUDA_RUNS = 10  # products or reads between one pair of CUDA events (one timing)


def read_elements(weights: int, element_size: int) -> int:
    """Elements of the CPU's bandwidth probe's buffer for ``weights`` weight elements of ``element_size`` bytes: the
    weights' size, at least 1 Mi elements and at most :data:`READ_BUFFER_BYTES`."""
    return max(1 << 20, min(weights, READ_BUFFER_BYTES // element_size))


@dataclass(frozen=True)
class ProbeSizes:
    """Sizes of the probes of :func:`roofline`: ``gemm_side`` n of the n x n x n product, ``read_elements`` of the
    buffer the bandwidth probe reduces, ``runs`` of each between the clock's two readings."""

    gemm_side: int
    read_elements: int
    runs: int


def probe_sizes(device_type: str, weights: int, element_size: int, free_bytes: int | None,
                l2_bytes: int | None = None) -> ProbeSizes:
    """The probes' sizes on a device of ``device_type`` for a model of ``weights`` weight elements of
    ``element_size`` bytes, each probe within :data:`PROBE_MEMORY_SHARE` of ``free_bytes`` (None: no bound).

    CUDA: the largest of :data:`CUDA_GEMM_SIDES` whose three matrices fit (at most :data:`CUDA_FLOAT64_SIDE` in
    8-byte elements, whose arithmetic is slow on most devices), and a read of :data:`CUDA_READ_BYTES`
    or what fits, at least :data:`MIN_READ_OVER_L2` times ``l2_bytes`` (None or 0: :data:`UNKNOWN_L2_BYTES`), whatever
    the model's size; :data:`CUDA_RUNS` runs per timing. Elsewhere: a :data:`CPU_GEMM_SIDE` product and a read of the
    weights' size (:func:`read_elements`), one run per timing (the host clock).

    Raises: ValueError (one line) when the smallest probe does not fit in the share of ``free_bytes``."""
    room = None if free_bytes is None else int(free_bytes * PROBE_MEMORY_SHARE)
    fits = (lambda nbytes: True) if room is None else (lambda nbytes: nbytes <= room)
    if device_type == "cuda":
        sides = [n for n in CUDA_GEMM_SIDES if fits(3 * n * n * element_size)
                 and (element_size < 8 or n <= CUDA_FLOAT64_SIDE)]
        least = MIN_READ_OVER_L2 * (l2_bytes or UNKNOWN_L2_BYTES)
        read = CUDA_READ_BYTES if room is None else min(CUDA_READ_BYTES, room)
        if not sides or read < least:
            raise ValueError(f"no cuda memory left to measure the machine's limits beside the model ("
                             f"{(free_bytes or 0) / 2 ** 20:.0f} MiB free; a read of {least / 2 ** 20:.0f} MiB needed)")
        return ProbeSizes(sides[0], read // element_size, CUDA_RUNS)
    elements = read_elements(weights, element_size)
    if room is not None:
        elements = min(elements, room // element_size)
    if not fits(3 * CPU_GEMM_SIDE ** 2 * element_size) or elements < 1 << 20:
        raise ValueError(f"no {device_type} memory left to measure the machine's limits beside the model "
                         f"({(free_bytes or 0) / 2 ** 20:.0f} MiB free)")
    return ProbeSizes(CPU_GEMM_SIDE, elements, 1)


def host_seconds(fn: Callable[[], object], repeats: int, runs: int, device=None) -> float:
    """Seconds of one call of ``fn`` on the host clock: the median over ``repeats`` timings of ``runs`` calls, after
    one untimed call (``device``: unused; the signature :func:`probe_timer` picks from)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(runs):
            fn()
        times.append((time.perf_counter() - start) / runs)
    return statistics.median(times)


def cuda_event_seconds(fn: Callable[[], object], repeats: int, runs: int, device) -> float:
    """Seconds of one call of ``fn``'s device work on ``device``: CUDA events around ``runs`` calls queued back to
    back, the median over ``repeats`` timings, after one untimed call (neither launches nor the host's
    synchronisation count, as they do on the host clock)."""
    import torch

    with torch.cuda.device(device):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(runs):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000 / runs)  # elapsed_time: ms
    return statistics.median(times)


def probe_timer(device) -> Callable[..., float]:
    """The clock of the probes on ``device`` (anything with a ``type``): :func:`cuda_event_seconds` on CUDA,
    :func:`host_seconds` elsewhere (where the host clock is the device's)."""
    return cuda_event_seconds if device.type == "cuda" else host_seconds


def free_memory_bytes(device) -> int | None:
    """Bytes free for new tensors on ``device``: on CUDA the driver's free memory and what torch's allocator holds
    unused; on a Linux host its available pages; None where unknown (no bound)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _product_gflops(sizes: ProbeSizes, dtype, device, timed: Callable[..., float], repeats: int) -> float:
    """GFLOP/s of the ``sizes.gemm_side`` cubed product in ``dtype`` on ``device``, on the clock ``timed``."""
    import torch

    n = sizes.gemm_side
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    product = torch.empty(n, n, dtype=dtype, device=device)
    return 2 * n ** 3 / timed(lambda: torch.matmul(a, b, out=product), repeats, sizes.runs, device) / 1e9


def _read_gbs(sizes: ProbeSizes, dtype, device, timed: Callable[..., float], repeats: int) -> float:
    """GB/s of a sum over ``sizes.read_elements`` elements of ``dtype`` on ``device``, on the clock ``timed``."""
    import torch

    buffer = torch.ones(sizes.read_elements, dtype=dtype, device=device)
    return buffer.numel() * buffer.element_size() / timed(buffer.sum, repeats, sizes.runs, device) / 1e9


def roofline(model, repeats: int = 5, fresh: bool = False) -> Roofline:
    """The :class:`Roofline` of ``model``'s network on this machine (median of ``repeats`` timings each,
    :func:`probe_timer`'s clock, :func:`probe_sizes`' sizes), cached on the network as ``roofline_fit``
    (``fresh``: measured again, and cached, even when one is).

    Raises: ValueError for a model without a network (scripted test models) and when the device has no memory
    left for the probes (one line; the caller reports no floor rather than losing its run)."""
    import torch

    network = getattr(model, "model", None)
    if network is None:
        raise ValueError("the roofline needs a transformers network")
    found = None if fresh else getattr(network, "roofline_fit", None)
    if found is not None:
        return found
    embeddings = network.get_input_embeddings().weight
    head = network.get_output_embeddings()
    tied = head is not None and head.weight is embeddings  # then parameters() yields the shared matrix once
    matrices = [p for p in network.parameters() if p.dim() == 2 and (tied or p is not embeddings)]
    weights = sum(p.numel() for p in matrices)
    dtype, device = matrices[0].dtype, matrices[0].device
    size = matrices[0].element_size()
    timed = probe_timer(device)
    peak, l2 = None, None
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        peak, l2 = spec_peak(properties.name), getattr(properties, "L2_cache_size", None)
    try:
        sizes = probe_sizes(device.type, weights, size, free_memory_bytes(device), l2)
        gflops = _product_gflops(sizes, dtype, device, timed, repeats)
        read_gbs = _read_gbs(sizes, dtype, device, timed, repeats)
    except RuntimeError:  # out of memory: torch.OutOfMemoryError on CUDA, a plain RuntimeError from the CPU allocator
        raise ValueError(f"no {device.type} memory left to measure the machine's limits beside the model") from None
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the probes' buffers go back to the device, not to this process's cache
    half = dtype in (torch.bfloat16, torch.float16)
    fit = Roofline(2.0 * weights, weights * size, gflops, read_gbs,
                   spec_gflops=peak.tflops_bf16 * 1000 if peak and half else None,
                   spec_read_gbs=peak.memory_gbs if peak else None)
    network.roofline_fit = fit
    return fit
