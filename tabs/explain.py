"""The Explain tab: the schedules in short, their diagram, and the per-call cost model tau + delta * rows fitted
from this machine's measured calls, with each schedule's predicted cost per iteration against W."""

from __future__ import annotations

import gradio as gr

from components.charts import (break_even_figure, break_even_summary, cost_figure, fit_cost_model,
                               fit_summary)
from components.paths import paths_figure, paths_summary
from components.style import ASSETS, error_html
from serve.errors import UserError, refused
from serve.limits import deadline_after
from serve.runs import calibrate
from serve.server import Server
from serve.settings import RequestValues, whole_number
from tabs.settings import SettingsPanel

MEASURE_S = 60.0  # seconds Explain's Measure and fit are taken to need, where the server sets no time limit


class ExplainHandlers:
    """Draw the cost fit from the calls measured so far (``on_explain``), or measure some first (``on_measure``)."""

    def __init__(self, server: Server):
        self.server = server

    def on_explain(self, block_size=8):
        """The cost fit and its chart, and the break-even chart with this process's measured tokens/NFE."""
        calls, iterations = self.server.log.snapshot()
        try:
            fitted, error = fit_cost_model([r for r, _ in calls], [ms for _, ms in calls]), ""
        except ValueError as e:
            fitted, error = None, str(e)
        try:
            w_max = max(15, whole_number(8 if block_size is None else block_size, "the block size") - 1)
        except UserError as error:
            raise gr.Error(refused(error, "explain"), print_exception=False) from None
        measured = self.server.log.tokens_per_nfe()
        kind = self.server.store.calls
        source = (f"\n\nThe fit and the break-even rest on the same calls as the Race tab's: this server's calls "
                  f"({kind}), every one measured so far in this process (races and Steps included).")
        return (cost_figure(fitted, iterations, w_max), fit_summary(fitted, error) + source,
                break_even_figure(fitted, measured, w_max), break_even_summary(fitted, measured, iterations))

    def on_paths(self, values: RequestValues, request: gr.Request, progress=gr.Progress()):
        """Fit eager and compiled calls of the chosen model and measure the machine's limits (once per model),
        saying which stage it is at; admitted as a heavy request and answered by the server's time limit (the
        compile goes on in the background past it: :meth:`serve.gpu.GpuTasks._paths`)."""
        server = self.server
        stage = None if server.eager else (lambda done, label: progress((done, 3), desc=label, unit="stages"))
        try:
            model_ref = server.settings(values).model_ref
            predicted = server.max_seconds if server.max_seconds is not None else MEASURE_S
            with server.admit(request, None)(predicted):  # one fixed set of calls: nothing to lower
                found = server.tasks.paths(model_ref, stage, deadline_after(server.max_seconds),
                                           server.alive(request))
        except Exception as error:  # noqa: BLE001
            message = refused(error, "paths")
            return gr.skip(), error_html(message)
        return (paths_figure(found["eager"], found["compiled"], found["roofline"]),
                paths_summary(found["eager"], found["compiled"], found["roofline"], found["note"]))

    def on_measure(self, values: RequestValues, request: gr.Request):
        """Short runs for the cost fit (:func:`serve.runs.calibrate`), admitted as a heavy request (one per visitor,
        a few at once) and ended at the server's time limit; then the Explain view again."""
        server = self.server
        try:
            settings = server.settings(values)
            predicted = server.max_seconds if server.max_seconds is not None else MEASURE_S
            with server.admit(request, None)(predicted):  # a fixed set of short runs: nothing to lower
                calibrate(server.tasks, settings, server.log, max_seconds=server.max_seconds,
                          alive=server.alive(request))
        except Exception as error:  # noqa: BLE001
            message = refused(error, "measure")
            return gr.skip(), error_html(message), gr.skip(), gr.skip()
        return self.on_explain(values.block_size)


def build_explain_tab(server: Server, panel: SettingsPanel, concurrency_limit: int) -> None:
    """Create the tab (inside the caller's ``gr.Tabs``) and wire its events (measuring: queue group "compute")."""
    handlers = ExplainHandlers(server)
    with gr.Tab("Explain", id="explain") as tab:
        gr.Markdown((ASSETS / "explain.md").read_text(encoding="utf-8"))
        diagram = (ASSETS / "schedules.svg").read_text(encoding="utf-8")
        gr.HTML(f'<div class="schedule-diagram">{diagram}</div>')
        fit_text = gr.Markdown("No fit yet.", elem_id="fit-text")
        cost_plot = gr.Plot(label="Per-call cost model", elem_id="cost-plot")
        measure_btn = gr.Button("Measure on this machine (short runs at B = 4, 8, 16)")
        even_plot = gr.Plot(label="Break-even against AR", elem_id="break-even-plot")
        even_text = gr.Markdown("", elem_id="break-even-text")
        gr.Markdown("### Eager and compiled calls, and the machine's limits")
        paths_btn = gr.Button("Fit eager and compiled calls of this model (compiles a few shapes first, in the "
                              "background: 172 s on an idle 2-core CPU, 36 s once inductor's cache holds them; press "
                              "again for the compiled fit if the time limit comes first)")
        paths_plot = gr.Plot(label="Call cost against rows", elem_id="paths-plot")
        paths_text = gr.Markdown("", elem_id="paths-text")
    outputs = [cost_plot, fit_text, even_plot, even_text]
    tab.select(handlers.on_explain, [panel.block], outputs, api_visibility="private")
    measure_btn.click(panel.handler(handlers.on_measure), list(panel.components), outputs, preprocess=False,
                      api_visibility="private", concurrency_id="compute", concurrency_limit=concurrency_limit)
    paths_btn.click(panel.handler(handlers.on_paths, progress=True), list(panel.components), [paths_plot, paths_text],
                    preprocess=False, api_visibility="private", concurrency_id="compute",
                    concurrency_limit=concurrency_limit)
