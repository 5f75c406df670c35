"""Eager and compiled calls against the machine's limits: one chart of call cost against rows, and its text.

The fits are :class:`packed_ss.cost.CallCost` (tau + delta * rows, measured by :func:`packed_ss.cost.call_cost`
on each path); the limits are :class:`packed_ss.cost.Roofline` (the arithmetic of the rows at the measured
GFLOP/s, and one read of every weight at the measured bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from components.charts import LOG_TICKS
from components.theme import themed
from packed_ss.cost import KEY_PROBE_ROWS, PROBE_ROWS

CHART_HEIGHT = 380  # px
ROWS = (1, 2, 4, 8, 16, 32, 64, 128)  # row counts the chart spans (AR's 1 to Quadratic-SS's B(B+1) at small B)
COLORS = {"eager": "#1f77b4", "compiled": "#2ca02c", "limit": "#7f7f7f"}
# The most rows of a call each path's fit measured (packed_ss.cost: eager calls up to KEY_PROBE_ROWS, compiled
# calls at PROBE_ROWS' shapes): beyond them a fit is an extrapolation.
MEASURED_ROWS = {"eager": max(KEY_PROBE_ROWS), "compiled": max(PROBE_ROWS)}


@dataclass(frozen=True)
class BeatenLimit:
    """A measured call below the machine limit drawn beside it: ``path``'s fit at ``rows`` rows (within the rows it
    was measured at) took ``fit_ms``, under the limit's ``limit_ms``."""

    path: str
    rows: int
    fit_ms: float
    limit_ms: float


def beaten_limits(eager, compiled, roof) -> tuple[BeatenLimit, ...]:
    """Where a fit, over the row counts it was measured at (:data:`MEASURED_ROWS`), lies below the machine limit
    ``roof`` (none without a limit). A limit is a floor only when nothing measured beats it: the chart and the
    text then say it cannot be beaten; else they say it was beaten, and by what."""
    if roof is None:
        return ()
    return tuple(BeatenLimit(name, r, fit.ms(r), roof.ms(r))
                 for name, fit in (("eager", eager), ("compiled", compiled)) if fit is not None
                 for r in ROWS if r <= MEASURED_ROWS[name] and fit.ms(r) < roof.ms(r))


def paths_figure(eager, compiled, roof) -> go.Figure:
    """Milliseconds per call against rows (log-log): the eager and compiled fits and the machine's limit. A fit is
    drawn solid over the row counts it was measured at (:data:`MEASURED_ROWS`) and dashed beyond them, where it is
    an extrapolation and never drawn below the machine's limit (no call can be faster than that), unless measured
    calls beat the limit (:func:`beaten_limits`): the limit is then labelled as beaten, and nothing is raised to it."""
    beaten = beaten_limits(eager, compiled, roof)
    traces = []
    for name, fit in (("eager", eager), ("compiled", compiled)):
        if fit is None:
            continue
        top = MEASURED_ROWS[name]
        inside = [r for r in ROWS if r <= top]
        outside = [r for r in ROWS if r >= inside[-1]] if inside[-1] < ROWS[-1] else []
        traces.append(dict(type="scatter", mode="lines+markers", name=f"{name} calls (fit, 1-{top} rows measured)",
                           x=inside, y=[fit.ms(r) for r in inside], line=dict(color=COLORS[name], width=2),
                           hovertemplate=f"{name}<br>%{{x}} rows: %{{y:.3f}} ms<extra></extra>"))
        if outside:
            floor = (lambda r: roof.ms(r)) if roof is not None and not beaten else (lambda r: 0.0)
            kept = ", never below the limit" if roof is not None and not beaten else ""
            traces.append(dict(type="scatter", mode="lines",
                               name=f"{name} calls beyond {top} rows (extrapolated{kept})",
                               x=outside, y=[max(fit.ms(r), floor(r)) for r in outside],
                               line=dict(color=COLORS[name], width=2, dash="dot"),
                               hovertemplate=f"{name}, extrapolated<br>%{{x}} rows: %{{y:.3f}} ms<extra></extra>"))
    if roof is not None:
        label = "machine limit as probed (beaten by measured calls: see the text)" if beaten else "machine limit"
        traces.append(dict(type="scatter", mode="lines", name=label, x=list(ROWS),
                           y=[roof.ms(r) for r in ROWS], line=dict(color=COLORS["limit"], width=2, dash="dash"),
                           hovertemplate="limit<br>%{x} rows: %{y:.3f} ms<extra></extra>"))
    layout = dict(title=dict(text="Call cost against rows: eager, compiled, and what the machine allows", x=0.01),
                  height=CHART_HEIGHT, margin=dict(l=60, r=10, t=50, b=50),
                  xaxis=dict(title=dict(text="rows in the call"), type="log", tickvals=list(ROWS)),
                  # Labels on 1-2-5 steps written out in full, as the cost chart above it
                  yaxis=dict(title=dict(text="ms per call (log scale)"), type="log", tickmode="array",
                             tickvals=LOG_TICKS, ticktext=[f"{v:g}" for v in LOG_TICKS]))
    return themed(go.Figure(dict(data=traces, layout=layout)))


