"""The Step-through tab: advance a run one iteration (or one call) at a time, play, go back, scrub, reset.

Each Step computes at most one new iteration of the user's :class:`~serve.step.StepRun` (its turn at the
compute gate weighs one call); the view (grid, text, stats, mask plot) is drawn by
:func:`components.step_view.step_view`.
"""

from __future__ import annotations


import gradio as gr

from components.mask_plot import empty_figure
from components.step_view import step_view
from components.style import error_html, model_note_html, note_html
from components.token_grid import empty_grid_html, grid_legend_html
from packed_ss.inputs import shown
from serve.downloads import offer_json, step_records
from serve.errors import UserError, refused
from serve.notes import forward_note, model_note
from serve.server import Server
from serve.sessions import UserSession
from serve.settings import RequestValues, real_number
from serve.step import StepRun
from tabs.settings import SettingsPanel

PLAY = "▶ Play"
PAUSE = "▮▮ Pause"  # U+25AE, in DejaVu Sans (Debian's chromium has no glyph for U+23F8 "⏸")


def play_interval(speed) -> float:
    """Seconds between two Steps at ``speed`` steps per second (at least 0.25 a second; None: 2 a second).

    Raises: gr.Error (one line, also logged) when ``speed`` (a raw value) is no number."""
    try:
        steps = 2.0 if speed is None else real_number(speed, "the play speed")
    except UserError as error:
        raise gr.Error(refused(error, "play"), print_exception=False) from None
    return 1.0 / max(0.25, steps)


class StepHandlers:
    """The tab's event handlers; each returns the outputs ``[iteration, grid, text, stats, mask plot, notice]``
    (plus the timer and the Play button where the playing state changes)."""

    def __init__(self, server: Server):
        self.server = server

    def view(self, us: UserSession) -> list:
        """Slider, grid, text, stats and (only when the shown iteration changed) the mask plot."""
        run = us.step
        strings = self.server.store.strings_for(run.model) if run is not None else None
        key = (id(run), run.position, run.first_call_only) if run is not None else None
        redraw = run is None or key != us.plot_key
        shown = step_view(run, strings, with_figure=redraw)
        us.plot_key = shown.key
        slider = gr.Slider(minimum=0, maximum=max(1, shown.done), value=shown.position, step=1)
        text = shown.text
        if run is not None:  # said beside the text: what the model is
            text += model_note_html(model_note(self.server.store, run.settings.model, run.model) + " "
                                    + forward_note(getattr(run.adapter, "base", run.adapter), run.shown_records(),
                                                   self.server.tasks.floor(run.settings.model_ref)))
        return [slider, shown.grid, text, shown.stats, shown.figure if redraw else gr.skip()]

    def start_or_continue(self, values: RequestValues, us: UserSession,
                          request: gr.Request | None = None) -> tuple[StepRun, str]:
        """The session's run when ``values`` still describe it, else a new run (and a note saying so). A new run's
        scripted-drafter reference is admitted as the heavy work it is (``request``: whose address it counts
        against)."""
        server = self.server
        settings = server.settings(values)
        run, note = us.step, ""
        if run is None or run.settings != settings:
            # whole runs are admitted as heavy work: a scripted drafter's reference, an eager (ZeroGPU) run's records
            heavy = request is not None and server.max_seconds is not None and (settings.scripted is not None
                                                                                or server.eager)
            run = StepRun(settings, server.store.get(*settings.model_ref[:2]), tasks=server.tasks, eager=server.eager,
                          log=server.log, gate=server.gate, max_rows=server.max_rows, max_seconds=server.max_seconds,
                          admit=server.admit(request, "the new-token limit or the prompt length") if heavy else None,
                          cost=(lambda: server.tasks.cost(settings.model_ref, server.alive(request))) if heavy
                          else None)
            note = ("Your earlier run was dropped to free memory (this server keeps "
                    f"{server.sessions.max_runs} step-through runs at once); a new run started." if us.run_dropped
                    else "Settings changed: a new run started." if us.step is not None else "")
            server.sessions.hold_run(us, run)
            us.plot_key = None
        return run, note

    def do_step(self, values: RequestValues, request: gr.Request) -> tuple[list, bool]:
        """One Step; returns (outputs, run still going)."""
        us = self.server.session(request)
        with us.lock:
            try:
                run, note = self.start_or_continue(values, us, request)
                with run.lock:
                    advanced = run.step(by_call=us.by_call)
            except Exception as error:  # noqa: BLE001 - every failure becomes a message, the session stays usable
                message = refused(error, "step")
                return [gr.skip()] * 5 + [error_html(message)], False
            if not advanced:
                reason = run.records[-1].stop_reason if run.records else None
                note = f"The run has ended ({reason or 'no more iterations'}). Press Reset or change a setting."
            return self.view(us) + [note_html(note) if note else ""], not run.at_end

    def on_step(self, values: RequestValues, request: gr.Request):
        return self.do_step(values, request)[0]

    def on_tick(self, values: RequestValues, request: gr.Request):
        outputs, going = self.do_step(values, request)
        if not going:
            self.server.session(request).playing = False
            return outputs + [gr.Timer(active=False), gr.Button(value=PLAY)]
        return outputs + [gr.skip(), gr.skip()]

    def on_play(self, speed, request: gr.Request):
        interval = play_interval(speed)  # before the toggle: a refused speed changes nothing
        us = self.server.session(request)
        us.playing = not us.playing
        return (gr.Timer(value=interval, active=us.playing),
                gr.Button(value=PAUSE if us.playing else PLAY))

    @staticmethod
    def on_speed(speed):
        return gr.Timer(value=play_interval(speed))

    def on_step_by(self, choice, request: gr.Request):
        """Step one iteration or one call at a time (only Linear-SS has two calls per iteration); the raw value
        must be "iteration" or "call" (None: iteration)."""
        if choice not in (None, "iteration", "call"):
            error = UserError(f"step by must be 'iteration' or 'call', got {shown(choice)}")
            raise gr.Error(refused(error, "step_by"), print_exception=False)
        self.server.session(request).by_call = choice == "call"

    def on_back(self, request: gr.Request):
        us = self.server.session(request)
        with us.lock:
            if us.step is not None:
                us.step.back()
            return self.view(us) + [""]

    def on_scrub(self, index, request: gr.Request):
        """Show iteration ``index``; the raw value (not preprocessed) is clamped to the iterations done.

        Raises: gr.Error (one line, also logged) when ``index`` is no finite number."""
        try:
            target = real_number(index, "the iteration")
        except UserError as error:
            raise gr.Error(refused(error, "scrub"), print_exception=False) from None
        us = self.server.session(request)
        with us.lock:
            if us.step is not None:
                us.step.goto(round(target))
            return self.view(us) + [""]

    def on_export(self, request: gr.Request):
        """The session's run as a JSON file of its records (:func:`serve.downloads.step_records`), the session's
        own (:func:`serve.downloads.offer`); None, with a warning, before the first Step."""
        us = self.server.session(request)
        with us.lock:
            run = us.step
            if run is None or not run.records:
                gr.Warning("No run yet: press Step first, then download its records.")
                return None
            with run.lock:
                records = step_records(run)
        try:
            return offer_json(self.server.files, request.session_hash, "step-records.json", records, "step-records")
        except Exception as error:  # noqa: BLE001 - one line, never a traceback
            raise gr.Error(refused(error, "step_export"), print_exception=False) from None

    def on_reset(self, request: gr.Request):
        us = self.server.session(request)
        with us.lock:
            us.step, us.plot_key, us.playing = None, None, False
            return self.view(us) + [note_html("Reset: press Step to start a new run."), gr.Timer(active=False),
                                    gr.Button(value=PLAY)]


