"""The colours of the light and the dark theme (issue 67): the text box of tokens (every source's background under
its text at least 4.5:1, the same values as assets/style.css), the charts' template colours, the mask heatmap's cells
(at least 3:1 against the chart's background and the blocked cells, far apart from each other), and the dark trace
colours every chart carries for the page (components/theme.py, drawn by assets/page.js)."""

import itertools
import re

import pytest

from components.mask_plot import CODE_NAMES, cell_colours, empty_figure, mask_figure
from components.style import ASSETS, OPEN_SOURCE, PROMPT, SOURCE_STYLES, token_colours, token_css
from components.theme import (DARK, LIGHT, MIN_GRAPHIC, MIN_TEXT, THEMES, chart_colours, dark_trace, lifted, mix,
                              template, themed)
from packed_ss.bench.palette import SCHEDULE_COLORS, contrast, distance
from packed_ss.layout import packed_layout

MIN_CELL_DISTANCE = 12.0  # CIEDE2000 between two region colours of the mask (over 10: plainly another colour)


@pytest.mark.parametrize("theme", THEMES)
def test_every_token_source_reads_on_its_background(theme):
    colours = token_colours(theme)
    assert set(colours) == set(SOURCE_STYLES) | {OPEN_SOURCE}
    for source, (back, text) in colours.items():
        assert contrast(text, back) >= MIN_TEXT, (theme, source, back, text, round(contrast(text, back), 2))


def test_the_dark_token_colours_are_dark_and_differ_from_the_light_ones():
    light, dark = token_colours(LIGHT), token_colours(DARK)
    box = dark[PROMPT][0]
    assert contrast(box, "#000000") < 2 and contrast(light[PROMPT][0], "#ffffff") < 1.1  # a dark box, a white one
    for source in SOURCE_STYLES:
        if source != PROMPT:
            assert contrast(dark[source][0], "#000000") < contrast(light[source][0], "#000000"), source
            assert dark[source][0] != box, source  # a token of each source still stands out of the box
    backs = [dark[s][0] for s in SOURCE_STYLES if s != PROMPT]
    assert min(distance(a, b) for a, b in itertools.combinations(backs, 2)) >= MIN_CELL_DISTANCE


def _css_block(css: str, selector: str) -> dict[str, str]:
    """The ``--name: #colour`` variables of every rule whose selector list holds ``selector`` exactly."""
    found = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        if selector in (s.strip() for s in selectors.split(",")):
            found.update(re.findall(r"(--[\w-]+):\s*(#[0-9a-fA-F]{6})\s*;", body))
    assert found, selector
    return found


@pytest.mark.parametrize("theme, selector", [(LIGHT, ":root"), (DARK, ".dark .token-text")])
def test_the_page_uses_the_same_token_colours(theme, selector):
    css = re.sub(r"/\*.*?\*/", "", (ASSETS / "style.css").read_text(encoding="utf-8"), flags=re.S)
    found = _css_block(css, selector)
    expected = token_css(theme)
    assert {name: found.get(name) for name in expected} == expected


@pytest.mark.parametrize("theme, selector", [(LIGHT, ":root"), (DARK, ".dark .legend .swatch")])
def test_the_legend_swatches_show_the_text_colours_of_the_theme(theme, selector):
    """The legends of the text colours (Step, Race) kept the light pastels in the dark theme, where the text itself
    shows dark shades (a correction pale peach in the key, dark red-brown in the text)."""
    css = re.sub(r"/\*.*?\*/", "", (ASSETS / "style.css").read_text(encoding="utf-8"), flags=re.S)
    found = _css_block(css, selector)
    expected = {name: colour for name, colour in token_css(theme).items() if name.startswith("--src-")}
    assert expected and {name: found.get(name) for name in expected} == expected


@pytest.mark.parametrize("theme", THEMES)
def test_chart_text_and_lines_read_on_the_charts_background(theme):
    c = chart_colours(theme)
    assert contrast(c.text, c.back) >= MIN_TEXT
    assert contrast(c.line, c.back) >= MIN_GRAPHIC
    layout = template(theme)["layout"]
    assert layout["paper_bgcolor"] == layout["plot_bgcolor"] == c.back
    assert layout["font"]["color"] == layout["xaxis"]["tickfont"]["color"] == c.text


def test_the_dark_charts_background_is_dark():
    assert contrast(chart_colours(DARK).back, "#000000") < 1.5
    assert contrast(chart_colours(LIGHT).back, "#ffffff") < 1.05


