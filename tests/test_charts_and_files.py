"""Charts that read, controls that apply and results to keep (issue 30, items 5, 6 and 8), without a browser: the
shared palette's colours stay apart, the ratio and block-size charts tell every trace apart, report.html carries
plotly.js once, the race charts' legends sit under the whole chart, an any-order lane's expected difference is
neutral, the scripted drafter's q shows only where it applies, and the Step and Race downloads hold what they say,
as the session's own files, one per kind, bounded.
(The browser checks of the same: tests/test_browser_layout.py.)"""

import csv
import io
import itertools
import json
from pathlib import Path

import pytest
from helpers import tiny_llama

from packed_ss.bench import palette

ROOT = Path(__file__).resolve().parents[1]
SAVED = ROOT / "docs" / "bench-humaneval" / "summary.json"


def _summary() -> dict:
    return json.loads(SAVED.read_text())


# --- the palette -------------------------------------------------------------------------------------
def test_every_schedule_has_its_own_colour_and_symbol_clearly_apart():
    from packed_ss.bench.plan import ALL_SCHEDULES
    from packed_ss.schedules import REGISTRY

    colours = palette.SCHEDULE_COLORS
    assert set(REGISTRY) | set(ALL_SCHEDULES) <= set(colours) == set(palette.SCHEDULE_SYMBOLS)
    assert len(set(colours.values())) == len(colours) and len(set(palette.SCHEDULE_SYMBOLS.values())) == len(colours)
    closest = min((palette.distance(a, b), x, y) for (x, a), (y, b) in itertools.combinations(colours.items(), 2))
    assert closest[0] >= palette.MIN_DISTANCE >= 20, closest
    for name, colour in colours.items():  # every line and marker stands out on a white plot (WCAG 1.4.11)
        assert palette.contrast(colour, "#ffffff") >= 3, (name, colour)


def test_the_colour_distance_flags_the_look_alikes_of_the_old_palette():
    # The pairs the issue names, from plotly's Dark24: far under the palette's least distance.
    assert palette.distance("#DA16FF", "#FB00D1") < 10 and palette.distance("#E15F99", "#FC0080") < 10
    assert palette.distance("#1f6fd1", "#1f6fd1") == 0
    assert palette.distance("#000000", "#ffffff") == pytest.approx(100, abs=0.5)
    assert palette.distance("#e66100", "#1a9641") == pytest.approx(palette.distance("#1a9641", "#e66100"))
    assert palette.contrast("#000000", "#ffffff") == pytest.approx(21)


def test_the_app_draws_schedules_in_the_reports_colours():
    from components.style import SCHEDULE_COLORS

    assert SCHEDULE_COLORS is palette.SCHEDULE_COLORS


# --- the benchmark report -------------------------------------------------------------------------------
def test_ratio_chart_traces_are_told_apart_by_colour_and_symbol():
    from packed_ss.bench.report import figures

    summary = _summary()
    traces = figures(summary)["ratios"].data
    assert len(traces) == len(summary["comparisons"]) > 10
    keys = [(t.marker.color, t.marker.symbol) for t in traces]
    assert len(set(keys)) == len(keys), keys
    for trace, c in zip(traces, summary["comparisons"]):  # a schedule's colour is the same in every chart
        assert trace.marker.color == palette.schedule_color(c["numerator"])
        assert trace.marker.symbol == palette.schedule_symbol(c["denominator"])
        assert "…" not in trace.name and "..." not in trace.name


