"""The Race tab: AR, Linear-SS, Quadratic-SS and Packed-SS (and optional lanes) on the same prompt, measured
side by side in turns (:func:`serve.race.run_race`), then replayed on one clock while the charts fill in."""

from __future__ import annotations

import html
import time

import gradio as gr

from components.race_panel import badge_html, lanes_html, projection_html, race_figures, summary_html
from components.style import error_html, model_note_html, note_html
from packed_ss.inputs import shown
from packed_ss.wording import counted
from serve.api import best_sizes_for
from serve.downloads import offer_race
from serve.errors import UserError, refused
from serve.race import RaceResult, run_race
from serve.server import Server
from serve.settings import RequestValues, parse_lanes, real_number
from tabs.settings import SettingsPanel

RACE_LIGHTER = "the new-token limit, the optional lanes or the prompt length"  # named when the server is busy
MAX_REPLAY_SPEED = 100.0  # times real time; the page's slider goes to 4
REPLAY_FRAME_S = 0.25  # seconds between replay frames (a few updates a second is enough)
CHART_EVERY = 2  # the race charts fill in every second frame (a new figure remounts the plot)
TABLE_AFTER_REPLAY = '<div class="race-summary-wait">The table of this race follows when the replay ends.</div>'
INTRO = ("AR (the baseline), Linear-SS, Quadratic-SS and Packed-SS, and the optional lanes ticked below, decode the "
         "sidebar's prompt with the same settings. "
         "The lanes take **turns**: each round every lane decodes a few more tokens (a *slice*), in an order "
         "rotated every round, each model call alone, so that every lane meets the same machine. If the time limit "
         "nears, every lane stops at the same token count. The lanes then replay on one clock, and the verdict "
         "gives each lane's speed over the fastest one's with a 95% interval over the paired slices: a gap whose "
         "interval excludes 1 is beyond noise.")
LANE_CHOICES = [("Prompt-lookup lane (the peer: n-gram drafts, no drafter)", "lookup"),
                ("Packed-SS + n-gram lane (drafter or n-gram per position)", "packed-mixed"),
                ("Partial-branch SS lane (k of Quadratic-SS's branches)", "partial"),
                ("Block-diffusion lane", "diffusion")]


def race_note(result: RaceResult, limit_s: float | None = None) -> str:
    """What was measured, how often, where the block sizes came from, and whether the race ran alone; for a race
    whose every lane the time limit (``limit_s`` seconds) cut off, that nothing could be measured and what would fit."""
    left_out = (f" Left out: {', '.join(result.left_out)} (no version for an any-order model)."
                if result.left_out else "")
    if result.lanes and all(lane.cut_off for lane in result.lanes):
        return nothing_measured(result, limit_s) + left_out + " " + result.isolation
    c = result.settings.config
    low, high = result.slice_range
    size = counted(low, "token") if low == high else f"{low}-{high} tokens"
    note = (f"Measured {len(result.lanes)} lanes side by side in {counted(result.rounds, 'round')} of {size} "
            f"each, the order rotated every round, in {result.compute_s:.2f} s. ")
    if result.stopped_at is not None:
        note += (f"The time limit came at {result.stopped_at} of {c.max_new_tokens} tokens: every lane stopped "
                 f"there, so all are ranked over the same tokens. ")
    note += ("Replaying each lane's measured iterations on one clock. The verdict pairs the lanes round by round (a "
             "round one lane sat out, having passed the target in the round before, joins the next).")
    if result.block_size_source:
        note += f" Block sizes: {result.block_size_source}."
    if result.cut_off:
        titles = [lane.title for lane in result.lanes if lane.cut_off]
        note += (f" Cut off at this server's time limit: {', '.join(titles)} (partial output, not ranked; lower the "
                 f"new-token limit, the lanes or the prompt length).")
    return note + left_out + " " + result.isolation


def nothing_measured(result: RaceResult, limit_s: float | None) -> str:
    """The note of a race whose every lane was cut off: no ranking, no speed; the new-token limit that would fit at
    the speeds the lanes reached (every lane's tokens per second), or, where a lane made no token, that the machine
    is too busy for this request now."""
    limit = f"this server's {limit_s:g} s time limit" if limit_s else "the time limit"
    most = max(len(lane.token_ids) for lane in result.lanes)
    head = (f"Nothing could be measured: every lane was cut off at {limit} before it finished (at most {most} of "
            f"{result.settings.config.max_new_tokens} tokens), so no lane is ranked and no speed is claimed.")
    speeds = [len(lane.token_ids) / lane.total_ms * 1000 if lane.total_ms > 0 else 0.0 for lane in result.lanes]
    if not limit_s or min(speeds) <= 0:
        return head + (" At least one lane made no token at all: the machine is too busy for this request now; try "
                       "again later, or lower the prompt length and the lanes.")
    fits = int(0.8 * limit_s / sum(1 / v for v in speeds))  # one run of every lane, a fifth kept in reserve
    return head + (f" At the speeds the lanes reached, about {fits} new tokens would fit: lower the new-token limit "
                   f"to {max(1, fits)}, or race fewer lanes.")