@pytest.mark.parametrize("theme", THEMES)
def test_mask_cells_stand_out_of_the_background_and_of_each_other(theme):
    colours = cell_colours(theme)
    assert len(colours) == len(CODE_NAMES)
    back, blocked = chart_colours(theme).back, colours[0]
    for name, cell in zip(CODE_NAMES[1:], colours[1:]):
        assert contrast(cell, back) >= MIN_GRAPHIC, (theme, name, cell, round(contrast(cell, back), 2))
        assert contrast(cell, blocked) >= MIN_GRAPHIC, (theme, name, cell, round(contrast(cell, blocked), 2))
    for (a, first), (b, second) in itertools.combinations(zip(CODE_NAMES, colours), 2):
        assert distance(first, second) >= MIN_CELL_DISTANCE, (theme, a, b)


def test_lifted_keeps_a_readable_colour_and_lightens_a_dark_one():
    back = chart_colours(DARK).back
    assert lifted("#60a5fa", back) == "#60a5fa"
    assert lifted("#020009", back) != "#020009"
    for name, colour in SCHEDULE_COLORS.items():
        light = lifted(colour, back)
        assert contrast(light, back) >= MIN_GRAPHIC, name
        assert light == mix(colour, "#ffffff", 0) or contrast(colour, back) < MIN_GRAPHIC, name
    assert mix("#000000", "#ffffff", 0.5) == "#808080"


def test_dark_trace_patches_only_the_colours_too_dark():
    back = chart_colours(DARK).back
    trace = dict(type="scatter", line=dict(color="#020009", width=2), marker=dict(color="#60a5fa",
                                                                                 line=dict(color="#0f172a")))
    patch = dark_trace(trace, back)
    assert set(patch) == {"line", "marker"} and set(patch["marker"]) == {"line"}
    assert contrast(patch["line"]["color"], back) >= MIN_GRAPHIC
    assert dark_trace(dict(type="scatter", line=dict(color="#60a5fa")), back) == {}


def _figures():
    from components.charts import break_even_figure, cost_figure, fit_cost_model
    from components.paths import paths_figure
    from components.race_panel import race_figures

    model = fit_cost_model([1, 2, 4, 8], [1.0, 1.1, 1.3, 1.8])
    layout = packed_layout(5, [6, 7, 8], 3, 10, 1)
    return {"mask": mask_figure([layout], lambda ids: [f"t{i}" for i in ids]), "empty": empty_figure("none"),
            "cost": cost_figure(model, [("packed", 3, 2.0), ("ar", 3, 1.0)]),
            "break-even": break_even_figure(model, [("packed", 3, 2.0, 5)]), "paths": paths_figure(None, None, None),
            **{f"race {i}": f for i, f in enumerate(race_figures([]))}}


@pytest.mark.parametrize("name", ["mask", "empty", "cost", "break-even", "paths", "race 0", "race 1", "race 2"])
def test_every_chart_carries_both_themes_and_names_no_background_itself(name):
    figure = _figures()[name].to_plotly_json()
    layout = figure["layout"]
    assert layout["template"] == template(LIGHT)
    assert layout["meta"]["dark"]["template"] == template(DARK)
    assert len(layout["meta"]["dark"]["data"]) == len(figure["data"])
    for key in ("paper_bgcolor", "plot_bgcolor", "font"):
        assert key not in layout, (name, key)  # else the template's colour would not apply
    for shape in layout.get("shapes", []):
        assert "color" not in shape.get("line", {}), (name, shape)  # the theme's line colour


def test_the_mask_figure_carries_its_dark_cell_colours():
    figure = _figures()["mask"].to_plotly_json()
    dark = figure["layout"]["meta"]["dark"]["data"]
    heat = figure["data"][0]
    assert heat["type"] == "heatmap"
    assert {c for _, c in heat["colorscale"]} == set(cell_colours(LIGHT))
    assert {c for _, c in dark[0]["colorscale"]} == set(cell_colours(DARK))
    keys = [(t["marker"]["color"], d["marker"]["color"]) for t, d in zip(figure["data"][1:], dark[1:])]
    assert keys[0] == (cell_colours(LIGHT)[0], cell_colours(DARK)[0])  # the legend's blocked square, both themes
    assert keys[-1] == (chart_colours(LIGHT).back, chart_colours(DARK).back)  # the cached prefix's