def test_block_size_chart_keeps_coinciding_points_visible():
    from packed_ss.bench.report import figures

    summary = _summary()
    for name in ("quadratic", "packed"):  # the same B and the same tokens/NFE: the same point
        summary["schedules"][name].update(block_size=6, tokens_per_nfe=1.5)
    chart = figures(summary)["block_size"]
    by_name = {t.name: t for t in chart.data}
    quadratic, packed = by_name["Quadratic-SS"], by_name["Packed-SS"]
    assert list(quadratic.y) == list(packed.y) and list(quadratic.customdata) == list(packed.customdata) == [6]
    span = max(t.customdata[0] for t in chart.data) - min(t.customdata[0] for t in chart.data)
    assert abs(quadratic.x[0] - packed.x[0]) >= 0.02 * span  # dodged sideways, a visible step on the axis
    assert by_name["Packed-SS + n-gram"].x[0] == by_name["Packed-SS + n-gram"].customdata[0]  # alone at its B
    assert quadratic.marker.symbol != packed.marker.symbol
    xs = [t.x[0] for t in chart.data]
    assert len(set(xs)) == len(xs)
    assert set(chart.layout.xaxis.tickvals) == {t.customdata[0] for t in chart.data}  # ticks at the true B

    summary["probe"] = [{"schedule": s, "block_size": b, "tokens_per_nfe": 1.2} for s in ("linear", "packed")
                        for b in (4, 8)]
    probe = figures(summary)["block_size"]
    first, second = probe.data
    assert list(first.y) == list(second.y) and all(a != b for a, b in zip(first.x, second.x))
    assert list(probe.layout.xaxis.tickvals) == [4, 8]


def test_report_html_holds_plotly_js_once_or_links_it():
    from plotly.offline import get_plotlyjs

    from packed_ss.bench.report import report_html

    summary = _summary()
    bundle = len(get_plotlyjs().encode())
    inline = report_html(summary)
    assert inline.count("* plotly.js v") == 1  # the library's banner: one copy for the three figures
    assert inline.count('class="plotly-graph-div"') == 3
    assert len(inline.encode()) < bundle + 200_000, len(inline.encode())
    linked = report_html(summary, "cdn")
    assert linked.count("* plotly.js v") == 0 and linked.count('src="https://cdn.plot.ly/') == 1
    assert len(linked.encode()) < 200_000
    with pytest.raises(ValueError, match="plotlyjs"):
        report_html(summary, "none")


def test_the_paper_report_is_refused_a_linked_plotly_js_in_one_line(capsys):
    from packed_ss.bench.cli import main

    assert main(["--task", "humaneval", "--plotlyjs", "cdn", "--out", "unused-out"]) == 2
    err = capsys.readouterr().err
    assert "--plotlyjs applies to runs without --task" in err and len(err.strip().splitlines()) == 1


def test_benchmark_panels_wrap_long_legend_entries():
    from tabs.benchmark import LEGEND_WIDTH, panel_figure, wrap_label

    assert wrap_label("AR / Linear-SS") == "AR / Linear-SS"
    wrapped = wrap_label("Packed-SS + n-gram / transformers prompt lookup")
    assert wrapped == "Packed-SS + n-gram /<br>transformers prompt lookup"
    long = "transformers greedy, static cache, compiled / transformers prompt lookup"
    assert all(len(line) <= LEGEND_WIDTH + 2 for line in wrap_label(long).split("<br>"))
    assert wrap_label(long).replace("<br>", " ").replace("  ", " ") == long
    from packed_ss.bench.report import figures

    fitted = panel_figure(figures(_summary())["ratios"])
    assert fitted.layout.legend.yref == "container" and fitted.layout.legend.yanchor == "bottom"
    assert any("<br>" in t.name for t in fitted.data)


# --- the race panel ------------------------------------------------------------------------------------
def _lanes(order: str = "ltr"):
    from packed_ss.config import DecodeConfig
    from packed_ss.engine import generate
    from serve.lanes import lane_from_run

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    config = DecodeConfig(block_size=3, max_new_tokens=8)
    ar = generate(model, [4, 5, 6], config, "ar")
    other = generate(model, [4, 5, 7], config, "packed")  # another prompt: another output, differing from AR's
    return [lane_from_run(ar, "AR", ar.token_ids), lane_from_run(other, "Packed-SS", ar.token_ids)]


def test_race_chart_legends_sit_under_the_whole_chart():
    from components.race_panel import race_figures

    for figure in race_figures(_lanes()):
        legend = figure.layout.legend
        assert (legend.yref, legend.y, legend.yanchor, legend.orientation) == ("container", 0, "bottom", "h")
        assert figure.layout.xaxis.automargin is True
        assert figure.layout.xaxis.title.text