def earlier_note(earlier: RaceResult | None) -> str:
    """The badge area under a refused race: what the lanes, charts and table still on screen are (the session's
    earlier race, named by its settings), so that they are not read as this request's result; empty when there is
    none."""
    if earlier is None:
        return ""
    c = earlier.settings.config
    return (f'<div class="badge muted" data-badge="earlier">This request was refused: the lanes, charts and table '
            f'below are your earlier race ({html.escape(earlier.settings.model or "default model")}, '
            f'{earlier.prompt_tokens}-token prompt, B = {c.block_size}, {c.max_new_tokens} new tokens, T = '
            f'{c.temperature:g}), not this one.</div>')


class RaceHandlers:
    """Measure (``on_race``: status, badge, empty lanes) and replay (``on_replay``: lanes, three charts, summary)."""

    def __init__(self, server: Server):
        self.server = server

    def on_race(self, values: RequestValues, optional, sizes, request: gr.Request):
        server = self.server
        us = server.session(request)
        try:
            settings = server.settings(values)
            result = run_race(server.tasks, settings, extra=parse_lanes(optional), log=server.log,
                              max_rows=server.max_rows, alive=server.alive(request),
                              best=best_sizes_for(server, sizes), max_seconds=server.max_seconds,
                              admit=server.admit(request, RACE_LIGHTER))
        except Exception as error:  # noqa: BLE001
            message = refused(error, "ui_race")
            earlier, us.race = us.race, None
            return error_html(message), earlier_note(earlier), gr.skip()
        us.race = result
        return (model_note_html(result.model_note) + note_html(race_note(result, server.max_seconds)),
                badge_html(result.lanes, result.greedy, result.settings.config.order)
                + projection_html(result.lanes, server.gpu_tables), '<div class="race-lanes"></div>')

    def on_answered(self, request: gr.Request):
        """After a race's answer: the earlier race's charts, table and files cleared (the table says it follows the
        replay) when the session has a new race; nothing changed after a refusal, whose note says that what stays
        on screen is the earlier race."""
        if self.server.session(request).race is None:
            return (gr.skip(),) * 5
        return None, None, None, TABLE_AFTER_REPLAY, None

    def on_files(self, request: gr.Request):
        """The session's last race as two files, its own (:func:`serve.downloads.offer_race`): the table (CSV) and
        the whole result (JSON); None when the race was refused. A failure costs the download, not the race."""
        result = self.server.session(request).race
        if result is None:
            return None
        try:
            return offer_race(self.server.files, request.session_hash, result)
        except Exception as error:  # noqa: BLE001 - one line, never a traceback
            gr.Warning(refused(error, "race_files"))
            return None

    def on_replay(self, speed, request: gr.Request):
        """Replay this session's last race at ``speed`` times real time (a raw value: a number in (0, 100], at least
        0.05 used); nothing when the session has no race. Raises: gr.Error (one line, also logged) for any other
        speed."""
        try:
            given = real_number(speed, "the replay speed")
            if not 0 < given <= MAX_REPLAY_SPEED:
                raise UserError(f"the replay speed must be above 0 and at most {MAX_REPLAY_SPEED:g} (times real "
                                f"time), got {shown(speed)}")
        except UserError as error:
            raise gr.Error(refused(error, "replay"), print_exception=False) from None
        us = self.server.session(request)
        result = us.race
        if result is None:  # the race it follows was refused and said so in its own result area: nothing to add
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        store = self.server.store
        strings = store.strings_for(store.get(*result.settings.model_ref[:2]))
        speed = max(0.05, given)
        order = result.settings.config.order
        total = max((lane.total_ms for lane in result.lanes if lane.shown), default=0.0)
        start = time.perf_counter()
        frame = 0
        while True:
            clock_ms = (time.perf_counter() - start) * 1000 * speed
            if clock_ms >= total or us.race is not result:
                break
            charts = race_figures(result.lanes, clock_ms) if frame % CHART_EVERY == 0 else (gr.skip(),) * 3
            yield lanes_html(result.lanes, clock_ms, strings, result.greedy, order), *charts, gr.skip()
            frame += 1
            time.sleep(REPLAY_FRAME_S)
        if us.race is not result:  # a newer race replaced this one
            return
        yield (lanes_html(result.lanes, float("inf"), strings, result.greedy, order), *race_figures(result.lanes),
               summary_html(result.lanes))


