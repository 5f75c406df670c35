"""Benchmark: bootstrap on synthetic data, CSV/summary agreement, a full two-prompt run, one-line errors."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import tiny_llama

from packed_ss import stats
from packed_ss.bench.cli import main
from packed_ss.bench.plan import ALL_SCHEDULES, BenchConfig, BenchError, Prompt, parse_block_sizes, plan_runs
from packed_ss.bench.report import write_outputs
from packed_ss.bench.run import run_benchmark
from packed_ss.bench.summary import compare, read_examples, summarize


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text(json.dumps({"id": "first", "prompt": "w1 w2 w3"}) + "\n" + json.dumps({"prompt": "w4 w5"}) + "\n")
    return path


# --- statistics -------------------------------------------------------------------------------------
def test_bootstrap_recovers_a_known_ratio():
    rng = np.random.default_rng(1)
    n = 80
    tokens = rng.integers(50, 300, n).astype(float)
    wall_b = tokens / 100 * rng.lognormal(0, 0.2, n)  # baseline: ~100 tokens/s, prompt-dependent
    wall_a = wall_b / 1.25 * rng.lognormal(0, 0.05, n)  # A is 1.25x faster up to per-prompt noise
    observed = np.column_stack([tokens, wall_a, tokens, wall_b])
    sums = stats.bootstrap_sums(observed, 20_000, seed=0)
    ratio = stats.ratio_of_ratios(sums, observed, 0, 1, 2, 3)
    assert ratio.contains(1.25) and ratio.low < ratio.estimate < ratio.high
    assert ratio.high - ratio.low < 0.1 and ratio.n == n


def test_bootstrap_is_paired_and_exact_without_noise():
    x = np.arange(1, 11, dtype=float)
    observed = np.column_stack([x, x, 2 * x])
    sums = stats.bootstrap_sums(observed, 500, seed=3)
    assert np.array_equal(sums[:, 0], sums[:, 1])  # same resampled indices for every column
    assert np.allclose(sums[:, 2], 2 * sums[:, 0])
    exact = stats.ratio_of_ratios(sums, observed, 2, 0, 1, 0)  # (2x / x) / (x / x) = 2 in every resample
    assert exact.estimate == exact.low == exact.high == pytest.approx(2.0)
    assert np.array_equal(stats.bootstrap_sums(observed, 500, seed=3), sums)
    with pytest.raises(ValueError):
        stats.bootstrap_sums(np.zeros((0, 2)))


def test_compare_on_a_synthetic_frame_uses_aggregate_sums():
    rows = []
    for i, (tokens, wall) in enumerate([(10, 1.0), (30, 1.0), (20, 2.0)]):
        for schedule, factor in (("packed", 0.5), ("linear", 1.0)):
            rows.append({"prompt_index": i, "schedule": schedule, "tokens": tokens, "nfe": tokens / 2,
                         "wall_s": wall * factor, "model_s": 0.0, "other_s": 0.0})
    result = compare(pd.DataFrame(rows), "packed", "linear", [0, 1, 2], resamples=1000)
    assert result["throughput_ratio"]["estimate"] == pytest.approx(2.0)
    assert result["time_per_nfe_ratio"]["estimate"] == pytest.approx(0.5)
    assert result["tokens_per_nfe_ratio"]["low"] == pytest.approx(1.0)
    assert result["wall_difference_s"]["estimate"] == pytest.approx(-4.0 / 2 / 3)


# --- planning and parsing ---------------------------------------------------------------------------
def test_schedule_order_rotates_between_prompts():
    config = BenchConfig(schedules=("ar", "linear", "packed"), warmup=False)
    units = plan_runs(config, 3)
    orders = [[u.schedule for u in units if u.prompt_index == i] for i in range(3)]
    assert orders == [["ar", "linear", "packed"], ["linear", "packed", "ar"], ["packed", "ar", "linear"]]


def test_block_size_spec():
    assert parse_block_sizes("8") == (8, ())
    assert parse_block_sizes("linear=8,quadratic=4, packed=8") == (8, (("linear", 8), ("quadratic", 4), ("packed", 8)))
    assert parse_block_sizes("16,quadratic=4") == (16, (("quadratic", 4),))
    for bad in ("cubic=4", "linear=x", "1", "linear=4,linear=8", ""):
        with pytest.raises(BenchError):
            parse_block_sizes(bad)


# --- full runs --------------------------------------------------------------------------------------
def test_two_prompt_run_of_every_schedule_and_csv_summary_agree(tiny_model_dir, prompt_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["--model", str(tiny_model_dir), "--prompts", str(prompt_file), "--max-new-tokens", "10",
                 "--block-size", "4,quadratic=3", "--probe-block-sizes", "2,4", "--out", str(out), "--threads", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Paired comparisons" in captured.out
    for name in ("examples.csv", "probe.csv", "summary.json", "summary.md", "report.html"):
        assert (out / name).is_file()
    examples = read_examples(out / "examples.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert len(examples) == 2 * len(ALL_SCHEDULES) and set(examples["schedule"]) == set(ALL_SCHEDULES)
    assert examples["token_hash"].str.len().eq(16).all()
    assert np.allclose(examples["model_s"] + examples["other_s"], examples["wall_s"])
    for schedule, rows in examples.groupby("schedule"):
        s = summary["schedules"][schedule]
        assert s["tokens_per_nfe"] == pytest.approx(rows["tokens"].sum() / rows["nfe"].sum())
        assert s["throughput"] == pytest.approx(rows["tokens"].sum() / rows["wall_s"].sum())
        assert s["wall_mean_s"] == pytest.approx(rows["wall_s"].mean())
    config = BenchConfig(block_sizes=(("quadratic", 3),), default_block_size=4, max_new_tokens=10,
                         probe_block_sizes=(2, 4))
    again = summarize(examples, config, read_examples(out / "probe.csv"), summary["meta"])
    assert again == {**summary, "meta": again["meta"]}  # the CSVs alone reproduce every statistic
    packed_linear = summary["comparisons"][0]
    assert (packed_linear["numerator"], packed_linear["denominator"]) == ("packed", "linear")
    by = summary["lossless"]["by_schedule"]
    assert all(by[s]["differing"] == 0 for s in ("linear", "quadratic", "packed", "lookup", "packed-mixed", "partial"))
    assert "diffusion" in by  # reported, whatever its count
    assert summary["decomposition"]["by_schedule"]["linear"]["total"] == pytest.approx(1.0)
    assert {(r["schedule"], r["block_size"]) for r in summary["probe"]} == {
        (s, b) for s in ("linear", "quadratic", "packed", "diffusion", "lookup", "packed-mixed", "partial") for b in (2, 4)}
    page = (out / "report.html").read_text()
    assert len(page) > 1_000_000 and "<script src=" not in page  # plotly.js embedded: works offline


@pytest.mark.parametrize("stop_at", ["warm-up ar", "warm-up packed", "main", "after the runs"])
def test_a_benchmark_stopped_anywhere_returns_what_it_measured(stop_at, tmp_path):
    """A time limit (RunsStopped from ``progress``) before, during or after the warm-up, or after the last run."""
    from packed_ss.bench.run import RunsStopped

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    prompts = [Prompt("a", "w1 w2 w3"), Prompt("b", "w4 w5")]
    config = BenchConfig(schedules=("ar", "packed"), max_new_tokens=6, resamples=200)

    def progress(done, total, label):
        if label == stop_at or (stop_at == "main" and done == 1) or (stop_at == "after the runs" and label == "done"):
            raise RunsStopped("stopped at the time limit")

    result = run_benchmark(model, prompts, config, progress)
    measured = {"warm-up ar": 0, "warm-up packed": 0, "main": 1, "after the runs": 4}[stop_at]
    assert result.interrupted and len(result.examples) == measured
    assert result.summary["meta"]["compile_s_warm_up"] == 0.0  # eager: nothing compiled, and no missing figure
    write_outputs(result, tmp_path)


def test_a_time_limit_inside_a_run_stops_it_at_the_next_iteration():
    """An in-app benchmark checked its time limit only between runs (32.9 s against a shorter limit at B = 2); now
    ``between`` runs before every iteration: the run it cuts is dropped and nothing computes after it."""
    from packed_ss.bench.run import RunsStopped

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    prompts = [Prompt("a", "w1 w2 w3"), Prompt("b", "w4 w5")]
    config = BenchConfig(schedules=("ar", "packed"), max_new_tokens=6, warmup=False, resamples=200)
    checks, runs = [], []

    def progress(done, total, label):
        runs.append(done)

    def between():
        checks.append(runs[-1])
        if len(runs) == 2 and checks.count(1) == 3:  # the third iteration of the second run
            raise RunsStopped("stopped at the time limit")

    result = run_benchmark(model, prompts, config, progress, between=between)
    assert result.interrupted and len(result.examples) == 1  # the first run kept, the cut one dropped
    assert checks.count(1) == 3 and runs == [0, 1], "the benchmark went on after the stop"
    assert checks.count(0) >= 6  # every iteration of the first run was checked (AR: one per token)


def test_interrupt_keeps_what_was_measured(tmp_path):
    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    prompts = [Prompt("a", "w1 w2 w3"), Prompt("b", "w4 w5"), Prompt("c", "w6")]
    config = BenchConfig(schedules=("ar", "linear", "packed"), max_new_tokens=6, warmup=False, resamples=200)

    def progress(done, total, label):
        if done == 5:
            raise KeyboardInterrupt

    result = run_benchmark(model, prompts, config, progress)
    assert result.interrupted and len(result.examples) == 5
    assert result.summary["meta"]["prompts_measured"] == 1 and result.summary["meta"]["prompts_incomplete"] == 1
    paths = write_outputs(result, tmp_path)
    assert len(pd.read_csv(paths["examples"])) == 5
    assert "Interrupted" in paths["summary_md"].read_text()


@pytest.mark.parametrize("args,message", [
    (["--schedules", "ar,cubic"], "unknown schedule"),
    (["--block-size", "linear=four"], "not an integer"),
    (["--block-size", "cubic=4"], "unknown schedule"),
    (["--prompts", "/nonexistent/prompts.jsonl"], "does not exist"),
    (["--limit", "0"], "--limit"),
    (["--limit", "two"], "--limit"),
    (["--samples", "3"], "needs --temperature"),
    (["--probe-block-sizes", "4,99"], "block size"),
    (["--model", "/nonexistent/model"], "does not exist"),
    (["--seed", "-1"], "--seed"),  # the bootstrap's numpy generator would fail after all the runs
    (["--seed", str(2**70)], "--seed"),
    (["--temperature", "inf"], "finite"),
    (["--dtype", "float8"], "--dtype"),
    (["--device", "nonsense"], "--device"),
    (["--schedules", "ar,ar-eager", "--no-compile"], "compiling is off"),
    (["--schedules", "ar,ar-eager"], "this model's calls are eager"),  # compile's default on a CPU: eager calls
])
def test_bad_arguments_exit_with_one_line(tiny_model_dir, prompt_file, args, message, capsys, tmp_path):
    base = ["--model", str(tiny_model_dir), "--prompts", str(prompt_file), "--max-new-tokens", "4",
            "--out", str(tmp_path / "out")]  # not the project's bench-out, which may hold results already
    code = main(base + args)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


# --- the app's Benchmark view -----------------------------------------------------------------------
def test_benchmark_view_runs_a_small_benchmark_and_shows_saved_reports(prompt_file, tmp_path):
    import gradio as gr

    from tabs.benchmark import build_benchmark_tab
    from serve.benchmark import UPLOAD, read_summary_file, run_small_benchmark

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    loader = lambda name: model  # noqa: E731
    with gr.Blocks():
        tab = build_benchmark_tab(loader, ["tiny"], reports=())
    assert len(tab.plots) == 3
    seen = []
    markdown, figs, paths = run_small_benchmark(loader, "tiny", UPLOAD, str(prompt_file), 2, ["packed", "ar", "linear"],
                                                "4", 6, 0.0, 1, 0, lambda d, t, label: seen.append((d, t)))
    assert "Packed-SS / Linear-SS" in markdown and set(figs) == {"ratios", "decomposition", "block_size"}
    assert seen[-1] == (6, 6) and all(p.endswith(("html", "csv", "json", "md")) for p in paths)
    saved_md, _ = read_summary_file(Path(paths[0]).parent / "summary.json")
    assert saved_md == markdown
    with pytest.raises(BenchError, match="1 to"):
        run_small_benchmark(loader, "tiny", UPLOAD, str(prompt_file), 9, ["ar"], "4", 6, 0.0, 1, 0)

    def broken(name):
        raise ValueError("model folder 'x' does not exist")

    with pytest.raises(BenchError, match="does not exist"):
        run_small_benchmark(broken, "x", UPLOAD, str(prompt_file), 1, ["ar"], "4", 6, 0.0, 1, 0)


def test_out_that_is_a_file_is_refused_before_measuring(tiny_model_dir, prompt_file, capsys):
    code = main(["--model", str(tiny_model_dir), "--prompts", str(prompt_file), "--out", str(prompt_file)])
    err = capsys.readouterr().err
    assert code == 2 and "is a file" in err and len(err.strip().splitlines()) == 1


def test_benchmark_view_bad_inputs_are_one_line_errors(tmp_path):
    from serve.benchmark import HUMANEVAL, UPLOAD, load_report, run_small_benchmark

    def never(name):
        raise AssertionError("the model must not be loaded for a bad input")

    with pytest.raises(BenchError, match="no bundled report 'a\\\\x00b'"):
        load_report("a\x00b", root=tmp_path)
    for seed in (-1, 10**30):
        with pytest.raises(BenchError, match="--seed"):
            run_small_benchmark(never, "tiny", HUMANEVAL, None, 1, ["ar"], "4", 4, 0.0, 1, seed)
    with pytest.raises(BenchError, match="must be numbers"):
        run_small_benchmark(never, "tiny", HUMANEVAL, None, None, ["ar"], "4", 4, 0.0, 1, 0)
    upload = tmp_path / "upload-copy" / "mine.jsonl"
    upload.parent.mkdir()
    upload.write_text('{"prompt": "w1"}\nnot json\n')
    with pytest.raises(BenchError) as error:
        run_small_benchmark(never, "tiny", UPLOAD, str(upload), 1, ["ar"], "4", 4, 0.0, 1, 0)
    assert str(error.value).startswith("mine.jsonl:2") and str(upload.parent) not in str(error.value)


def test_benchmark_view_fits_report_figures_into_its_panels():
    import plotly.graph_objects as go

    from tabs.benchmark import panel_figure

    title = "Tokens/NFE at the measured block sizes (run with more)"
    report = go.Figure(go.Scatter(x=[1], y=[1]), layout=dict(title=title))
    fitted = panel_figure(report)
    assert fitted.layout.title.text == "Tokens/NFE at the measured block<br>sizes (run with more)"
    assert all(len(line) <= 36 for line in fitted.layout.title.text.split("<br>"))  # a third of the page
    assert fitted.layout.margin.t >= 30 + 18 * 2  # room above the plot for both lines
    assert fitted.layout.legend.orientation == "h"
    assert report.layout.title.text.endswith("sizes (run with more)")  # the report's own figure is unchanged
    assert panel_figure(None) is None


# --- issue 11 -----------------------------------------------------------------------------------------
def test_processes_of_one_launch_check_the_same_out_folder_at_once(tmp_path):
    """Reported in CI: two ranks of an accelerate launch probed --out with one shared file name; one deleted the
    other's probe, which then failed with 'No such file or directory'. Many checks at once must all pass."""
    from concurrent.futures import ThreadPoolExecutor

    from packed_ss.bench.cli import check_out_folder

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: check_out_folder(tmp_path / "shared"), range(400)))
    assert list((tmp_path / "shared").iterdir()) == []