def build_step_tab(server: Server, panel: SettingsPanel, concurrency_limit: int) -> None:
    """Create the tab (inside the caller's ``gr.Tabs``) and wire its events (queue group "step")."""
    handlers = StepHandlers(server)
    with gr.Tab("Step through", id="step"):
        with gr.Row():
            step_btn = gr.Button("Step ▸", variant="primary", elem_id="step-btn")
            # what computes a Step: pressed by the page script only, one at a time (STEP_PRESSED below)
            step_run = gr.Button("Step", visible="hidden", elem_id="step-run")
            play_btn = gr.Button(PLAY, elem_id="play-btn")
            back_btn = gr.Button("◂ Back", elem_id="back-btn")
            reset_btn = gr.Button("Reset", elem_id="reset-btn")
            speed = gr.Slider(0.5, 10, value=2, step=0.5, label="Play speed (steps per second)")
            step_by = gr.Radio([("iteration", "iteration"), ("call (Linear-SS's two calls one by one)", "call")],
                               value="iteration", label="Step by", elem_id="step-by")
        # Steps pressed while one is computing: counted here and run one after another (page script below)
        gr.HTML('<p id="step-queue" class="step-queue" aria-live="polite"></p>', elem_id="step-queue-box")
        # the Step tab's own notices (the run has ended, a new run started, Reset, a refused Step): by its buttons, not
        # in the status line above the tabs, where "The run has ended" stood small and far from the Step button
        notice = gr.HTML("", elem_id="step-notice")
        iteration = gr.Slider(0, 1, value=0, step=1, label="Iteration (scrub the iterations done so far)",
                              elem_id="iteration")
        grid = gr.HTML(empty_grid_html(), elem_id="token-grid")
        gr.HTML(grid_legend_html())
        text = gr.HTML("", elem_id="token-text")
        stats = gr.HTML("", elem_id="step-stats")
        mask_plot = gr.Plot(empty_figure("No call yet: press Step."), label="Attention mask of this iteration",
                            elem_id="mask-plot")
        with gr.Row():
            export_btn = gr.Button("Download this run's records (JSON)", elem_id="step-export", scale=1)
            export_file = gr.File(label="the run's records: settings, metrics and every iteration computed",
                                  interactive=False, elem_id="step-file", scale=2)
        timer = gr.Timer(0.5, active=False)

    outputs = [iteration, grid, text, stats, mask_plot, notice]
    kw = dict(concurrency_id="step", concurrency_limit=concurrency_limit, show_progress="hidden")
    settings = list(panel.components)
    # preprocess=False: the settings arrive raw and RequestValues validates them (one message for any bad value,
    # where Gradio's own checks answered a wrong type with a traceback or {"error": null}).
    stepped = step_run.click(panel.handler(handlers.on_step), settings, outputs, api_name="step",
                             api_visibility="undocumented", preprocess=False, **kw)
    # A changed setting (schedule, model, prompt...) starts a new run at the next Step: until then the run on
    # screen is marked as the earlier one (dimmed, labelled), and the mark goes when a Step or Reset answers.
    for component in settings:
        component.change(None, None, None, js=_earlier_run(True), api_visibility="private", queue=False)
    stepped.then(None, None, None, js=_earlier_run(False), api_visibility="private", queue=False)
    # A Step pressed while one computes was dropped unseen (five quick presses gave 2 iterations; more at once meet
    # the per-address limit of queued events): each press of the button is counted in the page, which starts one
    # Step event at a time and, as each ends, the next one counted.
    step_btn.click(None, None, None, js=STEP_PRESSED, api_visibility="private", queue=False)
    stepped.then(None, None, None, js=STEP_ENDED, api_visibility="private", queue=False)
    timer.tick(panel.handler(handlers.on_tick), settings, outputs + [timer, play_btn], api_visibility="private",
               trigger_mode="once", preprocess=False, **kw)
    play_btn.click(handlers.on_play, [speed], [timer, play_btn], api_visibility="private", queue=False)
    speed.release(handlers.on_speed, [speed], [timer], api_visibility="private", queue=False)
    step_by.change(handlers.on_step_by, [step_by], None, api_name="step_by", api_visibility="undocumented",
                   queue=False, preprocess=False)
    back_btn.click(handlers.on_back, None, outputs, api_name="back", api_visibility="undocumented", **kw)
    export_btn.click(handlers.on_export, None, [export_file], api_visibility="private", **kw)
    reset_btn.click(handlers.on_reset, None, outputs + [timer, play_btn], api_name="reset",
                    api_visibility="undocumented", **kw).then(None, None, None, js=_earlier_run(False),
                                                               api_visibility="private", queue=False)
    reset_btn.click(None, None, None, js=STEPS_DROPPED, api_visibility="private", queue=False)
    # preprocess=False: a number typed past either end is clamped by on_scrub (the slider then shows
    # the iteration drawn) instead of failing Gradio's bound check and leaving the two out of step.
    iteration.release(handlers.on_scrub, [iteration], outputs, api_name="scrub", api_visibility="undocumented",
                      preprocess=False, **kw)
    # A number typed into the slider's box arrives as input events (no release): follow the last one.
    iteration.input(handlers.on_scrub, [iteration], outputs, api_visibility="private", preprocess=False,
                    trigger_mode="always_last", **kw)