EARLIER_IDS = ("race-badge", "race-lanes", "race-nfe", "race-wall", "race-theorem", "race-summary", "race-files")


def _marking(on: bool) -> str:
    """Page script adding (or removing) the ``race-earlier`` class on the race's outputs: dimmed, with a label
    saying they are the earlier race's (assets/style.css), until the new race answers."""
    ids = ", ".join(f"'{i}'" for i in EARLIER_IDS)
    action = "add" if on else "remove"
    return (f"() => {{ for (const id of [{ids}]) {{ const el = document.getElementById(id); "
            f"if (el && (el.textContent.trim() || el.querySelector('svg, .js-plotly-plot, a'))) "
            f"el.classList.{action}('race-earlier'); else if (el) el.classList.remove('race-earlier'); }} }}")


def build_race_tab(server: Server, panel: SettingsPanel, concurrency_limit: int) -> None:
    """Create the tab (inside the caller's ``gr.Tabs``) and wire its events (queue group "compute")."""
    handlers = RaceHandlers(server)
    with gr.Tab("Race", id="race"):
        gr.Markdown(INTRO)
        with gr.Row():
            optional = gr.CheckboxGroup(LANE_CHOICES, value=["lookup", "packed-mixed"], label="Optional lanes")
            sizes_box = gr.Radio([("same B for every lane", "same"),
                                  ("each speculative schedule at its best B (the other lanes at the sidebar's B)",
                                   "best")],
                                 value="same", label="Block size per lane", elem_id="race-sizes")
            replay = gr.Slider(0.1, 4, value=1, step=0.1, elem_id="replay-speed",
                               label="Replay speed (× real time, 0.1-4; a value outside is set to the nearer end)")
            race_btn = gr.Button("Race", variant="primary", elem_id="race-btn")
        race_status = gr.HTML("", elem_id="race-status")
        badge = gr.HTML("", elem_id="race-badge")
        lanes_view = gr.HTML("", elem_id="race-lanes")
        with gr.Row():
            fig_nfe = gr.Plot(label="Tokens against NFE", elem_id="race-nfe")
            fig_wall = gr.Plot(label="Tokens against wall time", elem_id="race-wall")
        fig_theorem = gr.Plot(label="Packed-SS against Linear-SS: calls per token (Theorem 3.2)",
                              elem_id="race-theorem")
        summary = gr.HTML("", elem_id="race-summary")
        race_files = gr.File(label="Race table (CSV) and the whole result (JSON)", file_count="multiple",
                             interactive=False, elem_id="race-files")
    # The Step tab's line above the tabs would stand beside this race's own result: a race clears it.
    race_btn.click(lambda: "", None, panel.status, api_visibility="private", queue=False, show_progress="hidden")
    # While a new race runs, the earlier one's lanes, charts and table stay on screen dimmed and labelled.
    race_btn.click(None, None, None, js=_marking(True), api_visibility="private", queue=False)
    raced = race_btn.click(panel.handler(handlers.on_race, extra=2), [*panel.components, optional, sizes_box],
                           [race_status, badge, lanes_view], api_name="ui_race", api_visibility="undocumented",
                           preprocess=False, concurrency_id="compute", concurrency_limit=concurrency_limit,
                           show_progress_on=[race_status])  # one progress indicator, not one per output
    # A new race's answer first clears the earlier race's charts, table and files (on_race's three outputs replaced
    # the rest), then the marks go: nothing of the earlier race stands unmarked beside the new verdict.
    cleared = raced.then(handlers.on_answered, None, [fig_nfe, fig_wall, fig_theorem, summary, race_files],
                         api_visibility="private", queue=False, show_progress="hidden")
    cleared.then(None, None, None, js=_marking(False), api_visibility="private", queue=False)
    # The files while the replay runs (a page event: /ui_race keeps its three outputs).
    cleared.then(handlers.on_files, None, [race_files], api_visibility="private", show_progress="hidden")
    cleared.then(
        handlers.on_replay, [replay], [lanes_view, fig_nfe, fig_wall, fig_theorem, summary], api_name="replay",
        api_visibility="undocumented", concurrency_id="replay", concurrency_limit=16, show_progress="hidden",
        preprocess=False)  # on_replay checks the raw speed: one line for one that is no number
