"""Attention-mask heatmaps of one iteration's calls (paper Appendix D.1).

Rows are the call's query rows, columns its keys: the whole cached prefix folded into one band (every
row sees it), then the call's own rows. A cell is coloured by the region of its query row when the row
may attend to the key (prefill, verify, draft, Quadratic's branch rows) and in a tint of the background when it
may not, in the page's light or dark theme (:data:`CELL_COLOURS`).
Every row is labelled on the y axis (role, token, position id; region names for calls of more than 32
rows), keys are grouped like the rows (verify keys, draft keys, branch h keys); hover gives the row's
token and position id, the key's, and whether the key is visible or blocked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import plotly.graph_objects as go

from packed_ss.any_order.layout import PENDING, TOKENS
from packed_ss.layout import BRANCH, DRAFT, PREFILL, VERIFY, CallLayout

from components.style import legend_below
from components.theme import DARK, LIGHT, chart_colours, themed

TokenStrings = Callable[[Sequence[int]], list[str]]

# Any-order calls (Appendix D.2) add N (pending accepted tokens) and O (draft tokens as token entries).
REGION_CODES = {PREFILL: 1, VERIFY: 2, DRAFT: 3, BRANCH: 4, PENDING: 5, TOKENS: 6}
# The cells' colours in the light and dark themes, code 0 (blocked) a tint of the chart's background: every region
# colour at least 3:1 against the background and the blocked cells in its theme (WCAG 1.4.11), and far apart in hue.
CELL_COLOURS = {
    LIGHT: ("#f1f5f9", "#64748b", "#2563eb", "#b45309", "#15803d", "#7c3aed", "#db2777"),
    DARK: ("#1e293b", "#94a3b8", "#60a5fa", "#f59e0b", "#4ade80", "#a78bfa", "#f472b6"),
}
CODE_NAMES = ["blocked", "prefill row sees key", "verify row sees key", "draft row sees key",
              "branch row sees key", "pending token (N) sees key", "draft token (O) sees key"]
REGION_TITLES = {PREFILL: "prefill", VERIFY: "verify", DRAFT: "draft", BRANCH: "branch", PENDING: "N",
                 TOKENS: "O: draft tokens"}
HEIGHT = 560  # px; the least height, so the plot does not jump between small steps
ROW_PX = 18  # px per labelled row: a label of the 11 px tick font never overlaps its neighbours
FRAME_PX = 250  # px of the figure outside the rows (title, tilted key labels, axis title, legend)
ROW_LABELS_UP_TO = 32  # calls with at most this many rows label every row; larger ones label each region
MAX_HOVER_CELLS = 40_000  # cells that get a "visible"/"blocked" hover text (the colours tell it beyond that)


def cell_colours(theme: str) -> tuple[str, ...]:
    """The colour of each cell code (0 blocked, then :data:`REGION_CODES`' regions) in ``theme``."""
    return CELL_COLOURS[theme]


def _colorscale(theme: str = LIGHT) -> list:
    colours = cell_colours(theme)
    n = len(colours)
    scale = []
    for k, color in enumerate(colours):
        scale += [[k / n, color], [(k + 1) / n, color]]
    return scale


def segments(layout: CallLayout, selected: int | None = None) -> list[tuple[int, int, str]]:
    """Contiguous row ranges ``(start, stop, label)`` of one region; Quadratic branches split by h, the
    branch ``selected`` by the call's verification marked."""
    spans: list[tuple[int, int, str]] = []
    branch_of = layout.branch_h
    start = 0
    for r in range(1, layout.rows + 1):
        if r == layout.rows or layout.regions[r] != layout.regions[start] or branch_of.get(r) != branch_of.get(start):
            region = layout.regions[start]
            label = REGION_TITLES.get(region, region)
            if region == BRANCH and start in branch_of:
                label = f"branch h={branch_of[start]}" + (" ✓ selected" if branch_of[start] == selected else "")
            spans.append((start, r, f"{label} rows ({r - start})"))
            start = r
    return spans


def mask_codes(layout: CallLayout) -> tuple[np.ndarray, bool]:
    """(R, K) int8 region codes with the cache folded: K = 1 + R when C > 0 (column 0 = cache band), else R.

    Returns: ``(codes, folded)``; a code is 0 where the row may not attend to the key.
    """
    row_codes = np.array([REGION_CODES.get(region, 1) for region in layout.regions], dtype=np.int8)
    codes = layout.mask.numpy().astype(np.int8) * row_codes[:, None]
    if layout.cached:
        codes = np.concatenate([row_codes[:, None], codes], axis=1)
    return codes, bool(layout.cached)


def _call_spec(layout: CallLayout, strings: TokenStrings, i: int, domain: tuple[float, float],
               selected: int | None = None) -> tuple[dict, dict, list]:
    """Heatmap trace, axis layouts and boundary shapes of one call drawn in subplot i.

    Both axes are categorical: each row and key is labelled with its token and position id, so the hover
    needs no per-cell text (the JSON stays small for Quadratic's B(B+1) rows).
    """
    codes, folded = mask_codes(layout)
    rows, off = layout.rows, (1 if layout.cached else 0)
    names = strings(list(layout.token_ids))
    row_labels = [f"row {r} · {layout.regions[r]} · {names[r]!r} @ pos {layout.position_ids[r]}" for r in range(rows)]
    key_labels = [f"row {k} · {names[k]!r} @ pos {layout.position_ids[k]}" for k in range(rows)]
    if folded:
        key_labels = [f"cached prefix · {layout.cached} tokens @ pos 0..{layout.cached - 1}"] + key_labels
    sfx = "" if i == 0 else str(i + 1)
    xref, yref = f"x{sfx}", f"y{sfx}"
    trace = dict(type="heatmap", z=codes, x=key_labels, y=row_labels, colorscale=_colorscale(), zmin=-0.5,
                 zmax=len(CODE_NAMES) - 0.5, showscale=False, xaxis=xref, yaxis=yref, name=layout.name,
                 hovertemplate="query %{y}<br>key %{x}<extra></extra>")
    if codes.size <= MAX_HOVER_CELLS:  # say visible or blocked in the hover (bounded: Quadratic at large B)
        trace.update(text=np.where(codes > 0, "visible", "blocked").tolist(),
                     hovertemplate="query %{y}<br>key %{x}<br><b>%{text}</b><extra></extra>")
    if rows <= 80:
        trace.update(xgap=1, ygap=1)
    spans = segments(layout, selected)
    # Keys are grouped like the rows (verify keys, draft keys, branch h=0 keys...); at most 12 group names.
    every = max(1, -(-len(spans) // 12))
    named = spans[::every]
    key_ticks = [key_labels[(a + b - 1) // 2 + off] for a, b, _ in named]
    key_text = [label.replace(" rows", " keys") for _, _, label in named]
    if rows <= ROW_LABELS_UP_TO:  # every row labelled: role, token, position id
        branch_of = layout.branch_h
        roles = [f"branch h={branch_of[r]}{' ✓' if branch_of[r] == selected else ''}" if r in branch_of
                 else layout.regions[r] for r in range(rows)]
        row_ticks, row_text = row_labels, [f"{roles[r]} · {names[r]!r} @ {layout.position_ids[r]}"
                                           for r in range(rows)]
    else:
        row_ticks, row_text = [row_labels[(a + b - 1) // 2] for a, b, _ in spans], [s for _, _, s in spans]
    axes = {
        f"xaxis{sfx}": dict(domain=list(domain), anchor=yref, type="category",
                            tickvals=([key_labels[0]] if folded else []) + key_ticks,
                            ticktext=([f"cache ×{layout.cached}"] if folded else []) + key_text,
                            showgrid=False, zeroline=False, tickangle=-60, automargin=True,  # steep: no overlap
                            title=dict(text="keys (cached prefix,<br>then this call's rows)")),  # two lines: fits a phone
        f"yaxis{sfx}": dict(anchor=xref, type="category", autorange="reversed", showgrid=False, zeroline=False,
                            tickvals=row_ticks, ticktext=row_text, tickfont=dict(size=11), automargin=True,
                            title=dict(text="query rows<br>(role · token @ position)" if i == 0 else "")),
    }
    line = dict(width=1.5)  # the theme's line colour (components.theme)
    shapes = []
    for a, _, _ in spans[1:]:  # region boundaries, across rows and keys (category index coordinates)
        shapes.append(dict(type="line", xref=xref, yref=yref, x0=-0.5, x1=rows + off - 0.5, y0=a - 0.5,
                           y1=a - 0.5, line=line))
        shapes.append(dict(type="line", xref=xref, yref=yref, x0=a + off - 0.5, x1=a + off - 0.5, y0=-0.5,
                           y1=rows - 0.5, line=line))
    if folded:  # the folded cache band
        shapes.append(dict(type="line", xref=xref, yref=yref, x0=0.5, x1=0.5, y0=-0.5, y1=rows - 0.5,
                           line=dict(width=3)))
    return trace, axes, shapes


def mask_figure(calls: Sequence[CallLayout], strings: TokenStrings, heading: str = "",
                selected_branch: int | None = None) -> go.Figure:
    """Heatmaps of the given calls side by side (Linear-SS has two per iteration).

    Args:
        calls: the iteration's call layouts, in call order.
        strings: maps token ids to display strings (hover text).
        heading: figure title.
        selected_branch: Quadratic-SS: the branch h that this iteration's verification selected (labelled).
    Returns: a plotly figure of height :data:`HEIGHT`, or taller when a call labels more rows than fit
        (:data:`ROW_PX` per labelled row), so that every label drawn can be read.
    """
    if not calls:
        return empty_figure("No call yet: press Step.")
    widths = [layout.rows + (1 if layout.cached else 0) for layout in calls]
    gap = 0.14 if len(calls) > 1 else 0.0
    usable = 1.0 - gap * (len(calls) - 1)
    traces, shapes, annotations, layout_axes = [], [], [], {}
    x0 = 0.0
    for i, call in enumerate(calls):
        x1 = x0 + usable * widths[i] / sum(widths)
        trace, axes, lines = _call_spec(call, strings, i, (x0, x1), selected_branch)
        traces.append(trace)
        layout_axes.update(axes)
        shapes += lines
        # two short lines: one long line was wider than its heatmap on a phone, and cut off
        annotations.append(dict(text=f"call {i + 1}: {call.name}<br>{call.rows} rows · {call.cached} cached",
                                x=(x0 + x1) / 2, y=1.0, xref="paper", yref="paper", xanchor="center",
                                yanchor="bottom", showarrow=False, font=dict(size=13)))
        x0 = x1 + gap
    present = sorted({REGION_CODES.get(r, 1) for c in calls for r in c.regions} | {0})
    keys = _legend_markers(present, any(c.cached for c in calls))
    for code, marker in zip(present, keys[LIGHT]):  # a legend of the colours, as invisible marker traces
        traces.append(dict(type="scatter", x=[None], y=[None], mode="markers", name=CODE_NAMES[code], marker=marker))
    if len(keys[LIGHT]) > len(present):
        traces.append(dict(type="scatter", x=[None], y=[None], mode="markers",
                           name="first column: the cached prefix<br>(every row sees all of it)",
                           marker=keys[LIGHT][-1]))
    labelled = max((c.rows for c in calls if c.rows <= ROW_LABELS_UP_TO), default=0)
    height = max(HEIGHT, FRAME_PX + ROW_PX * labelled)
    # The legend sits under the whole figure, from its left edge (not the heatmap's, which the row labels push right:
    # on a phone its entries then ran past the right edge); plotly keeps its rows clear of the tilted key labels.
    layout = dict(height=height, margin=dict(l=10, r=10, t=80, b=130), title=dict(text=heading, x=0.01),
                  showlegend=True, shapes=shapes, annotations=annotations, legend=legend_below(), **layout_axes)
    dark = [dict(colorscale=_colorscale(DARK)) for _ in calls] + [dict(marker=m) for m in keys[DARK]]
    return themed(go.Figure(dict(data=traces, layout=layout)), dark)


def _legend_markers(codes: Sequence[int], cached: bool) -> dict[str, list[dict]]:
    """Per theme, the legend's square of each cell code in ``codes``, then (``cached``) the folded cache band's: the
    background's colour inside the theme's line."""
    keys = {}
    for theme in (LIGHT, DARK):
        chart = chart_colours(theme)
        keys[theme] = [dict(symbol="square", size=12, color=cell_colours(theme)[code],
                            line=dict(width=1, color=chart.line)) for code in codes]
        if cached:
            keys[theme].append(dict(symbol="square", size=12, color=chart.back, line=dict(width=3, color=chart.text)))
    return keys


def empty_figure(message: str) -> go.Figure:
    """A blank figure of the same height carrying one centred message."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False, font=dict(size=14))
    fig.update_layout(height=HEIGHT, xaxis=dict(visible=False), yaxis=dict(visible=False),
                      margin=dict(l=10, r=10, t=30, b=10))
    return themed(fig)