STEP_IDS = ("token-grid", "token-text", "step-stats", "mask-plot")

# Page scripts for the Step button (window.packedSteps: {busy, queued}): a press starts a Step (a click of the hidden
# #step-run, whose event computes it) unless one is computing; then it is counted and said in #step-queue, and each
# Step that ends starts the next one counted. One Step event at a time: no press meets the per-address limit of
# queued events. Reset drops the presses still counted.
_STEPS = ("const s = (window.packedSteps ??= {busy: false, queued: 0}); "
          "const line = document.getElementById('step-queue');")
_SAY = ("if (line) line.textContent = s.queued ? (s.queued === 1 ? '1 more Step pressed: it runs when this one ends.' "
        ": s.queued + ' more Steps pressed: they run one after another.') : '';")
_RUN = "document.querySelector('#step-run button, button#step-run')?.click();"
STEP_PRESSED = f"() => {{ {_STEPS} if (s.busy) s.queued += 1; else {{ s.busy = true; {_RUN} }} {_SAY} }}"
STEP_ENDED = (f"() => {{ {_STEPS} s.busy = false; if (s.queued > 0) {{ s.queued -= 1; s.busy = true; "
              f"setTimeout(() => {{ {_RUN} }}, 0); }} {_SAY} }}")
STEPS_DROPPED = f"() => {{ {_STEPS} s.queued = 0; {_SAY} }}"


def _earlier_run(on: bool) -> str:
    """Page script adding (or removing) the ``step-earlier`` class on the Step tab's outputs when they show a run
    (assets/style.css: dimmed, with a label saying a Step starts one with the new settings)."""
    ids = ", ".join(f"'{i}'" for i in STEP_IDS)
    if not on:
        return f"() => {{ for (const id of [{ids}]) document.getElementById(id)?.classList.remove('step-earlier'); }}"
    shown = "#token-grid [data-iteration]:not([data-iteration=\\'0\\'])"  # a run's grid, not the empty one
    return (f"() => {{ if (!document.querySelector('{shown}')) return; "
            f"for (const id of [{ids}]) document.getElementById(id)?.classList.add('step-earlier'); }}")
