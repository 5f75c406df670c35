"""The attention-mask plot reads on its own: every row labelled, keys grouped and named, cached prefix in
the legend, hover says visible or blocked (paper Appendix D.1)."""

from packed_ss.layout import packed_layout, quadratic_layout

from components.mask_plot import mask_figure

MASK = 1


def strings(ids):
    return [f"t{i}" for i in ids]


def axes(figure, n=""):
    layout = figure.to_dict()["layout"]
    return layout[f"xaxis{n}"], layout[f"yaxis{n}"]


def test_packed_rows_are_labelled_and_key_groups_named():
    layout = packed_layout(5, [6, 7, 8], 3, 10, MASK)
    figure = mask_figure([layout], strings)
    x, y = axes(figure)
    assert y["ticktext"][0] == "verify · 't5' @ 10" and y["ticktext"][4] == "draft · 't5' @ 10"
    assert y["ticktext"][5] == "draft · 't1' @ 11" and len(y["ticktext"]) == layout.rows
    assert y["title"]["text"].startswith("query rows")
    assert x["ticktext"] == ["cache ×10", "verify keys (4)", "draft keys (4)"]
    heat = figure.to_dict()["data"][0]
    assert heat["text"][0][2] == "blocked" and heat["text"][0][1] == "visible"  # row 0 sees itself, not row 1
    assert heat["text"][4][0] == "visible" and heat["text"][4][1] == "blocked"  # draft row: cache, not verify keys
    names = [t.get("name", "") for t in figure.to_dict()["data"][1:]]
    assert any("cached prefix" in name for name in names)


def test_quadratic_keys_are_grouped_per_branch():
    layout = quadratic_layout(5, [6, 7, 8], 3, 10, MASK)
    x, y = axes(mask_figure([layout], strings))
    assert x["ticktext"][:3] == ["cache ×10", "verify keys (4)", "branch h=0 keys (4)"]
    assert "branch h=3 keys (4)" in x["ticktext"]
    assert all(not t.isdigit() for t in x["ticktext"])  # no bare position ids such as "10, 14, 11, 15"
    big = quadratic_layout(5, list(range(6, 21)), 15, 10, MASK)  # B = 16: 272 rows, region labels
    x, y = axes(mask_figure([big], strings))
    assert len(x["ticktext"]) <= 13 and "verify rows (16)" in y["ticktext"]


def test_quadratic_marks_the_branch_its_verification_selected():
    layout = quadratic_layout(5, [6, 7, 8], 3, 10, MASK)
    x, y = axes(mask_figure([layout], strings, selected_branch=2))
    assert "branch h=2 ✓ selected keys (4)" in x["ticktext"] and "branch h=1 keys (4)" in x["ticktext"]
    assert "branch h=2 ✓ · 't1' @ 13" in y["ticktext"] and "branch h=0 · 't1' @ 11" in y["ticktext"]