def test_bad_out_folder_is_refused_before_loading_or_measuring(prompt_file, capsys):
    """The model does not exist either: the --out message comes first, so nothing was loaded or measured."""
    code = main(["--model", "/nonexistent/model", "--prompts", str(prompt_file), "--out", f"{prompt_file}/sub"])
    err = capsys.readouterr().err
    assert code == 2 and "--out" in err and len(err.strip().splitlines()) == 1


def test_tiny_temperature_and_bad_prompt_text_in_the_benchmark(tiny_model_dir, prompt_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["--model", str(tiny_model_dir), "--prompts", str(prompt_file), "--limit", "1", "--schedules",
                 "ar,packed", "--max-new-tokens", "4", "--temperature", "1e-308", "--out", str(out), "--resamples", "200"])
    first = capsys.readouterr().err
    assert code == 0, first
    assert (out / "summary.json").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "w1 \\ud800"}\n', encoding="utf-8")
    code = main(["--model", str(tiny_model_dir), "--prompts", str(bad), "--out", str(tmp_path / "o2")])
    err = capsys.readouterr().err
    assert code == 2 and "not valid Unicode" in err and len(err.strip().splitlines()) == 1
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"prompt": "café"}\n'.encode("latin-1"))
    assert main(["--model", str(tiny_model_dir), "--prompts", str(latin), "--out", str(tmp_path / "o3")]) == 2
    assert "not UTF-8 text" in capsys.readouterr().err


