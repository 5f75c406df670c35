"""Per-call cost model tau + delta * n fitted from measured call times, and its chart against W.

A model call over n rows costs roughly a fixed tau (launches, Python, reading the weights) plus delta per
row. Per iteration (Table 2 of the paper, block size B = W + 1):

* Linear-SS: 2 calls of B rows  -> 2 tau + 2B delta
* Quadratic-SS: 1 call of B(B+1) rows -> tau + B(B+1) delta
* Packed-SS: 1 call of 2B rows  -> tau + 2B delta
* AR: 1 call of 1 row -> tau + delta (one token per iteration)
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from components.style import SCHEDULE_COLORS
from components.theme import themed

CHART_HEIGHT = 420  # px
LOG_TICKS = [m * 10.0 ** e for e in range(-2, 6) for m in (1, 2, 5)]  # ms labels of the log axis
POOR_FIT = 2.0  # a fit whose RMS residual exceeds this many times tau gets a warning
TITLES = {"ar": "AR", "linear": "Linear-SS", "quadratic": "Quadratic-SS", "packed": "Packed-SS",
          "diffusion": "Block diffusion"}


@dataclass(frozen=True)
class CostModel:
    """Fitted per-call cost: ``tau_ms + delta_ms * rows`` milliseconds.

    Attributes:
        tau_ms: fixed cost of one call (ms).
        delta_ms: cost of one more row (ms per row).
        calls: number of calls the fit used.
        min_rows, max_rows: range of row counts seen.
        rmse_ms: root-mean-square residual of the fit (ms).
    """

    tau_ms: float
    delta_ms: float
    calls: int
    min_rows: int
    max_rows: int
    rmse_ms: float

    def call_ms(self, rows: float) -> float:
        """Predicted time (ms) of one call over ``rows`` rows."""
        return self.tau_ms + self.delta_ms * rows


def fit_cost_model(rows: Sequence[int], ms: Sequence[float]) -> CostModel:
    """Robust least-squares fit of ``ms = tau + delta * rows`` (both constrained >= 0).

    A soft-L1 loss keeps calls slowed down by other processes from dragging the fit.
    Raises: ValueError when fewer than two distinct row counts were measured.
    """
    from scipy.optimize import least_squares

    n = np.asarray(rows, dtype=float)
    y = np.asarray(ms, dtype=float)
    if n.shape != y.shape or len(np.unique(n)) < 2:
        raise ValueError("need calls with at least two different row counts: step or race a few schedules first")
    slope, intercept = np.polyfit(n, y, 1)
    start = [max(float(intercept), 1e-3), max(float(slope), 1e-6)]
    scale = max(0.05, 0.1 * float(np.median(y)))
    fit = least_squares(lambda p: p[0] + p[1] * n - y, start, bounds=([0.0, 0.0], [np.inf, np.inf]),
                        loss="soft_l1", f_scale=scale)
    tau, delta = (float(v) for v in fit.x)
    rmse = float(np.sqrt(np.mean((tau + delta * n - y) ** 2)))
    return CostModel(tau, delta, int(len(n)), int(n.min()), int(n.max()), rmse)


def calls_per_iteration(schedule: str, block_size: int) -> list[int]:
    """Row counts of the calls one regular iteration makes (Table 2)."""
    b = block_size
    return {"linear": [b, b], "quadratic": [b * (b + 1)], "packed": [2 * b], "ar": [1]}[schedule]


def predicted_iteration_ms(schedule: str, block_size: int, model: CostModel) -> float:
    """Predicted model time (ms) of one regular iteration of ``schedule`` at block size B."""
    return sum(model.call_ms(r) for r in calls_per_iteration(schedule, block_size))


def cost_figure(model: CostModel | None, points: Sequence[tuple[str, int, float]], w_max: int = 31) -> go.Figure:
    """Predicted cost per iteration against W (lines) with measured iteration times on top (markers).

    Args:
        model: the fitted cost model (None: measured points only).
        points: ``(schedule, W, model_ms)`` of measured regular iterations (prefill excluded); drawn as
            the median per (schedule, W) with quartile bars.
        w_max: largest W on the x axis (extended to cover the measured points).
    """
    w_max = max([w_max] + [w for _, w, _ in points])
    ws = list(range(1, w_max + 1))
    traces = []
    for schedule in ("linear", "quadratic", "packed", "ar"):
        color = SCHEDULE_COLORS[schedule]
        if model is not None:
            traces.append(dict(type="scatter", mode="lines", name=f"{TITLES[schedule]} predicted",
                               x=ws, y=[predicted_iteration_ms(schedule, w + 1, model) for w in ws],
                               line=dict(color=color, width=2), legendgroup=schedule,
                               hovertemplate=(f"{TITLES[schedule]}<br>W %{{x}}<br>predicted %{{y:.2f}} ms"
                                              "<extra></extra>")))
        groups: dict[int, list[float]] = defaultdict(list)
        for s, w, ms in points:
            if s == schedule:
                groups[w].append(ms)
        if groups:
            xs = sorted(groups)
            low, mid, high = (np.array([np.percentile(groups[w], q) for w in xs]) for q in (25, 50, 75))
            counts = [len(groups[w]) for w in xs]
            traces.append(dict(type="scatter", mode="markers", name=f"{TITLES[schedule]} measured", x=xs,
                               y=mid.tolist(),
                               error_y=dict(type="data", symmetric=False, array=(high - mid).tolist(),
                                            arrayminus=(mid - low).tolist(), visible=True, thickness=1),
                               marker=dict(color=color, size=10, symbol="diamond", line=dict(width=1, color="#0f172a")),
                               legendgroup=schedule, customdata=counts,
                               hovertemplate=(f"{TITLES[schedule]} measured<br>W %{{x}}<br>median %{{y:.2f}} ms "
                                              f"over %{{customdata}} iterations (bars: quartiles)"
                                              f"<extra></extra>")))
    title = "Model time per iteration against W"
    if model is not None:
        title += f" (fit: τ = {model.tau_ms:.2f} ms, δ = {model.delta_ms:.4f} ms/row)"
    layout = dict(title=dict(text=title, x=0.01), height=CHART_HEIGHT, margin=dict(l=60, r=10, t=50, b=50),
                  xaxis=dict(title=dict(text="speculative width W = B − 1")),
                  # Log axis with labels on 1-2-5 steps written out in full (not Plotly's minor "2, 3, 4, 5").
                  yaxis=dict(title=dict(text="model ms per iteration (log scale)"), type="log", tickmode="array",
                             tickvals=LOG_TICKS, ticktext=[f"{v:g}" for v in LOG_TICKS]),
                  legend=dict(orientation="v"))
    return themed(go.Figure(dict(data=traces, layout=layout)))


def break_even(schedule: str, block_size: int, model: CostModel) -> float:
    """Tokens per call a schedule needs to match AR's speed at block size B: its mean predicted call cost
    over a one-row call's (AR makes one token per one-row call); above it the schedule beats AR."""
    calls = calls_per_iteration(schedule, block_size)
    return sum(model.call_ms(r) for r in calls) / len(calls) / model.call_ms(1)


