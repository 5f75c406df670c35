"""The Benchmark tab: show a saved benchmark report, or run a small one (few prompts).

:func:`build_benchmark_tab` creates the widgets inside the caller's ``gr.Blocks``/``gr.Tab`` context and
wires their events. The work is done by two plain functions of :mod:`serve.benchmark` that the UI only
calls: :func:`~serve.benchmark.load_report` (a bundled ``summary.json`` -> markdown and figures) and
:func:`~serve.benchmark.run_small_benchmark` (measure, write the files to a fresh temporary folder, return
markdown, figures and file paths). User errors become ``gr.Error`` with a one-line message. Files come only from
the session's own uploads and go to it only (:class:`serve.uploads.SessionFiles`).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from components.style import error_html, legend_below
from components.theme import themed
from packed_ss.bench.plan import ALL_SCHEDULES, BenchError
from packed_ss.bench.report import few_prompts_warning
from packed_ss.bench.run import RunsStopped
from packed_ss.inputs import model_name as report_model_name

from serve.benchmark import (HUMANEVAL, MAX_NEW_TOKENS, MAX_PROMPTS, NOTHING_FINISHED, REPORTS, ROOT, UPLOAD,
                             against_bundled, bundled_report, load_report, read_summary_file, report_files,
                             run_small_benchmark)
from serve.errors import refused
from serve.uploads import SessionFiles

HEAVY_S = 60.0  # predicted seconds a benchmark is admitted at on a server without a time limit (always heavy)
RUN_HOLD_S = 3.0  # seconds a timed run may hold the compute gate while other requests wait (then the runs stop)
QUIET_S = 0.3  # a run starts once other requests have left the gate alone this long (a short one takes several turns)

FIGURES = ("ratios", "decomposition", "block_size")
LEGEND_WIDTH = 30  # characters per line of a legend entry in a third of the page
TITLE_WIDTH = 36  # characters per line of a title in a third of the page (14 px)
PANEL_HEIGHT = 640  # px: a panel's least height
LEGEND_LINE_PX = 19  # px per line of a legend entry
PANEL_FRAME_PX = 140  # px of a panel outside its plot and legend (title, tilted tick labels)


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
    order: gr.Radio


def wrap_label(text: str, width: int = LEGEND_WIDTH) -> str:
    """A legend entry broken onto lines of about ``width`` characters (``<br>``, which plotly draws as a line break):
    after a comparison's " / " first, else between words. Short entries stay as they are."""
    if len(text) <= width:
        return text
    if " / " in text:
        left, right = text.split(" / ", 1)
        return f"{wrap_label(left, width)} /<br>{wrap_label(right, width)}"
    cut = text.rfind(" ", 0, width + 1)
    if cut <= 0:
        return text  # one long word: left whole
    return f"{text[:cut]}<br>{wrap_label(text[cut + 1:], width)}"


def panel_figure(figure):
    """A report figure fitted to one of the view's three side-by-side panels (a copy; None stays None).

    The report's titles and right-hand legends are sized for a full-width page; in a third of the page the
    titles were cut off, and so were long legend entries. Here a title wraps (:func:`wrap_label`), the legend goes
    below the plot (:func:`components.style.legend_below`) and its long entries wrap (:func:`wrap_label`); it follows
    the page's theme (:func:`components.theme.themed`).
    """
    if figure is None:
        return None
    import plotly.graph_objects as go

    fitted = go.Figure(figure)
    title = fitted.layout.title.text or ""
    fitted.for_each_trace(lambda trace: trace.update(name=wrap_label(trace.name)) if trace.name else None)
    # Plotly scrolls a legend taller than the plot: many comparisons make the panel tall enough for both.
    lines = sum(trace.name.count("<br>") + 1 for trace in fitted.data if trace.name and trace.showlegend is not False)
    height = max(PANEL_HEIGHT, PANEL_FRAME_PX + 2 * LEGEND_LINE_PX * lines)
    title = wrap_label(title, TITLE_WIDTH)
    top = 30 + 18 * (title.count("<br>") + 1)  # px above the plot: room for every line of the title
    fitted.update_layout(title=dict(text=title, font=dict(size=14)), height=height,
                         legend=legend_below(), margin=dict(l=50, r=10, t=top))
    fitted.update_xaxes(automargin=True, tickangle=-35)
    fitted.update_yaxes(automargin=True)
    for shape in fitted.layout.shapes:  # reference lines in the theme's line colour (the report's grey is for white)
        shape.line.color = None
    return themed(fitted)


