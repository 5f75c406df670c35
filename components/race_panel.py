"""Race panel: lanes replaying measured runs on one clock, the AR-agreement badge and the race charts.

A :class:`Lane` is the compact, CPU-only timeline of one finished run (cumulative wall time, NFE and
tokens at the end of each iteration). The page replays lanes on a shared clock: at clock time c a lane
shows every iteration that had finished c milliseconds into its own run. Wall times are the engine's
measured decoder times, so the replay speed never changes the numbers.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import plotly.graph_objects as go

from packed_ss.bench.palette import schedule_color, schedule_symbol
from packed_ss.projection import CallTable, project
from packed_ss.wording import counted

from components.style import legend_below, legend_html, marked, source_class
from components.theme import themed
from serve.lanes import Lane, cost_ratio, ratio_text, speed_ratio, verdict_parts

TokenStrings = Callable[[Sequence[int]], list[str]]
CHART_HEIGHT = 400  # px (the legend under the chart takes its own rows)
REPLAYING = '<span class="badge muted" data-badge="replaying">replaying: compared with AR once its tokens are in</span>'


def lane_counters(lane: Lane, clock_ms: float) -> dict[str, float]:
    """Live counters at ``clock_ms``: nfe, tokens, wall_s, tokens_per_nfe, time_per_nfe_ms, throughput."""
    done = lane.at(clock_ms)
    finished = done >= len(lane.wall_ms)
    nfe = lane.nfe[done - 1] if done else 0
    tokens = lane.tokens[done - 1] if done else 0
    wall_ms = lane.total_ms if finished else max(0.0, clock_ms)
    return {
        "nfe": nfe,
        "tokens": tokens,
        "wall_s": wall_ms / 1000,
        "tokens_per_nfe": tokens / nfe if nfe else 0.0,
        "time_per_nfe_ms": wall_ms / nfe if nfe else 0.0,
        "throughput": 1000 * tokens / wall_ms if wall_ms > 0 else 0.0,
        "finished": finished,
    }


def _lane_badge(lane: Lane, greedy: bool, order: str = "ltr") -> str:
    """The lane's agreement with AR. Red only where a difference is a fault: a lossless lane's greedy output; never
    block diffusion's (unverified), a sample's (T > 0) or, under an any-order model's confidence order, a speculative
    lane's (Appendix C: the order changes the conditionals), which are said in the neutral style."""
    if lane.schedule == "ar":  # the lane every other one is compared with
        return '<span class="badge info">reference</span>'
    if lane.compared is None:  # nothing to compare: no claim either way
        return f'<span class="badge muted" data-differs="none">{html.escape(lane.agreement())}</span>'
    if lane.identical:  # green only for the whole output; over a cut-off run's tokens, neutral
        return f'<span class="badge {"info" if lane.partial else "ok"}">{html.escape(lane.agreement())}</span>'
    expected = order != "ltr" and lane.schedule != "diffusion"
    kind = "bad" if greedy and lane.schedule != "diffusion" and not expected else "info"
    why = "; expected in the confidence order" if expected else ""
    return (f'<span class="badge {kind}" data-differs="{"expected" if expected else kind}">'
            f'{html.escape(lane.agreement()[:-1])}{why})</span>')


