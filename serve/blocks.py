"""The page's ``gr.Blocks``: a value Gradio's own components cannot take is refused in one line.

Gradio checks every event's inputs before the handler runs (file paths must be uploads, a dropdown's value
one of its choices, a slider's a number). When such a check fails it answers ``{"error": null}`` and prints a
traceback. :class:`PageBlocks` turns any of those failures, for every event of the page, into one
``gr.Error`` line naming the control, and one line in the server log (:func:`serve.errors.refused`).
"""

from __future__ import annotations

import re

import gradio as gr
from gradio.exceptions import InvalidPathError

from packed_ss.inputs import shown
from serve.errors import UserError, one_line, refused


def input_problem(label: str, value, error: BaseException) -> str:
    """The one line for ``value`` refused by the control called ``label`` (the cause of Gradio's ``error``)."""
    cause = error.__cause__ or error
    if isinstance(cause, InvalidPathError):
        reason = "only a file uploaded through this page is taken"
    elif isinstance(cause, gr.Error):  # the component's own check, e.g. a slider's range or a file's type
        reason = str(cause.message).strip().splitlines()[0] if str(cause.message).strip() else "refused"
    elif isinstance(cause, ValueError) and type(cause).__name__ != "ValidationError":
        reason = one_line(cause)  # the component's own words, e.g. a value outside a slider's range
    else:  # pydantic's ValidationError (not the shape of a file), a TypeError from a comparison, ...
        reason = "not a value of the kind this control holds"
    return f"{label} cannot take {shown(value, 60)}: {_short_numbers(reason)}"


def _short_numbers(text: str) -> str:
    """``text`` with every run of more than 15 digits written as :func:`shown` writes a huge integer (Gradio's
    range messages repeat the value in full: 400 digits on one line)."""
    return re.sub(r"-?\d{16,}", lambda m: shown(int(m.group())) if len(m.group()) < 4000
                  else f"a number of {len(m.group().lstrip('-')):,} digits", text)


class PageBlocks(gr.Blocks):
    """``gr.Blocks`` whose events refuse an input Gradio cannot preprocess with one line (no traceback)."""

    async def preprocess_data(self, block_fn, inputs, state, explicit_call=False):
        try:
            return await super().preprocess_data(block_fn, inputs, state, explicit_call)
        except Exception as error:  # noqa: BLE001 - any value Gradio's checks refuse: one line
            where = block_fn.api_name or block_fn.name or "event"
            blocks = list(block_fn.inputs)
            if len(blocks) == 1 and len(inputs) == 1:
                label = getattr(blocks[0], "label", None) or blocks[0].get_block_name()
                line = input_problem(str(label), inputs[0], error)
            else:
                line = input_problem("this event", inputs, error)
            raise gr.Error(refused(UserError(line), where), print_exception=False) from None