def test_benchmark_view_refuses_work_over_the_budget(prompt_file):
    from serve.benchmark import UPLOAD, run_small_benchmark

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    with pytest.raises(BenchError, match="model rows"):
        run_small_benchmark(lambda name: model, "tiny", UPLOAD, str(prompt_file), 2, ["quadratic"], "32", 100, 0.0, 1,
                            0, max_rows=10_000)
    markdown, _, _ = run_small_benchmark(lambda name: model, "tiny", UPLOAD, str(prompt_file), 1, ["ar"], "4", 2, 0.0,
                                         1, 0, max_rows=10_000, resamples=50)
    assert "Per schedule" in markdown  # within the row budget: it runs (the clock bounds its time: test_time_limit)


def test_reports_name_project_models_relative_to_the_project(tmp_path):
    from conftest import EMBEDDED

    from packed_ss.inputs import model_name

    assert model_name(EMBEDDED) == "assets/model" == model_name(f"{EMBEDDED}//")
    assert model_name(str(tmp_path)) == str(tmp_path) and model_name("nvidia/some-model") == "nvidia/some-model"
    saved = json.loads((EMBEDDED.parents[1] / "docs" / "bench-humaneval" / "summary.json").read_text())
    assert saved["meta"]["model"] == "assets/model"


def test_block_size_chart_ticks_every_measured_block_size():
    """B = 3 and 6 get their own ticks (a log axis in powers of two labelled only "4")."""
    import json
    from pathlib import Path

    from packed_ss.bench.report import figures

    saved = Path(__file__).resolve().parents[1] / "docs" / "bench-humaneval" / "summary.json"
    summary = json.loads(saved.read_text())
    summary["probe"] = [{"schedule": "packed", "block_size": b, "tokens_per_nfe": 1.0 + b / 10} for b in (3, 6)] + \
        [{"schedule": "linear", "block_size": 4, "tokens_per_nfe": 1.2}]
    assert list(figures(summary)["block_size"].layout.xaxis.tickvals) == [3, 4, 6]