def break_even_figure(model: CostModel | None, measured: Sequence[tuple[str, int, float, int]],
                      w_max: int = 31) -> go.Figure:
    """The tokens/NFE each schedule needs to beat AR against W at this machine's fitted cost (lines), with
    the tokens/NFE its runs reached (markers): a marker above its line beat AR here.

    Args:
        model: the fitted cost model (None: measured points only).
        measured: ``(schedule, W, tokens/NFE, calls)`` of this process's runs (:meth:`TimingLog.tokens_per_nfe`).
        w_max: largest W on the x axis (extended to cover the measured points).
    """
    w_max = max([w_max] + [w for _, w, _, _ in measured])
    ws = list(range(1, w_max + 1))
    traces = []
    for schedule in ("linear", "quadratic", "packed"):
        color = SCHEDULE_COLORS[schedule]
        if model is not None:
            traces.append(dict(type="scatter", mode="lines", name=f"{TITLES[schedule]}: needed to beat AR", x=ws,
                               y=[break_even(schedule, w + 1, model) for w in ws], line=dict(color=color, width=2),
                               legendgroup=schedule,
                               hovertemplate=(f"{TITLES[schedule]}<br>W %{{x}}<br>beats AR above %{{y:.2f}} tokens/NFE"
                                              "<extra></extra>")))
        points = [(w, tpn, calls) for s, w, tpn, calls in measured if s == schedule]
        if points:
            traces.append(dict(type="scatter", mode="markers", name=f"{TITLES[schedule]}: measured here",
                               x=[w for w, _, _ in points], y=[tpn for _, tpn, _ in points],
                               customdata=[calls for _, _, calls in points], legendgroup=schedule,
                               marker=dict(color=color, size=11, symbol="circle", line=dict(width=1, color="#0f172a")),
                               hovertemplate=(f"{TITLES[schedule]} measured<br>W %{{x}}<br>%{{y:.2f}} tokens/NFE over "
                                              f"%{{customdata}} calls<extra></extra>")))
    title = "Break-even: tokens per call needed to beat AR on this machine"
    layout = dict(title=dict(text=title, x=0.01), height=CHART_HEIGHT, margin=dict(l=60, r=10, t=50, b=50),
                  xaxis=dict(title=dict(text="speculative width W = B − 1")),
                  yaxis=dict(title=dict(text="tokens per call (tokens/NFE)"), rangemode="tozero"),
                  legend=dict(orientation="v"),
                  # AR's one token per call, in the theme's line colour (AR's dark grey vanished on the dark theme)
                  shapes=[dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1, line=dict(dash="dot", width=1))])
    return themed(go.Figure(dict(data=traces, layout=layout)))