EARLIER = "What is shown below (if anything) is an earlier report, not this request's."


def refusal(message: str, others: int) -> tuple:
    """The outputs of a refused event: the one-line message in the tab's status (its result area), saying that the
    ``others`` outputs (summary, charts, files), left as they were, are not this request's result."""
    return (error_html(f"{message}. {EARLIER}" if not message.endswith(".") else f"{message} {EARLIER}"),
            *(gr.skip() for _ in range(others)))


class RunTurns:
    """The compute gate's turns of one in-app benchmark's runs (each run holds the gate whole, so that its timing is
    its own). A run starts only once other requests have left the gate alone for :data:`QUIET_S` (a short request
    takes several turns: without this it waited a whole run for each); :meth:`hogging` says a run has held the gate
    over :data:`RUN_HOLD_S` while others wait.

    Args: turn: ``() -> context manager``, one turn of the gate. gate: that :class:`serve.limits.ComputeGate`
        (None: no one else to wait for; its thread count when the benchmark starts is kept for every run). check:
        called while waiting (it may raise to stop the runs)."""

    def __init__(self, turn: Callable[[], ContextManager], gate, check: Callable[[], None]):
        self.turn, self.gate, self.check = turn, gate, check
        # torch's thread count of every run of this benchmark: the gate's when it was admitted (a measurement made for
        # another request meanwhile changes later requests' count, not this benchmark's between two of its runs)
        self.threads = None if gate is None else gate.count
        self.held_since: float | None = None  # when the run in progress took the gate
        self.seen: int | None = None  # the gate's turn count at the end of this benchmark's last turn

    @contextmanager
    def __call__(self):
        while self.gate is not None and self.seen is not None:  # someone else computed since: let them finish
            started, idle = self.gate.activity()
            if started == self.seen or idle >= QUIET_S:
                break
            self.check()
            time.sleep(QUIET_S / 10)
        with self.turn():
            if self.threads is not None:
                self.gate.threads.apply(self.threads)
            self.held_since = time.monotonic()
            try:
                yield
            finally:
                self.seen = self.gate.activity()[0] if self.gate is not None else None
                self.held_since = None

    def hogging(self) -> bool:
        """Whether the run in progress has held the gate over :data:`RUN_HOLD_S` while another turn waits."""
        return (self.held_since is not None and time.monotonic() - self.held_since > RUN_HOLD_S
                and self.gate is not None and self.gate.waiting > 0)


