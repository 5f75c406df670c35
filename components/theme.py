"""The charts' colours in the page's light and dark themes (Gradio's ``.dark`` class, ``?__theme=dark``).

Gradio draws a ``gr.Plot`` with plotly in the browser and knows nothing of the page's theme, so every figure carries
both: its light colours as its template, and its dark ones in ``layout.meta["dark"]`` (a template and per-trace
colours). ``assets/page.js`` draws a figure with its dark colours when the page is dark. Every decision is made here,
by pure functions; the page only swaps what the figure carries.

Text on a chart has at least 4.5:1 against the chart's background in either theme (WCAG 1.4.3), lines and marks
at least 3:1 (WCAG 1.4.11): :func:`lifted` lightens a line colour that is too dark for the dark background.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from packed_ss.bench.palette import contrast, rgb

LIGHT, DARK = "light", "dark"
THEMES = (LIGHT, DARK)
MIN_TEXT = 4.5  # WCAG 1.4.3: text against its background
MIN_GRAPHIC = 3.0  # WCAG 1.4.11: lines, marks and cells against their background


@dataclass(frozen=True)
class ChartColours:
    """One theme's chart colours: the figure's background (paper and plot alike), its text, the grid, the axis
    lines and drawn shapes (region boundaries, reference lines)."""

    back: str
    text: str
    grid: str
    line: str


CHART_COLOURS = {
    LIGHT: ChartColours(back="#ffffff", text="#0f172a", grid="#e2e8f0", line="#334155"),
    # the dark lane cards' colour (assets/style.css): the chart reads as one of the page's cards
    DARK: ChartColours(back="#0f172a", text="#e2e8f0", grid="#334155", line="#cbd5e1"),
}


def chart_colours(theme: str) -> ChartColours:
    """The chart colours of ``theme`` (:data:`LIGHT` or :data:`DARK`). Raises: KeyError for another theme."""
    return CHART_COLOURS[theme]


def template(theme: str) -> dict:
    """A plotly template (``layout.template``) of ``theme``'s background, text, grid and line colours; a figure
    that names none of these colours itself takes them from it."""
    c = chart_colours(theme)
    axis = dict(gridcolor=c.grid, linecolor=c.line, zerolinecolor=c.grid, tickcolor=c.line,
                tickfont=dict(color=c.text), title=dict(font=dict(color=c.text)))
    return dict(layout=dict(paper_bgcolor=c.back, plot_bgcolor=c.back, font=dict(color=c.text),
                            title=dict(font=dict(color=c.text)), legend=dict(font=dict(color=c.text)),
                            xaxis=axis, yaxis=axis, shapedefaults=dict(line=dict(color=c.line)),
                            annotationdefaults=dict(font=dict(color=c.text)),
                            hoverlabel=dict(font=dict(color=c.text), bgcolor=c.back)))


def mix(colour: str, toward: str, share: float) -> str:
    """``colour`` moved ``share`` (0 to 1) of the way to ``toward``, channel by channel (``"#rrggbb"``)."""
    return "#" + "".join(f"{round(a + (b - a) * share):02x}" for a, b in zip(rgb(colour), rgb(toward)))


def lifted(colour: str, back: str, least: float = MIN_GRAPHIC) -> str:
    """``colour`` itself when it has ``least`` contrast on ``back``, else the nearest mix of it with white (in
    steps of 5 %) that has: a dark line made light enough for the dark background, keeping its hue."""
    for step in range(21):
        candidate = mix(colour, "#ffffff", step / 20)
        if contrast(candidate, back) >= least:
            return candidate
    return "#ffffff"


def _hex(value) -> bool:
    return isinstance(value, str) and len(value) == 7 and value.startswith("#")


def dark_trace(trace: dict, back: str) -> dict:
    """What a trace's colours become on the dark ``back``: each ``"#rrggbb"`` line, marker, marker outline and error
    bar colour :func:`lifted` to 3:1 (only those that change; an empty dict when none does)."""
    patch: dict = {}
    for outer, inner in (("line", None), ("marker", None), ("marker", "line"), ("error_y", None)):
        part = trace.get(outer) or {}
        if inner is not None:
            part = part.get(inner) or {}
        colour = part.get("color")
        if _hex(colour) and lifted(colour, back) != colour:
            target = patch.setdefault(outer, {})
            if inner is not None:
                target = target.setdefault(inner, {})
            target["color"] = lifted(colour, back)
    return patch


def themed(figure: go.Figure, dark_data: list[dict] | None = None) -> go.Figure:
    """``figure`` with the light template and, in ``layout.meta["dark"]``, the dark template and one colour patch
    per trace (``dark_data``; by default :func:`dark_trace` of each trace) that the page applies when it is dark.
    The figure itself must name no background, text or grid colour (the template's would not apply)."""
    data = [trace.to_plotly_json() for trace in figure.data]
    patches = dark_data if dark_data is not None else [dark_trace(t, chart_colours(DARK).back) for t in data]
    figure.layout.template = template(LIGHT)  # in place of plotly's own (its backgrounds and grid are light)
    figure.layout.meta = dict(dark=dict(template=template(DARK), data=patches))
    return figure