def break_even_summary(model: CostModel | None, measured: Sequence[tuple[str, int, float, int]],
                       iterations: Sequence[tuple[str, int, float]] = ()) -> str:
    """Markdown: what the break-even means here, and each measured schedule's tokens/NFE against its line, with a
    verdict only where the fit can give one (:func:`judge`; ``iterations``: ``(schedule, W, model_ms)`` measured)."""
    if model is None:
        return "No break-even yet: it needs the cost fit (measure or race first)."
    text = (f"A call of R rows costs τ + δR = {model.tau_ms:.2f} + {model.delta_ms:.4f}·R ms here, so a schedule whose "
            f"calls hold R rows must accept more than (τ + δR) / (τ + δ) tokens per call to beat AR. On a GPU δ is "
            f"nearly 0 for a few dozen rows (paper, Appendix F): the line stays near 1 and every accepted draft "
            f"token is a gain. On a CPU whose calls run near its floor (the native forward of Llama-family models, "
            f"as llama.cpp's) τ is small and δ is not, so the lines climb steeply and AR may win every race. "
            f"The lines come from the fitted model time per call at the paper's row counts (Table 2: "
            f"Packed-SS 2B, Linear-SS B + B, Quadratic-SS B(B + 1)); the race table's time/NFE ÷ AR is the measured "
            f"ratio (with non-model time and the prefill), which decides a race, and can differ from the line. The "
            f"markers pool every run of this process at that W, so they can differ a little from one race's lane.")
    lines = []
    noisy = model.rmse_ms > POOR_FIT * model.tau_ms  # the fit's own warning (fit_summary): no verdict on it
    for schedule, w, tpn, _ in measured:
        if schedule in ("linear", "quadratic", "packed"):
            need = break_even(schedule, w + 1, model)
            verdict = ("too noisy to judge (the fit's residual is "
                       f"{model.rmse_ms / max(model.tau_ms, 1e-9):.1f}× τ: measure again)" if noisy
                       else judge(schedule, w, tpn, model, iterations))
            lines.append(f"- {TITLES[schedule]} at W = {w}: {tpn:.2f} tokens/NFE measured, {need:.2f} needed: "
                         f"{verdict}.")
    return text + ("\n\n" + "\n".join(lines) if lines else "")