@dataclass(frozen=True)
class BenchmarkHandlers:
    """The tab's two events: show a saved report, run a small benchmark (see :func:`build_benchmark_tab`).

    Both take their values raw (the events have ``preprocess=False``) and no file: a file reaches them only through
    the session's own upload event (:meth:`on_file`, a page event no API client can call), kept in ``files`` (this
    session's uploads and outputs, never deleted on read). Every refusal is one line in the tab's status
    (:func:`refusal`; the rest of the page keeps what it showed) and one in the server log."""

    load_model: Callable[[str], object]
    models: Sequence[str]
    reports: Sequence[str]  # the bundled reports the tab shows (serve.benchmark.REPORTS), under root
    root: str | Path
    turn: Callable[[], ContextManager]
    max_rows: int | None
    alive_for: Callable | None = None  # request -> "is its client still there?" (None: not checked)
    max_seconds: float | None = None  # predicted seconds one benchmark may take (None: no limit; also its time limit)
    files: SessionFiles = field(default_factory=SessionFiles)  # each session's uploads and outputs
    touch: Callable | None = None  # request -> its session (keeps it known, so its files go when it ends)
    admit_for: Callable | None = None  # request -> (seconds -> context manager): the server's heavy admission
    gate: object | None = None  # the compute gate ``turn`` takes (serve.limits.ComputeGate): who else waits or computes

    def session(self, request) -> str:
        """The session key of ``request`` (noted with ``touch``); "" without a request (a direct call)."""
        if request is not None and self.touch is not None:
            self.touch(request)
        return getattr(request, "session_hash", None) or ""

    def on_file(self, slot: str) -> Callable:
        """The handler of a file widget's upload and clear events: the session's file for ``slot`` ("summary" or
        "prompts") becomes the upload, moved into the session's own folder (:meth:`SessionFiles.choose`)."""

        def chosen(upload, request: gr.Request = None):
            try:
                self.files.choose(self.session(request), slot, upload)
            except Exception as error:  # noqa: BLE001 - one line, never a traceback
                raise gr.Error(refused(error, f"benchmark_{slot}"), print_exception=False) from None

        return chosen

    def on_clear(self, slot: str) -> Callable:
        """The handler of a file widget's clear event: the session keeps no file for ``slot``."""
        chosen = self.on_file(slot)

        def cleared(request: gr.Request = None):
            chosen(None, request)

        return cleared

    def show(self, name, request: gr.Request = None):
        """Show the session's uploaded summary.json, or else the bundled report ``name``, with the bundled report's
        files offered as downloads (an upload has no other files: the box is cleared)."""
        try:
            session = self.session(request)
            target = self.files.chosen(session, "summary")
            if target is not None:
                markdown, figs = read_summary_file(target)
                shown, served = f"the uploaded {target.name}", None
            else:
                markdown, figs = load_report(name if name is not None else "", self.reports, self.root)
                shown = str(name).strip()
                served = [self.files.publish(session, path.name, path, slot=f"report:{path.name}")
                          for path in report_files(bundled_report(name, self.reports, self.root))]
        except Exception as error:  # noqa: BLE001 - one line in the status, never a traceback
            return refusal(refused(error, "benchmark_show"), 2 + len(FIGURES))
        return (f"Showing {shown}.", markdown, *(panel_figure(figs.get(name)) for name in FIGURES), served)

    def run(self, model_name, source, n, chosen, blocks, length, temp, k, seed_value, order_value="ltr",
            request: gr.Request = None, progress=gr.Progress()):
        alive = self.alive_for(request) if self.alive_for is not None and request is not None else None
        deadline = None if self.max_seconds is None else time.monotonic() + self.max_seconds
        stopped = []  # (runs done, runs planned, why) once the time limit or the others' waiting ended the runs
        position = [0, 0]  # (runs done, runs planned) as last reported
        def check():  # before each run and each iteration inside one
            if alive is not None and not alive():  # the visitor left: free the queue for the next one
                raise BenchError("the visitor left: the benchmark was stopped")
            if deadline is not None and time.monotonic() > deadline:
                stopped.append((*position, f"at this server's time limit of {self.max_seconds:g} s",
                                "fewer schedules, prompts or new tokens"))
                raise RunsStopped(f"stopped at the time limit after {position[0]} of {position[1]} runs")
            if turns.hogging():
                stopped.append((*position, f"when a run had held the model over {RUN_HOLD_S:g} s while other "
                                           f"requests waited", "shorter prompts or fewer new tokens (on a shared server "
                                           "each run must fit in a few seconds; the command line has no such bound)"))
                raise RunsStopped("a run held the model too long while others waited")

        turns = RunTurns(self.turn, self.gate, check)

        def step(done, total, label):
            position[:] = [done, total]
            if done < total:
                check()
            progress((done, total), desc=label, unit="runs")

        try:
            session = self.session(request)
            if model_name is not None and not isinstance(model_name, str):
                raise BenchError(f"the model must be text, got {type(model_name).__name__}")
            name = (model_name or "").strip() or self.models[0]  # the report names the model actually used
            prompt_file = self.files.chosen(session, "prompts") if source == UPLOAD else None
            # Always heavy (it runs up to the time limit): one per visitor, and never more than the heavy slots.
            admit = self.admit_for(request) if self.admit_for is not None and request is not None else None
            with admit(self.max_seconds or HEAVY_S) if admit is not None else nullcontext():
                markdown, figs, paths = run_small_benchmark(self.load_model, name, source,
                                                            str(prompt_file) if prompt_file else None, n, chosen,
                                                            blocks, length, temp, k, seed_value, step, turn=turns,
                                                            max_rows=self.max_rows, order=order_value or "ltr",
                                                            between=check)
            measured = int(float(n))  # a valid count by now (run_small_benchmark checked it)
            if stopped:  # the main runs go prompt by prompt, every schedule (and sample) of one before the next
                per_prompt = len([s for s in ALL_SCHEDULES if s in chosen]) * (int(float(k)) if float(temp) > 0 else 1)
                measured = stopped[-1][0] // per_prompt
                if measured == 0:
                    raise BenchError(f"stopped {stopped[-1][2]} after "
                                     f"{stopped[-1][0]} of {stopped[-1][1]} runs, before any prompt was measured on "
                                     f"every schedule, so nothing can be compared: use {stopped[-1][3]}")
            paths = self.outputs(session, paths)
        except Exception as error:  # noqa: BLE001 - one line in the status, never a traceback
            if stopped and str(error).startswith(NOTHING_FINISHED):
                error = BenchError(f"stopped {stopped[-1][2]} before any run finished: use {stopped[-1][3]}")
            return refusal(refused(error, "benchmark_run"), 2 + len(FIGURES))
        note = ("Measured in the app (timings shared with other users are noisy); files below. "
                "Each run's token ids are hashed for the lossless check.")
        warning = few_prompts_warning(measured)
        if warning:
            note = f"⚠ {warning} " + note
        if stopped:
            note = (f"⚠ Stopped {stopped[-1][2]} after {stopped[-1][0]} of "
                    f"{stopped[-1][1]} runs: its comparisons rest on the {measured} prompt{'s' if measured != 1 else ''} "
                    f"measured on every schedule (use fewer prompts, schedules or new tokens for a whole one). "
                    + note)
        return (note + self.compared(paths), markdown, *(panel_figure(figs.get(name)) for name in FIGURES), paths)

    def compared(self, paths: Sequence[str]) -> str:
        """" " and :func:`serve.benchmark.against_bundled` of the run's summary.json (among ``paths``) and the first
        bundled report's; empty when either cannot be read (the run's note stands without it)."""
        try:
            live = next(json.loads(Path(p).read_text(encoding="utf-8"))
                        for p in paths if Path(p).name == "summary.json")
            bundled = json.loads((bundled_report(self.reports[0], self.reports, self.root) / "summary.json").read_text(
                encoding="utf-8"))
            text = against_bundled(live, bundled, self.reports[0])
        except (StopIteration, OSError, ValueError, BenchError, KeyError, TypeError, AttributeError, IndexError):
            return ""
        return f" {text}" if text else ""

    def outputs(self, session: str, paths: Sequence[str]) -> list[str]:
        """The run's files copied where the page serves them from (:meth:`SessionFiles.publish`), registered as
        ``session``'s (another session naming them is refused; they go when the session ends); the run's own folder
        removed."""
        served = [self.files.publish(session, Path(path).name, Path(path)) for path in paths]
        for folder in {Path(path).parent for path in paths}:
            shutil.rmtree(folder, ignore_errors=True)
        return served


