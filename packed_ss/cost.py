"""Per-call cost of a model on this machine: tau + delta * rows + mu * keys + kappa * rows * keys milliseconds
(fitted from a few timed calls; keys = the tokens a call's rows attend to: its cached prefix and its own rows).

Schedules that size their calls from the cost (the partial-branch schedule picks how many branches a call
prepares) read :func:`call_cost`; it is measured once per model object and cached on it. A server predicts a
request's time from it (:func:`serve.limits.worst_case_seconds`).
"""

from __future__ import annotations

import statistics
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
class Roofline:
    """What this machine's arithmetic and memory allow one call, measured once per network.

    Attributes:
        flops_per_row: FLOPs one row costs in the weight matrices (2 per multiply-add, LM head included; the
            embedding lookup and attention over the cache, which grows with the context, left out).
        weight_bytes: bytes of those matrices, read once by every call whatever its row count (a head tied to the
            embeddings counted once: the lookup reads a few rows, the head all of them).
        gflops: measured matrix-multiply throughput (GFLOP/s) of a large square product in the model's dtype.
        read_gbs: measured read bandwidth (GB/s): one reduction over a buffer the size of the weights, at most
            :data:`READ_BUFFER_BYTES` (large enough to leave every cache; what a row-count-1 call's GEMVs do).
    """

    flops_per_row: float
    weight_bytes: int
    gflops: float
    read_gbs: float

    @property
    def compute_ms_per_row(self) -> float:
        """The compute limit: milliseconds of arithmetic per row at the measured GFLOP/s."""
        return self.flops_per_row / (self.gflops * 1e9) * 1000

    @property
    def read_ms(self) -> float:
        """The weight-read limit: milliseconds to read every weight once at the measured bandwidth."""
        return self.weight_bytes / (self.read_gbs * 1e9) * 1000

    def ms(self, rows: int) -> float:
        """The fastest a call of ``rows`` rows can be: the larger of its arithmetic and one read of the weights."""
        return max(rows * self.compute_ms_per_row, self.read_ms)


READ_BUFFER_BYTES = 1 << 30  # the bandwidth probe's largest buffer: beyond every cache, and an 8B model's weights
# are not allocated a second time beside them


def read_elements(weights: int, element_size: int) -> int:
    """Elements of the bandwidth probe's buffer for ``weights`` weight elements of ``element_size`` bytes: the
    weights' size, at least 1 Mi elements and at most :data:`READ_BUFFER_BYTES`."""
    return max(1 << 20, min(weights, READ_BUFFER_BYTES // element_size))


def roofline(model, repeats: int = 5) -> Roofline:
    """The :class:`Roofline` of ``model``'s network on this machine (median of ``repeats`` timings each), cached
    on the network as ``roofline_fit``.

    Raises: ValueError for a model without a network (scripted test models) and when the device has no memory
    left for the probes (one line; the caller reports no floor rather than losing its run)."""
    import time

    import torch

    network = getattr(model, "model", None)
    if network is None:
        raise ValueError("the roofline needs a transformers network")
    found = getattr(network, "roofline_fit", None)
    if found is not None:
        return found
    embeddings = network.get_input_embeddings().weight
    head = network.get_output_embeddings()
    tied = head is not None and head.weight is embeddings  # then parameters() yields the shared matrix once
    matrices = [p for p in network.parameters() if p.dim() == 2 and (tied or p is not embeddings)]
    weights = sum(p.numel() for p in matrices)
    dtype, device = matrices[0].dtype, matrices[0].device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def timed(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    size = 1024
    try:
        a, b = torch.randn(size, size, dtype=dtype, device=device), torch.randn(size, size, dtype=dtype, device=device)
        gflops = 2 * size ** 3 / timed(lambda: a @ b) / 1e9
        del a, b
        buffer = torch.ones(read_elements(weights, matrices[0].element_size()), dtype=dtype, device=device)
        read_gbs = buffer.numel() * buffer.element_size() / timed(buffer.sum) / 1e9
        del buffer
    except RuntimeError:  # out of memory: torch.OutOfMemoryError on CUDA, a plain RuntimeError from the CPU allocator
        raise ValueError(f"no {device.type} memory left to measure the machine's limits beside the model") from None
    fit = Roofline(2.0 * weights, weights * matrices[0].element_size(), gflops, read_gbs)
    network.roofline_fit = fit
    return fit