def lanes_html(lanes: Sequence[Lane], clock_ms: float, strings: TokenStrings, greedy: bool,
               order: str = "ltr") -> str:
    """The shown lanes side by side at ``clock_ms``: progress bar, counters, text in provenance colours.
    ``order``: the run's verification order (an any-order model's "confidence": differences from AR expected).

    Each counter carries ``data-counter`` (nfe, tokens, wall_s, tokens_per_nfe, time_per_nfe_ms,
    throughput) and each lane ``data-lane``/``data-done`` so tests can read them.
    """
    shown = [lane for lane in lanes if lane.shown]
    parts = [f'<div class="race-lanes" data-columns="{lane_columns(len(shown))}" '
             f'style="grid-template-columns: repeat({lane_columns(len(shown))}, minmax(0, 1fr))">']
    for lane in shown:
        c = lane_counters(lane, clock_ms)
        k = c["tokens"]
        pieces = strings(list(lane.token_ids[:k]))
        spans = []
        for i, piece in enumerate(pieces):
            cls = f"tok {source_class(lane.sources[i])}"
            if i < len(lane.differs) and lane.differs[i]:
                cls += " diff"
            spans.append(f'<span class="{cls}">{marked(piece)}</span>')
        progress = 100 * min(clock_ms, lane.total_ms) / (lane.total_ms or 1.0)  # its own run: full when finished
        counters = [("nfe", "NFE", f"{c['nfe']}"), ("tokens", "tokens", f"{c['tokens']}"),
                    ("wall_s", "wall s", f"{c['wall_s']:.3f}"),
                    ("tokens_per_nfe", "tokens/NFE", f"{c['tokens_per_nfe']:.2f}"),
                    ("time_per_nfe_ms", "ms/NFE", f"{c['time_per_nfe_ms']:.1f}"),
                    ("throughput", "tokens/s", f"{c['throughput']:.1f}")]
        cards = "".join(f'<div class="stat"><span class="k">{label}</span>'
                        f'<span class="v" data-counter="{key}">{value}</span></div>' for key, label, value in counters)
        made = counted(len(lane.token_ids), "token")
        done = ("" if not c["finished"] else
                f'<span class="done cut" data-cut="1">cut off at the time limit ({made})</span>' if lane.cut_off else
                f'<span class="done" data-stopped="1">stopped with every lane at {made}</span>' if lane.stopped_early
                else '<span class="done">finished</span>')
        parts.append(
            f'<div class="lane{" lane-cut" if lane.cut_off and c["finished"] else ""}" data-lane="{lane.schedule}" '
            f'data-done="{int(c["finished"])}">'
            f'<h4><span class="lane-key" style="background:{schedule_color(lane.schedule)}"></span>'
            f'{html.escape(lane.title)}'
            f'{_block_label(lane)} {done}</h4>'
            f'{_lane_badge(lane, greedy, order) if c["finished"] else REPLAYING}'
            f'<div class="bar" title="decoder wall time replayed"><div style="width:{progress:.1f}%"></div>'
            f'<span class="bar-label">{min(clock_ms, lane.total_ms) / 1000:.2f} / {lane.total_ms / 1000:.2f} s · '
            f'{c["tokens"]} tokens</span></div>'
            f'<div class="stats">{cards}</div>'
            f'<div class="token-text">{"".join(spans)}</div></div>')
    parts.append("</div>")
    # The key to the lanes' text colours: where each token came from.
    sources = list(dict.fromkeys(s for lane in shown for s in lane.sources))
    if sources:
        parts.append(f'<div class="lane-legend" data-legend="sources">Text colours: {legend_html(sources)}</div>')
    return "".join(parts)