def build_benchmark_tab(load_model: Callable[[str], object], models: Sequence[str],
                        reports: Sequence[str] = REPORTS, root: str | Path = ROOT,
                        concurrency_id: str = "benchmark", turn: Callable[[], ContextManager] = nullcontext,
                        max_rows: int | None = None, alive_for: Callable | None = None,
                        max_seconds: float | None = None, session_files: SessionFiles | None = None,
                        touch: Callable | None = None, any_order: Callable[[str], bool] | None = None,
                        admit_for: Callable | None = None, gate: object | None = None) -> BenchmarkTab:
    """Create the Benchmark view's widgets in the enclosing ``gr.Blocks``/``gr.Tab`` and wire their events.

    Args:
        load_model: name -> DualModeModel (the app's cached loader; the view uses ``model.share()``).
        models: the models visitors may choose (folders or hub ids), the default first.
        reports: the bundled reports the tab offers (folders under ``root`` holding summary.json), the first shown
            on start; the tab reads no other path (:func:`serve.benchmark.bundled_report`).
        root: the folder the reports' names are taken from.
        concurrency_id: queue group of the benchmark runs (one at a time).
        turn: held around each timed run: the app's compute gate, so no other model work runs during one.
        gate: the compute gate ``turn`` takes (:class:`serve.limits.ComputeGate`): a run holding it over
            :data:`RUN_HOLD_S` while others wait stops the runs there (the report covers those done), and a run
            starts only once other requests have left it alone for :data:`QUIET_S` (a short request takes several
            turns), so that short requests wait seconds at most.
        max_rows: worst-case model rows one benchmark may need (None = no limit).
        alive_for: ``request -> alive()`` (the server's): a run stops once its visitor has left.
        max_seconds: predicted worst-case decoder seconds one benchmark may take, and its time limit from the clock
            (checked between runs; None = no limit).
        session_files: the sessions' uploads and outputs (:class:`serve.uploads.SessionFiles`; default: the tab's
            own).
        touch: ``request -> session`` (the server's), so that a session that only used this tab is forgotten, its
            files removed, like any other.
        admit_for: ``request -> (seconds -> context manager)`` (the server's heavy admission): a benchmark is a
            heavy request, one per visitor, refused in one line when the heavy slots are taken.
        any_order: ``model name -> is it an any-order model`` (the store's, read without loading it): the verification
            order is offered for those only (None: cannot tell, always offered).
    Returns: a :class:`BenchmarkTab` with the component handles.
    """
    initial_md, initial_figs = "No report loaded yet.", {}
    if reports:
        try:
            initial_md, initial_figs = load_report(reports[0], reports, root)
        except BenchError:
            pass
    gr.Markdown("Paired throughput comparison of the schedules (paper E.5): ratios with 95% bootstrap "
                "intervals over prompts, timing decomposition (F.3) and tokens/NFE against B. The full "
                "benchmark runs on the command line: `python -m packed_ss.bench --prompts humaneval --out bench-out`.")
    saved = _saved_report_controls(reports)
    run = _run_controls(models, any_order)
    status = gr.Markdown(elem_id="bench-status")
    with gr.Row():
        plots = tuple(gr.Plot(value=panel_figure(initial_figs.get(name)), label=name.replace("_", " "))
                      for name in FIGURES)
    files = gr.File(label="report files", file_count="multiple", interactive=False)
    summary = gr.Markdown(initial_md, elem_classes=["bench-summary"])

    handlers = BenchmarkHandlers(load_model, list(models), tuple(reports), root, turn, max_rows, alive_for, max_seconds,
                                 session_files if session_files is not None else SessionFiles(), touch, admit_for,
                                 gate)
    # Page events, not part of the documented API (/generate and /race are): callable, but not listed.
    # A file reaches the handlers only through the session's own upload (private page events: no API client can
    # name a path, another visitor's file or anything else); clearing the widget clears the session's file.
    for widget, slot in ((saved["report_upload"], "summary"), (run["prompt_file"], "prompts")):
        # preprocess=False: the raw file object (SessionFiles checks its path); gr.File's preprocess left an empty
        # temporary file in Gradio's cache on every event, never removed (issue 35)
        widget.upload(handlers.on_file(slot), [widget], None, api_visibility="private", show_progress="hidden",
                      preprocess=False)
        widget.clear(handlers.on_clear(slot), None, None, api_visibility="private")
    # preprocess=False: the values arrive raw and the handlers check them: a wrong type is one line, not a traceback.
    saved["load_button"].click(handlers.show, [saved["report_path"]], [status, summary, *plots, files],
                               api_name="benchmark_show", api_visibility="undocumented", preprocess=False)
    run["run_button"].click(handlers.run, [run[name] for name in RUN_INPUTS], [status, summary, *plots, files],
                            concurrency_limit=1, concurrency_id=concurrency_id, api_name="benchmark_run",
                            api_visibility="undocumented", preprocess=False)
    if any_order is not None:  # the order is a choice of any-order models only (a left-to-right one ignores it)
        run["model"].change(lambda name: gr.Radio(visible=True) if any_order(name) else gr.Radio(visible=False, value="ltr"),
                            [run["model"]], [run["order"]], api_visibility="private", queue=False)
    return BenchmarkTab(**saved, **run, status=status, summary=summary, plots=plots, files=files)