def test_lane_badges_are_neutral_where_differing_from_ar_is_expected():
    from components.race_panel import lanes_html

    lanes = _lanes()
    strings = lambda ids: [str(i) for i in ids]  # noqa: E731
    assert lanes[1].first_difference is not None
    left_to_right = lanes_html(lanes, float("inf"), strings, True)
    assert 'class="badge bad" data-differs="bad"' in left_to_right  # a lossless lane differing greedily: a fault
    confidence = lanes_html(lanes, float("inf"), strings, True, order="confidence")
    assert "badge bad" not in confidence and 'class="badge info" data-differs="expected"' in confidence
    assert "expected in the confidence order" in confidence
    sampled = lanes_html(lanes, float("inf"), strings, False)
    assert "badge bad" not in sampled
    assert f'background:{palette.schedule_color("packed")}' in left_to_right  # the lane's key, as in the charts


# --- controls that apply -------------------------------------------------------------------------------
def test_the_scripted_drafters_q_applies_to_the_scripted_drafter_on_a_left_to_right_model_only():
    from tabs.settings import quality_shown

    assert quality_shown("scripted", any_order=False)
    assert not quality_shown("scripted", any_order=True)
    assert not quality_shown("model", any_order=False) and not quality_shown(None, any_order=False)


def test_the_benchmark_offers_the_order_for_any_order_models_only():
    import gradio as gr

    from tabs.benchmark import build_benchmark_tab

    with gr.Blocks():
        ltr = build_benchmark_tab(lambda name: None, ["plain"], reports=(), any_order=lambda n: n == "ao")
        both = build_benchmark_tab(lambda name: None, ["ao", "plain"], reports=(),
                                   any_order=lambda n: n == "ao")
        unknown = build_benchmark_tab(lambda name: None, ["plain"], reports=())
    assert ltr.order.visible is False and both.order.visible is True and unknown.order.visible is True


# --- downloads -------------------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    from serve.uploads import SessionFiles

    (tmp_path / "uploads").mkdir()
    return SessionFiles(root=tmp_path / "sessions", uploads=tmp_path / "uploads")


def _race_result(lanes):
    from packed_ss.config import DecodeConfig
    from serve.race import RaceResult
    from serve.settings import RunSettings

    settings = RunSettings(model="tiny", prompt="w4 w5 w6", schedule="packed", config=DecodeConfig(block_size=3))
    return RaceResult(settings=settings, lanes=tuple(lanes), greedy=True, compute_s=0.1, prompt_tokens=3)


def test_the_race_table_as_csv_has_one_row_per_lane(files):
    from serve.downloads import RACE_COLUMNS, offer_race, race_csv

    result = _race_result(_lanes())
    rows = list(csv.DictReader(io.StringIO(race_csv(result))))
    assert [r["schedule"] for r in rows] == ["ar", "packed"] and list(rows[0]) == list(RACE_COLUMNS)
    assert rows[0]["block_size"] == "" and rows[1]["block_size"] == "3"
    assert rows[0]["identical_to_ar"] == "True" and rows[1]["identical_to_ar"] == "False"
    assert int(rows[1]["tokens"]) == 8 and float(rows[1]["tokens_per_nfe"]) > 0
    table, whole = offer_race(files, "visitor", result)
    assert Path(table).name == "race-table.csv" and Path(whole).name == "race.json"
    assert Path(table).read_text() == race_csv(result)
    assert json.loads(Path(whole).read_text())["lanes"]["packed"]["tokens"] == 8