def lane_columns(lanes: int) -> int:
    """Columns of the lane grid: at most 4, and rows as even as they can be (5 and 6 lanes: 3 + 2 and 3 + 3,
    7 and 8: 4 + 3 and 4 + 4), so no card stands alone in a row."""
    if lanes <= 4:
        return max(1, lanes)
    rows = -(-lanes // 4)
    return -(-lanes // rows)


def _block_label(lane: Lane) -> str:
    """" · B = 6" for lanes that use a block size (not AR)."""
    b = lane.metrics.get("block_size")
    return f' <span class="lane-b">· B = {b}</span>' if b and lane.schedule != "ar" else ""


def _who_was_cut(lane: Lane, ar: Lane | None) -> str:
    """Why a lane was compared with AR over part of its output: the race stopped every lane at a common count,
    or the time limit cut "AR cut off", "this lane cut off", "both cut off"."""
    if lane.stopped_early or (ar is not None and ar.stopped_early):
        return "the race stopped every lane there"
    if ar is not None and ar.cut_off and not lane.cut_off:
        return "AR cut off"
    return "both cut off" if ar is not None and ar.cut_off else "this lane cut off"


def badge_html(lanes: Sequence[Lane], greedy: bool, order: str = "ltr") -> str:
    """The race verdict: are the lossless lanes' greedy outputs identical to AR's; diffusion's differences.

    The AR reference always runs (hidden or not); diffusion is compared too and its differences shown.
    ``order``: an any-order model's verification order; under ``"confidence"`` the speculative lanes may
    leave the model's left-to-right output by design (Appendix C), so a difference is reported, not flagged.
    """
    lossless = [lane for lane in lanes if lane.schedule not in ("ar", "diffusion")]
    badges = []
    parts = verdict_parts(lanes)
    if parts:  # the headline in bold, then one line per sentence (one paragraph was hard to read)
        lines = "".join(f'<span class="verdict-line">{html.escape(part)}</span>' for part in parts[1:])
        badges.append(f'<div class="race-verdict" data-badge="verdict"><strong>{html.escape(parts[0])}</strong>'
                      f'{lines}</div>')
    ref = next((lane for lane in lanes if lane.schedule == "ar"), None)
    n = len(ref.token_ids) if ref else 0
    compared = [lane for lane in lossless if lane.compared is not None]
    skipped = [lane for lane in lossless if lane.compared is None]
    if skipped:
        badges.append(f'<span class="badge muted" data-badge="not-compared">Not compared with AR: '
                      f'{html.escape("; ".join(f"{lane.title} {lane.agreement()}" for lane in skipped))}</span>')
    if greedy and order != "ltr":
        for lane in compared:
            where = (f"matches the left-to-right output over {counted(lane.compared, 'token')}" if lane.identical else
                     f"differs from the left-to-right output from token {lane.first_difference} on "
                     f"({sum(lane.differs)} of {len(lane.token_ids)} tokens differ): the confidence order changes "
                     f"the conditionals, so this is expected")
            badges.append(f'<span class="badge info" data-badge="order">{html.escape(lane.title)} '
                          f'{html.escape(where)}</span>')
    elif greedy and compared:
        bad = [lane for lane in compared if not lane.identical]
        partial = [lane for lane in compared if lane.partial]
        if not bad and not partial:
            badges.append(f'<span class="badge ok" data-badge="identical">✓ Greedy outputs of '
                          f'{html.escape(", ".join(lane.title for lane in compared))} are identical to AR\'s '
                          f'({counted(n, "token")})</span>')
        elif not bad and ref is not None and ref.stopped_early:  # every lane stopped at one count
            badges.append(f'<span class="badge ok" data-badge="identical-stopped">✓ Greedy outputs of '
                          f'{html.escape(", ".join(lane.title for lane in compared))} are identical to AR\'s over '
                          f'the {counted(n, "token")} every lane made before the race stopped them together (the '
                          f'time limit): nothing is claimed past them</span>')
        elif not bad:  # a cut-off run: the agreement holds over the tokens both made, no further
            over = ", ".join(f"{lane.title}: {counted(lane.compared, 'token')}" for lane in compared)
            badges.append(f'<span class="badge info" data-badge="partial">Greedy outputs agree with AR\'s over the '
                          f'tokens both made before the time limit, and no further ({html.escape(over)}): no verdict '
                          f'on the whole output</span>')
        for lane in bad:
            if lane.divergence is not None and lane.divergence.near_tie:
                badges.append(f'<span class="badge info" data-badge="near-tie">≈ {html.escape(lane.title)}: '
                              f'{html.escape(lane.divergence.verdict())}</span>')
                continue
            why = f": {lane.divergence.verdict()}" if lane.divergence is not None else ""
            badges.append(f'<span class="badge bad" data-badge="differs">✗ {html.escape(lane.title)} differs from '
                          f'AR at token {lane.first_difference}{html.escape(why)}</span>')
    elif compared:
        same = sum(lane.identical for lane in compared)
        badges.append(f'<span class="badge info" data-badge="sampled">T &gt; 0: every lane samples; lossless lanes '
                      f'follow AR\'s distribution but need not match its tokens ({same} of {len(compared)} match '
                      f'this time)</span>')
    for lane in lanes:
        if lane.schedule == "diffusion" and lane.compared is not None:
            if lane.identical:
                badges.append(f'<span class="badge info" data-badge="diffusion">Diffusion matches AR this time over '
                              f'{counted(lane.compared, "token")} (it is not guaranteed to)</span>')
            else:
                badges.append(f'<span class="badge bad" data-badge="diffusion">Diffusion (no verification) differs '
                              f'from AR in {sum(lane.differs)} of {len(lane.token_ids)} tokens, first at token '
                              f'{lane.first_difference}: differing tokens are underlined</span>')
    return "".join(badges)


def _line_figure(lanes: Sequence[Lane], xkey: str, title: str, xtitle: str,
                 clock_ms: float = float("inf")) -> go.Figure:
    traces = []
    longest = max((lane.total_ms for lane in lanes if lane.shown), default=0.0)
    for lane in lanes:
        if not lane.shown:
            continue
        done = lane.at(clock_ms)
        xs = [0.0] + (list(lane.nfe[:done]) if xkey == "nfe" else [w / 1000 for w in lane.wall_ms[:done]])
        traces.append(dict(type="scatter", mode="lines+markers", name=lane.title, x=xs,
                           y=[0] + list(lane.tokens[:done]),
                           line=dict(shape="hv", color=schedule_color(lane.schedule), width=2),
                           marker=dict(size=6, symbol=schedule_symbol(lane.schedule)),
                           hovertemplate=f"{lane.title}<br>{xtitle} %{{x}}<br>tokens %{{y}}<extra></extra>"))
    # Fixed ranges: the axes do not jump while the replay fills the lines in.
    x_end = (max((lane.nfe[-1] for lane in lanes if lane.shown and lane.nfe), default=1) if xkey == "nfe"
             else longest / 1000)
    y_end = max((lane.tokens[-1] for lane in lanes if lane.shown and lane.tokens), default=1)
    layout = dict(title=dict(text=title, x=0.01), height=CHART_HEIGHT, margin=dict(l=50, r=10, t=40, b=45),
                  xaxis=dict(title=dict(text=xtitle), zeroline=False, range=[0, 1.04 * x_end], automargin=True),
                  yaxis=dict(title=dict(text="tokens"), range=[0, 1.06 * y_end]),
                  legend=legend_below())
    return themed(go.Figure(dict(data=traces, layout=layout)))


def race_figures(lanes: Sequence[Lane], clock_ms: float = float("inf")) -> tuple[go.Figure, go.Figure, go.Figure]:
    """Tokens against NFE, tokens against decoder wall time (s) for every shown lane, and Packed-SS's
    against Linear-SS's NFE path; the iterations finished ``clock_ms`` into the replay (all by default)."""
    return (_line_figure(lanes, "nfe", "Tokens against NFE", "NFE", clock_ms),
            _line_figure(lanes, "wall", "Tokens against wall time", "decoder wall time (s)", clock_ms),
            nfe_path_figure(lanes, clock_ms))


def nfe_path_figure(lanes: Sequence[Lane], clock_ms: float = float("inf")) -> go.Figure:
    """Calls needed for the first n tokens, Packed-SS against Linear-SS (paper Theorem 3.2: with a
    monotone drafter and greedy decoding Packed-SS's path never lies above Linear-SS's)."""
    traces = []
    for lane in lanes:
        if lane.schedule not in ("linear", "packed"):
            continue
        done = lane.at(clock_ms)
        traces.append(dict(type="scatter", mode="lines", name=lane.title, x=[0] + list(lane.tokens[:done]),
                           y=[0] + list(lane.nfe[:done]),
                           line=dict(shape="vh", width=2, color=schedule_color(lane.schedule)),
                           hovertemplate=f"{lane.title}<br>%{{x}} tokens after %{{y}} calls<extra></extra>"))
    y_end = max((lane.nfe[-1] for lane in lanes if lane.schedule in ("linear", "packed") and lane.nfe), default=1)
    x_end = max((lane.tokens[-1] for lane in lanes if lane.schedule in ("linear", "packed") and lane.tokens),
                default=1)
    layout = dict(title=dict(text="Theorem 3.2: NFE for the first n tokens", x=0.01),
                  height=CHART_HEIGHT, margin=dict(l=50, r=10, t=40, b=45),
                  xaxis=dict(title=dict(text="tokens generated"), range=[0, 1.04 * x_end], automargin=True),
                  yaxis=dict(title=dict(text="NFE"), range=[0, 1.06 * y_end]),
                  legend=legend_below())
    return themed(go.Figure(dict(data=traces, layout=layout)))


SUMMARY_COLUMNS = (  # (key, header, tooltip): the race table's columns; the key names the cells (data-col)
    ("schedule", "schedule", ""), ("b", "B", ""), ("tokens", "tokens", ""), ("nfe", "NFE", ""),
    ("tokens-per-nfe", "tokens/NFE", ""),
    ("cost-ratio", "ms/NFE ÷ AR", "time per call over AR's: what one call costs in AR calls"),
    ("wall-s", "wall s", ""), ("ms-per-nfe", "ms/NFE", ""), ("throughput", "tokens/s", ""),
    ("speed-vs-ar", "speed ÷ AR [95%]", "speed over AR's with its 95% interval over the paired slices"),
    ("mean-a", "mean A (prefill excluded)",
     "mean acceptance length A: tokens a verifying iteration committed (h accepted draft tokens plus the "
     "correction or bonus token, fewer where EOS, a stop string or the limit cut it), the prefill excluded; "
     "tokens/NFE counts every call"),
    ("same", "= AR", ""),
)


def summary_html(lanes: Sequence[Lane]) -> str:
    """A table of each lane's final metrics (hidden reference lanes included, marked). Each cell carries its
    column's key (``data-col``) and header (``data-label``: on a phone each row is drawn as a card of labelled
    values, assets/style.css)."""
    head = "".join(f"<th title='{html.escape(tip, quote=True)}'>{label}</th>" if tip else f"<th>{label}</th>"
                   for _, label, tip in SUMMARY_COLUMNS)
    rows = []
    ar = next((lane for lane in lanes if lane.schedule == "ar"), None)
    for lane in lanes:
        m = lane.metrics
        same = ("reference" if lane.schedule == "ar" else "not compared" if lane.compared is None else
                f"yes, over the first {counted(lane.compared, 'token')} ({_who_was_cut(lane, ar)})"
                if lane.identical and lane.partial else
                f"yes ({counted(lane.compared, 'token')})" if lane.identical else
                f"no (token {lane.first_difference})")
        speed = speed_ratio(lane, ar) if ar is not None and lane is not ar else None
        values = {
            "schedule": html.escape(lane.title + ("" if lane.shown else " (hidden)")),
            "b": m.get("block_size") if lane.schedule != "ar" else "–",
            "tokens": m["tokens"], "nfe": m["nfe"], "tokens-per-nfe": f"{m['tokens_per_nfe']:.2f}",
            "cost-ratio": "–" if cost_ratio(lane, ar) is None else f"{cost_ratio(lane, ar):.2f}",
            "wall-s": f"{m['wall_s']:.3f}", "ms-per-nfe": f"{m['time_per_nfe_ms']:.1f}",
            "throughput": f"{m['throughput']:.1f}",
            "speed-vs-ar": "1 (reference)" if lane is ar else "–" if speed is None else ratio_text(speed),
            "mean-a": f"{m['mean_acceptance_length']:.2f}" if lane.schedule != "diffusion" else "–",
            "same": same,
        }
        rows.append("<tr>" + "".join(f"<td data-col='{key}' data-label='{html.escape(label, quote=True)}'>"
                                     f"{values[key]}</td>" for key, label, _ in SUMMARY_COLUMNS) + "</tr>")
    return (f'<div class="race-summary-wrap"><table class="race-summary"><tr>{head}</tr>{"".join(rows)}</table>'
            f'</div>')


def projection_html(lanes: Sequence[Lane], tables: Sequence[CallTable]) -> str:
    """The race's own calls priced by call costs measured on a GPU (:mod:`packed_ss.projection`): per lane its
    tokens per call and, per table, its projected speed over AR's and tokens per second; labelled as a projection
    (model time only), beside the measured verdict, never mixed into it. Empty without tables, an AR lane that
    made calls, or a lane with tokens."""
    ar = next((lane for lane in lanes if lane.schedule == "ar" and lane.call_rows and lane.token_ids), None)
    shown = [lane for lane in lanes if lane.shown and lane.call_rows and lane.token_ids]
    if not tables or ar is None or len(shown) < 2:
        return ""

    def speed(lane: Lane, table: CallTable) -> float:
        return len(lane.token_ids) / project(lane.call_rows, table) * 1000  # tokens per second of model time

    labels = [html.escape(f"{table.model}: × AR (tokens/s)", quote=True) for table in tables]
    heads = "".join(f"<th>{label}</th>" for label in labels)
    rows = []
    for lane in shown:  # data-label: on a phone each row is a card of labelled values (assets/style.css)
        cells = "".join(f"<td data-col='projected' data-label='{label}'>{speed(lane, t) / speed(ar, t):.2f}x "
                        f"({speed(lane, t):,.0f})</td>" for label, t in zip(labels, tables))
        rows.append(f"<tr><td data-col='schedule'>{html.escape(lane.title)}</td><td data-label='tokens/NFE'>"
                    f"{lane.metrics['tokens_per_nfe']:.2f}</td>{cells}</tr>")
    first = tables[0]
    spread = f"{min(first.ms):.1f}-{max(first.ms):.1f} ms"
    measured = next((lane for lane in shown if lane.schedule == "packed"), None)
    packed = ""
    if measured is not None:
        here = measured.metrics["throughput"] / ar.metrics["throughput"] if ar.metrics["throughput"] else 0.0
        packed = (f" {html.escape(measured.title)} would run at {speed(measured, first) / speed(ar, first):.2f}x AR's "
                  f"speed there, against {here:.2f}x measured in this race.")
    return (f'<div class="race-projection" data-badge="projection"><h4>Projection, not a measurement: this race\'s '
            f'calls priced by call costs measured on an {html.escape(first.device)} ({html.escape(first.date)}, '
            f'<code>scripts/gpu_check.py</code>, <code>assets/gpu/{html.escape(first.source)}</code>)</h4>'
            f'<p>There a call of {first.rows[0]} to {first.rows[-1]} rows of {html.escape(first.model)} costs {spread} '
            f'of model time, so the tokens a schedule gets per call turn almost directly into speed, while on this '
            f'machine more rows cost more.{packed} Model time only (no host work between calls), from each lane\'s '
            f'own calls (their row counts) in this race.</p>'
            f'<div class="race-summary-wrap"><table class="race-summary"><tr><th>schedule</th><th>tokens/NFE</th>'
            f'{heads}</tr>{"".join(rows)}</table></div></div>')
