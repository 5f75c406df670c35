"""Per-call cost of a model on this machine: tau + delta * rows milliseconds (fitted from a few timed calls).

Schedules that size their calls from the cost (the partial-branch schedule picks how many branches a call
prepares) read :func:`call_cost`; it is measured once per model object and cached on it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

PROBE_ROWS = (1, 8, 24, 48)  # rows of the timed calls
PROBE_PREFIX = 64  # cached tokens the timed calls attend to
PROBE_REPEATS = 5  # calls per row count (the median is kept)


@dataclass(frozen=True)
class CallCost:
    """Fitted cost of one call: ``tau_ms + delta_ms * rows`` milliseconds."""

    tau_ms: float
    delta_ms: float

    def ms(self, rows: int) -> float:
        return self.tau_ms + self.delta_ms * rows


def call_cost(model) -> CallCost:
    """The model's :class:`CallCost`: a least-squares line through the median model time of calls of
    :data:`PROBE_ROWS` causal rows after a :data:`PROBE_PREFIX`-token prefix (about 20 calls), measured on
    first use and cached on the network (``model.model``, so every :meth:`share` of it reuses the fit; on
    ``model`` itself when it has none) as ``call_cost_fit`` (``call_cost_fit_compiled`` for compiled calls, whose
    fit differs). Leaves the model's cache empty.

    A model without real timings (all model times 0, as scripted test models) gets tau = 1 ms, delta = 0.
    """
    holder = getattr(model, "model", None) or model
    key = "call_cost_fit_compiled" if getattr(model, "compiled", False) else "call_cost_fit"  # one fit per path
    found = getattr(holder, key, None)
    if found is not None:
        return found
    from packed_ss.layout import prefill_layout, verify_layout

    never = set(getattr(model, "never_emit_ids", (model.mask_token_id,)))
    filler = next(t for t in range(1, model.vocab_size) if t not in never)
    model.reset()
    first = prefill_layout([filler] * PROBE_PREFIX, 0, model.mask_token_id)
    model.forward(first, first.verify_rows)
    model.rollback(PROBE_PREFIX - 1)
    medians = []
    for rows in PROBE_ROWS:
        layout = verify_layout([filler], [filler] * (rows - 1), PROBE_PREFIX - 1)
        times = []
        for _ in range(PROBE_REPEATS):
            times.append(model.forward(layout, layout.verify_rows).model_ms)
            model.rollback(PROBE_PREFIX - 1)
        medians.append(statistics.median(times))
    model.reset()
    delta, tau = np.polyfit(np.array(PROBE_ROWS, dtype=float), np.array(medians), 1)
    fit = CallCost(max(float(tau), 1e-3), max(float(delta), 0.0)) if max(medians) > 0 else CallCost(1.0, 0.0)
    setattr(holder, key, fit)
    return fit


@dataclass(frozen=True)
class Roofline:
    """What this machine's arithmetic and memory allow one call, measured once per network.

    Attributes:
        flops_per_row: FLOPs one row costs in the weight matrices (2 per multiply-add, LM head included; the
            embedding lookup and attention over the cache, which grows with the context, left out).
        weight_bytes: bytes of those matrices, read once by every call whatever its row count.
        gflops: measured matrix-multiply throughput (GFLOP/s) of a large square product in the model's dtype.
        read_gbs: measured read bandwidth (GB/s) over a buffer the size of the weights.
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


def roofline(model, repeats: int = 5) -> Roofline:
    """The :class:`Roofline` of ``model``'s network on this machine (median of ``repeats`` timings each), cached
    on the network as ``roofline_fit``. A model without a network (scripted test models) raises ValueError."""
    import time

    import torch

    network = getattr(model, "model", None)
    if network is None:
        raise ValueError("the roofline needs a transformers network")
    found = getattr(network, "roofline_fit", None)
    if found is not None:
        return found
    embeddings = network.get_input_embeddings().weight
    matrices = [p for p in network.parameters() if p.dim() == 2 and p is not embeddings]
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
    a, b = torch.randn(size, size, dtype=dtype, device=device), torch.randn(size, size, dtype=dtype, device=device)
    gflops = 2 * size ** 3 / timed(lambda: a @ b) / 1e9
    buffer = torch.ones(max(weights, 1 << 20), dtype=dtype, device=device)
    read_gbs = buffer.numel() * buffer.element_size() / timed(buffer.sum) / 1e9
    fit = Roofline(2.0 * weights, weights * matrices[0].element_size(), gflops, read_gbs)
    network.roofline_fit = fit
    return fit