def test_a_step_runs_records_as_json():
    from packed_ss.config import DecodeConfig
    from serve.downloads import step_records
    from serve.settings import RunSettings
    from serve.step import StepRun

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0, eos=False)
    settings = RunSettings(model="tiny", prompt="w4 w5 w6", schedule="packed",
                           config=DecodeConfig(block_size=3, max_new_tokens=8))
    run = StepRun(settings, model)
    for _ in range(3):
        assert run.step()
    run.back()
    records = json.loads(json.dumps(step_records(run), allow_nan=False))
    assert records["settings"]["schedule"] == "packed" and records["settings"]["config"]["block_size"] == 3
    assert records["iterations_done"] == 3 and records["iteration_shown"] == 2 and len(records["records"]) == 3
    assert [r["index"] for r in records["records"]] == [1, 2, 3]
    assert records["metrics"]["tokens"] == sum(len(r["appended"]) for r in records["records"])
    assert records["metrics"]["tokens"] == sum(r["advance"] for r in records["records"])  # A_t: what was appended
    assert all(r["cut"] == 0 for r in records["records"])  # the run has not stopped: nothing was cut
    assert records["metrics"]["nfe"] == sum(len(r["calls"]) for r in records["records"])
    call = records["records"][1]["calls"][0]
    assert call["rows"] == 6 and set(call) == {"name", "rows", "cached", "model_ms", "adapter_selected",
                                               "adapter_evaluated"}


def test_downloads_are_the_sessions_own_one_per_kind_and_bounded(files, monkeypatch):
    from serve import downloads
    from serve.errors import UserError

    first = Path(downloads.offer(files, "a", "step-records.json", '{"n": 1}', "step-records"))
    assert first.is_file() and files.count("a") == 1
    assert files.open("a", str(first)) == first
    with pytest.raises(UserError, match="is not a file you uploaded in this session"):
        files.open("b", str(first))
    second = Path(downloads.offer(files, "a", "step-records.json", '{"n": 2}', "step-records"))
    assert second.is_file() and not first.exists() and files.count("a") == 1  # replaced, not piled up
    table = Path(downloads.offer(files, "a", "race-table.csv", "schedule\nar\n", "race-table"))
    assert files.count("a") == 2
    monkeypatch.setattr(downloads, "MAX_DOWNLOAD_BYTES", 10)
    with pytest.raises(UserError, match="more than the"):
        downloads.offer(files, "a", "step-records.json", "x" * 11, "step-records")
    assert second.is_file()  # a refused export keeps the earlier file
    files.forget("a")
    assert not second.exists() and not table.exists() and files.count("a") == 0


def test_every_legend_entry_of_the_timing_chart_has_a_bar():
    """HF greedy and HF lookup were listed in the legend with no bar (issue 53): timed as one call, they now have
    a grey bar of their whole time."""
    import json

    from packed_ss.bench.report import figures

    summary = json.loads((Path(__file__).resolve().parents[1] / "docs/bench-humaneval/summary.json").read_text())
    chart = figures(summary)["decomposition"]
    for trace in chart.data:
        assert any(y is not None for y in trace.y), trace.name
    whole = next(trace for trace in chart.data if trace.name.startswith("whole time"))
    assert {x for x, y in zip(whole.x, whole.y) if y is not None} == {"HF greedy", "HF lookup"}


def test_the_break_even_under_a_noisy_fit_is_never_below_one_token_per_call():
    """With the fit's error as large as a one-row call, Explain read "the break-even could be anywhere above 0.14":
    fewer tokens per call than any run ever commits (every iteration commits at least one token)."""
    from components.charts import CostModel, judge

    noisy = CostModel(1.0, 0.01, 20, 1, 64, 2.0)  # a one-row call 1.01 ms, the RMS error 2 ms
    packed = judge("packed", 3, 1.5, noisy, [])
    assert packed.startswith("cannot judge") and "above 0." not in packed, packed
    assert "at least 1 token per call (1.00 tokens/NFE)" in packed, packed
    linear = judge("linear", 3, 1.5, noisy, [])
    assert "at least 1 token per 2 calls (0.50 tokens/NFE)" in linear, linear
    wide = judge("packed", 7, 1.5, CostModel(0.5, 0.5, 20, 1, 64, 1.0), [])  # calls of 16 rows cost 8.5 ms
    assert "anywhere above 3.75 tokens/NFE" in wide, wide