def test_reports_carry_a_short_content_hash_of_a_local_model(tiny_model_dir, tmp_path):
    import shutil

    from packed_ss.inputs import model_fingerprint

    first = model_fingerprint(tiny_model_dir)
    assert len(first) == 12 and first == model_fingerprint(str(tiny_model_dir) + "/")
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    assert model_fingerprint(copy) == first  # content, not location
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    assert model_fingerprint(copy) != first
    assert model_fingerprint("nvidia/Nemotron-Labs-Diffusion-3B") == ""


def test_benchmark_takes_the_model_flags_of_the_cli(nld_dir, tmp_path):
    """--family and --drafter-lora work in the benchmark as in the CLI and the app (NLD fixture + adapter)."""
    from packed_ss.bench.cli import main

    out = tmp_path / "bench-nld"
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "w20 w21 w22 w23"}\n')
    assert main(["--prompts", str(prompts), "--schedules", "ar,packed", "--max-new-tokens", "8", "--block-size", "4",
                 "--model", str(nld_dir), "--family", "nemotron", "--drafter-lora", "linear_spec_lora",
                 "--resamples", "100", "--no-warmup", "--out", str(out)]) == 0
    import json

    summary = json.loads((out / "summary.json").read_text())
    assert summary["lossless"]["by_schedule"]["packed"]["differing"] == 0
    assert summary["config"]["drafter_lora"] is True


