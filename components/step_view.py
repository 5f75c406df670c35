"""Everything the Step-through tab shows for one iteration of a :class:`~serve.step.StepRun`.

Pure rendering: the records were computed by the engine; this only turns the shown iteration into
HTML fragments and (on request) the mask figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

from packed_ss.any_order import ORDER_REGISTRY
from packed_ss.schedules import REGISTRY

from components.mask_plot import empty_figure, mask_figure
from components.narration import narrate
from components.order_grid import filled_before, narrate_order, order_grid_html
from components.text_view import OPEN, iteration_stats, run_stats, text_html
from components.token_grid import empty_grid_html, grid_html

TokenStrings = Callable[[Sequence[int]], list[str]]
NO_CALL = "No call yet: press Step."


@dataclass(frozen=True)
class StepView:
    """The tab's content for one iteration.

    Attributes:
        position: iteration shown (0 = none yet). done: iterations computed so far (the slider's maximum).
        grid, text, stats: HTML fragments (the grid ends with the iteration's narration). figure: the mask figure, or None when not requested.
        key: identifies (run, iteration); the page redraws the heatmap only when it changes.
    """

    position: int
    done: int
    grid: str
    text: str
    stats: str
    figure: go.Figure | None
    key: tuple | None


def step_view(run, strings: TokenStrings | None, with_figure: bool = True) -> StepView:
    """Render the iteration ``run.position`` of ``run`` (a StepRun, or None before the first Step).

    Args:
        run: the user's StepRun or None.
        strings: maps token ids to display strings (needed when ``run`` is not None).
        with_figure: build the mask figure (skip it when the shown iteration did not change).
    """
    if run is None:
        return StepView(0, 0, empty_grid_html(), "", "", empty_figure(NO_CALL) if with_figure else None, None)
    k = run.position
    key = (id(run), k, run.first_call_only)
    if k == 0:
        text = text_html(run.prompt_ids, [], [], strings, prompt_text=run.settings.prompt)
        return StepView(0, run.done, empty_grid_html(), text, "", empty_figure(NO_CALL) if with_figure else None, key)
    records = run.shown_records()
    record = records[-1]
    any_order = bool(record.order)
    title = (ORDER_REGISTRY if any_order else REGISTRY)[run.settings.schedule].title
    if run.settings.scripted is not None:
        title += f" · scripted drafter q = {run.settings.scripted:g}"
    if any_order:  # positions fill in any order: the text shows open positions as masks
        mask = run.model.mask_token_id
        filled = filled_before(records, len(records))
        tokens = [filled.get(j, mask) for j in range(len(run.prompt_ids), max(filled, default=0) + 1)]
        by_position = {j: s for r in records for j, s in zip(r.appended_positions, r.appended_sources)}
        sources = [by_position.get(j, OPEN) if j in filled else OPEN
                   for j in range(len(run.prompt_ids), len(run.prompt_ids) + len(tokens))]
        before = dict(enumerate(run.prompt_ids)) | filled_before(records, len(records) - 1)  # prompt shown too
        grid = order_grid_html(record, before, strings, title
                               ) + narrate_order(record, strings, run.settings.config.order)
        new_from = None
    else:
        tokens = [t for r in records for t in r.appended]
        sources = [s for r in records for s in r.appended_sources]
        grid = grid_html(record, run.prompt_ids + tokens, strings, run.model.mask_token_id,
                         title) + narrate(record, run.settings.schedule, strings, len(run.prompt_ids),
                                         run.model.mask_token_id)
        new_from = record.prefix_len_before - len(run.prompt_ids)
    text = text_html(run.prompt_ids, tokens, sources, strings, prompt_text=run.settings.prompt, new_from=new_from)
    stats = iteration_stats(record, pending=run.first_call_only, mask_token_id=run.model.mask_token_id) + run_stats(run.summary(), finished=run.at_end)
    figure = None
    if with_figure:
        figure = mask_figure([c.layout for c in record.calls], strings,
                             f"Iteration {record.index}: {title} attention mask",
                             selected_branch=record.h if record.schedule in ("quadratic", "partial") else None)
    return StepView(k, run.done, grid, text, stats, figure, key)