def paths_summary(eager, compiled, roof, note: str | None = None) -> str:
    """Markdown: the two fits, the limits, and what separates them."""
    rows = ["| path | τ (ms per call) | δ (ms per row) | 1-row call (ms) |", "|---|---|---|---|"]
    for name, fit in (("eager", eager), ("compiled", compiled)):
        if fit is not None:
            rows.append(f"| {name} | {fit.tau_ms:.3f} | {fit.delta_ms:.4f} | {fit.ms(1):.3f} |")
    text = "\n".join(rows)
    if compiled is None:
        text += f"\n\nNo compiled fit: {note or 'compiled calls are not available for this model'}."
    if roof is not None:
        text += (f"\n\n**Compute limit**: {roof.flops_per_row / 1e6:.1f} MFLOP per row (2 per weight, LM head included) "
                 f"at the {roof.gflops:.0f} GFLOP/s a large matrix product reaches here{_spec(roof.spec_gflops)} = "
                 f"**{roof.compute_ms_per_row:.4f} ms per row**. **Weight-read limit**: every call reads "
                 f"{roof.weight_bytes / 2 ** 20:.1f} MiB of weights, {roof.read_ms:.3f} ms at the "
                 f"{roof.read_gbs:.0f} GB/s measured here{_spec(roof.spec_read_gbs)}, in the same pass as the fits "
                 f"above.")
        text += " " + limit_sentence(beaten_limits(eager, compiled, roof), roof)
        if eager is not None and compiled is not None and not beaten_limits(eager, compiled, roof):
            text += (f"\n\nA 1-row call (AR) costs {eager.ms(1) / roof.ms(1):.1f}× the limit eagerly and "
                     f"{compiled.ms(1) / roof.ms(1):.1f}× compiled: what is left above the limit is per-call overhead "
                     f"(Python, dispatch, small kernels), the τ that speculative schedules amortise over their rows. "
                     f"The smaller τ is against δ, the less a schedule's extra rows are free, and the more tokens per "
                     f"call it needs to beat AR.")
    return text


def limit_sentence(beaten: tuple[BeatenLimit, ...], roof) -> str:
    """What the page says of the limit: a floor no call beats (the larger of the two limits), or, where measured
    calls beat it (``beaten``: :func:`beaten_limits`), by how much and why a probe's figure is not a bound."""
    if not beaten:
        return (f"A call cannot be faster than the larger of the two: the read up to about {roof.crossover_rows:.0f} "
                f"rows, the arithmetic beyond.")
    worst = min(beaten, key=lambda b: b.fit_ms / b.limit_ms)
    paths = " and ".join(sorted({b.path for b in beaten}))
    implied = roof.flops_per_row * worst.rows / (worst.fit_ms / 1000) / 1e9
    return (f"⚠ Measured {paths} calls beat this limit, so it is no floor here: {worst.path} calls of {worst.rows} "
            f"rows took {worst.fit_ms:.2f} ms by their fit, under the limit's {worst.limit_ms:.2f} ms (the arithmetic "
            f"of those rows at {implied:.0f} GFLOP/s). The limit is what the probes reached in their own seconds: one "
            f"large matrix product and one read, at the thread count and load of that moment; the model's own kernels "
            f"ran faster than the probe's, or the machine was busier while the probes ran. Read the dashed line as "
            f"the probes' figure, not as a bound.")


def _spec(peak: float | None) -> str:
    """The datasheet's figure beside a measured one, or nothing where the device is not known."""
    return f" (datasheet: {peak:,.0f})" if peak else ""