def test_any_order_model_benchmark_with_both_orders(tiny_any_order_dir, tiny_model_dir, prompt_file, tmp_path, capsys):
    """--order: ltr reproduces the model's own AR (a lossless check), confidence reports how often the order
    changed the output instead; schedules the model has no version of and confidence on a left-to-right
    model are refused in one line."""
    common = ["--model", str(tiny_any_order_dir), "--prompts", str(prompt_file), "--max-new-tokens", "12",
              "--block-size", "5", "--schedules", "ar,linear,quadratic,packed,diffusion", "--threads", "1",
              "--resamples", "200"]
    for order in ("ltr", "confidence"):
        out = tmp_path / order
        code = main(common + ["--order", order, "--out", str(out)])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["order"] == order and summary["meta"]["any_order"] is True
        by = summary["lossless"]["by_schedule"]
        assert all(by[s]["expected_zero"] == (order == "ltr") for s in ("linear", "quadratic", "packed"))
        if order == "ltr":
            assert all(by[s]["differing"] == 0 for s in ("linear", "quadratic", "packed"))
        else:
            assert "Outputs differing from the model's own left-to-right decoding" in captured.out
        assert f"verification order: {order}" in captured.out
    # refused after loading: one line, with no note: or threads: line before it
    assert main(common[:-2] + ["--schedules", "ar,lookup", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "cannot run on an any-order model" in err and len(err.strip().splitlines()) == 1
    assert main(["--model", str(tiny_model_dir), "--prompts", str(prompt_file), "--schedules", "ar,packed",
                 "--order", "confidence", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert "needs an any-order model" in err and len(err.strip().splitlines()) == 1


def test_a_runs_seed_depends_on_its_prompt_and_sample_alone_never_on_the_other_prompts():
    """Sharding, resuming or --limit must not change a prompt's runs at T > 0 (seed = hash(seed, prompt id, k))."""
    from packed_ss.bench.run import run_seed

    model = tiny_llama(vocab_size=20, seed=2, logit_scale=3.0)
    config = BenchConfig(schedules=("ar",), max_new_tokens=6, seed=2**32 - 1, warmup=False, temperature=1.0,
                         samples=2, resamples=10)
    both = run_benchmark(model, [Prompt("a", "w1 w2"), Prompt("b", "w3 w4")], config).examples
    alone = run_benchmark(model, [Prompt("b", "w3 w4")], config).examples
    columns = ["sample", "seed", "token_hash"]
    pd.testing.assert_frame_equal(both[both["prompt_id"] == "b"][columns].reset_index(drop=True),
                                  alone[columns].reset_index(drop=True))
    seeds = {run_seed(s, p, k) for s in (0, 2**32 - 1) for p in ("a", "b") for k in range(3)}
    assert len(seeds) == 12 and all(0 <= x <= 2**32 - 1 for x in seeds)