MISFIT = 2.0  # measured iterations further than this many RMS errors from the fit's prediction: no verdict


def judge(schedule: str, w: int, tpn: float, model: CostModel, iterations: Sequence[tuple[str, int, float]]) -> str:
    """"beats AR here" / "loses to AR here" only where the fit can tell; otherwise "cannot judge" and why.

    Two checks: (1) the fit predicts the measured regular iterations of AR and of ``schedule`` at ``w`` (medians)
    within :data:`MISFIT` times its RMS error; (2) ``tpn`` lies outside the break-even's range under that error
    (each predicted call ± the RMS error: needed from (c - e) / (a + e) to (c + e) / (a - e), c the schedule's mean
    call, a AR's one-row call, e the error)."""
    e = model.rmse_ms
    for name, at in (("AR", None), (TITLES[schedule], w)):
        key = "ar" if at is None else schedule
        times = [ms for s, ww, ms in iterations if s == key and (at is None or ww == at)]
        if not times:
            continue
        measured_ms = statistics.median(times)
        predicted = predicted_iteration_ms(key, (at or 0) + 1, model)
        if abs(measured_ms - predicted) > MISFIT * e:
            return (f"cannot judge: the fit predicts {name}'s iterations at {predicted:.2f} ms, but they measured "
                    f"{measured_ms:.2f} ms (median of {len(times)}), beyond {MISFIT:g}× its RMS error of {e:.2f} ms")
    calls = calls_per_iteration(schedule, w + 1)
    c, a = sum(model.call_ms(r) for r in calls) / len(calls), model.call_ms(1)
    # every iteration commits at least one token: no run measures fewer tokens/NFE than one per call of an iteration
    least = 1 / len(calls)
    low = max(least, max(0.0, c - e) / (a + e))
    if a <= e:
        why = f"the fit's RMS error ({e:.2f} ms) is as large as a one-row call ({a:.2f} ms)"
        if low > least:
            return f"cannot judge: {why}, so the break-even could be anywhere above {low:.2f} tokens/NFE"
        per = "call" if len(calls) == 1 else f"{len(calls)} calls"
        return (f"cannot judge: {why}, so the break-even could be anywhere at all: every {TITLES[schedule]} "
                f"iteration already commits at least 1 token per {per} ({least:.2f} tokens/NFE), and the fit cannot "
                f"tell which of that is enough to beat AR here")
    high = (c + e) / (a - e)
    if tpn > high:
        return "beats AR here"
    if tpn < low:
        return "loses to AR here"
    return (f"cannot judge: within the fit's RMS error ({e:.2f} ms) the break-even lies between {low:.2f} and "
            f"{high:.2f} tokens/NFE")


def fit_summary(model: CostModel | None, error: str = "") -> str:
    """Markdown sentence describing the fit (or why there is none)."""
    if model is None:
        return f"No fit yet: {error}" if error else "No fit yet."
    text = (f"Fitted on **{model.calls}** calls of {model.min_rows}–{model.max_rows} rows: "
            f"**τ = {model.tau_ms:.2f} ms** per call, **δ = {model.delta_ms:.4f} ms** per row "
            f"(RMS residual {model.rmse_ms:.2f} ms). A Packed-SS call of 2B rows costs "
            f"τ + 2Bδ; Linear-SS pays τ twice for the same rows, Quadratic-SS pays B(B+1)δ.")
    if model.rmse_ms > POOR_FIT * model.tau_ms:
        text += (f"\n\n⚠ The residual is {model.rmse_ms / max(model.tau_ms, 1e-9):.1f}× τ: the measured calls do not "
                 f"follow one straight line (other work on the machine, or too few row counts). Measure again on "
                 f"an idle machine before reading the predictions.")
    return text