# The run's inputs, in the order BenchmarkHandlers.run takes them.
RUN_INPUTS = ("model", "prompt_source", "limit", "schedules", "block_size", "max_new_tokens", "temperature",
              "samples", "seed", "order")


def _saved_report_controls(reports: Sequence[str]) -> dict:
    """The "Saved report" accordion: the bundled reports, an upload and the show button (BenchmarkTab's names)."""
    with gr.Accordion("Saved report", open=True):
        with gr.Row():
            report_path = gr.Dropdown(list(reports), value=reports[0] if reports else None,
                                      label="bundled report", scale=3)
            report_upload = gr.File(label="or upload a summary.json", file_types=[".json"], type="filepath", scale=2)
        load_button = gr.Button("Show saved report")
    return {"report_path": report_path, "report_upload": report_upload, "load_button": load_button}


def _run_controls(models: Sequence[str], any_order: Callable[[str], bool] | None) -> dict:
    """The "Run a small benchmark" accordion's widgets (BenchmarkTab's names)."""
    with gr.Accordion(f"Run a small benchmark (1-{MAX_PROMPTS} prompts)", open=False):
        with gr.Row():
            model = gr.Dropdown([(report_model_name(m), m) for m in models], value=models[0], label="model",
                                interactive=len(models) > 1, scale=3,
                                allow_custom_value=True)  # the app's loader refuses models it does not offer
            prompt_source = gr.Radio([HUMANEVAL, UPLOAD], value=HUMANEVAL, label="prompts", scale=2)
            prompt_file = gr.File(label="JSONL prompts ('prompt' field)", file_types=[".jsonl"], type="filepath",
                                  scale=2)
        with gr.Row():
            limit = gr.Slider(1, MAX_PROMPTS, value=2, step=1, label="prompts")
            schedules = gr.CheckboxGroup(list(ALL_SCHEDULES), value=list(ALL_SCHEDULES), label="schedules")
            block_size = gr.Textbox(value="8", label="block size B (8, or linear=8,quadratic=4,packed=8)",
                                    elem_id="bench-block-size")
        with gr.Row():
            max_new_tokens = gr.Slider(1, MAX_NEW_TOKENS, value=32, step=1, label="max new tokens")
            temperature = gr.Number(value=0.0, minimum=0, label="temperature (0 = greedy)")
            samples = gr.Slider(1, 4, value=1, step=1, label="samples per prompt (T > 0)")
            seed = gr.Number(value=0, precision=0, label="seed")
            order = gr.Radio([("left to right", "ltr"), ("by confidence", "confidence")], value="ltr",
                             label="verification order (any-order model)", elem_id="bench-order",
                             visible=any_order is None or any_order(models[0]))
        run_button = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
    return {"model": model, "prompt_source": prompt_source, "prompt_file": prompt_file, "limit": limit,
            "schedules": schedules, "block_size": block_size, "max_new_tokens": max_new_tokens,
            "temperature": temperature, "samples": samples, "seed": seed, "order": order, "run_button": run_button}
