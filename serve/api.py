"""The documented API: ``/generate`` and ``/race`` (the prompt first, defaults for the rest, JSON back).

:func:`add_api` registers both inside the caller's ``gr.Blocks`` and returns their parameter defaults for
:class:`~serve.request_gate.RequestGate` (raw HTTP calls that leave parameters out). Every failure is a
``gr.Error`` with one line, never a traceback.
"""

from __future__ import annotations

import gradio as gr

from serve.request_checks import signature_defaults
from serve.block_sizes import BestBlockSizes
from serve.errors import refused
from serve.limits import TIME_LIMIT
from serve.notes import model_note
from serve.race import run_race
from serve.runs import run_generate
from serve.server import Server
from serve.settings import RequestValues, parse_lanes, wants_best_sizes


def best_sizes_for(server: Server, choice) -> BestBlockSizes | None:
    """The race's block-size choice: the server's best-B finder for "best", None for "same".
    Raises: UserError for anything else."""
    return server.best_sizes if wants_best_sizes(choice) else None


def time_limit_note(run, limit_s: float | None) -> dict:
    """``cut_off`` (the time limit ended the run) and, when it did, a ``note`` saying the output is partial."""
    if run.stop_reason != TIME_LIMIT:
        return {"cut_off": False}
    return {"cut_off": True, "note": f"cut off at this server's time limit of {limit_s:g} s: the output is what was "
                                     f"decoded by then"}


def add_api(server: Server, concurrency_limit: int) -> dict[str, list[tuple[str, object]]]:
    """Register ``/generate`` and ``/race`` (queue group "compute"); returns ``{endpoint: [(name, default)]}``."""

    def generate(prompt: str, schedule: str = "packed", block_size: int = 8, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, max_new_tokens: int = 128,
                 model: str = "", drafter_lora: bool = False, precision: str = "", drafter: str = "model",
                 drafter_quality: float = 0.8, order: str = "ltr", chat: bool = False,
                 request: gr.Request = None) -> dict:
        """Decode ``prompt`` to the end with one schedule; returns the run's metrics (JSON), ``cut_off`` (the server's
        time limit ended the run: ``stop_reason`` "time limit", the output partial, a ``note`` says so) and
        ``model_note`` (what the model is: the embedded demo model's text is not meant to make sense). ``order``: an
        any-order model's verification order, "ltr" or "confidence" (paper Appendix C; empty = "ltr").
        ``chat``: send the prompt as one user message in the model's chat template (models that have one).

        Errors (bad prompt or settings, a model not offered, work over the budget) come back as a
        Gradio error with a one-line message.
        """
        try:
            settings = server.settings(RequestValues(model, prompt, schedule, block_size, temperature, top_k, top_p,
                                                     seed, max_new_tokens, drafter_lora, precision, drafter,
                                                     drafter_quality, order, chat))
            run = run_generate(server.tasks, settings, log=server.log, max_rows=server.max_rows,
                               alive=server.alive(request), max_seconds=server.max_seconds,
                               admit=server.admit(request, "max_new_tokens or the prompt"))
            model = server.store.get(*settings.model_ref[:2])
            return {**run.metrics(), **time_limit_note(run, server.max_seconds),
                    "model_note": model_note(server.store, settings.model, model)}
        except Exception as error:  # noqa: BLE001 - every failure is a one-line message, never a traceback
            raise gr.Error(refused(error, "generate"), print_exception=False) from None

    def race(prompt: str, block_size: int = 8, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, max_new_tokens: int = 128, lanes: str = "", model: str = "",
             drafter_lora: bool = False, precision: str = "", drafter: str = "model", drafter_quality: float = 0.8,
             block_sizes: str = "same", order: str = "ltr", chat: bool = False, request: gr.Request = None) -> dict:
        """Race AR, Linear, Quadratic and Packed (plus optional ``lanes``: comma-separated from "lookup",
        "packed-mixed", "partial", "diffusion") on one prompt.

        The lanes run side by side in turns (each round raises a common token target by ``slice_tokens``, the
        lanes' order rotated every round), each call alone; at the server's time limit every lane stops at the
        same token count (``stopped_at_tokens``). Returns per-lane metrics with ``slices`` ([tokens, ms] per
        round), ``speed_vs_ar`` (speed over AR's with its 95% interval over the paired slices),
        ``identical_to_ar``, ``first_difference`` and ``divergence``; ``rounds``, ``verdict``, ``cut_off`` (lanes
        stopped before they made a token: not ranked) and ``lossless_identical_to_ar`` overall. ``order``: an any-order model's verification order for the
        speculative lanes ("ltr" or "confidence"); such a model races AR, Linear, Quadratic and Packed only.
        ``chat``: send the prompt as one user message in the model's chat template (models that have one).
        """
        try:
            settings = server.settings(RequestValues(model, prompt, "packed", block_size, temperature, top_k, top_p,
                                                     seed, max_new_tokens, drafter_lora, precision, drafter,
                                                     drafter_quality, order, chat))
            return run_race(server.tasks, settings, extra=parse_lanes(lanes), log=server.log,
                            max_rows=server.max_rows, best=best_sizes_for(server, block_sizes),
                            alive=server.alive(request), max_seconds=server.max_seconds,
                            admit=server.admit(request, "max_new_tokens, the lanes or the prompt")).to_json()
        except Exception as error:  # noqa: BLE001
            raise gr.Error(refused(error, "race"), print_exception=False) from None

    kw = dict(concurrency_id="compute", concurrency_limit=concurrency_limit)
    gr.api(generate, api_name="generate", **kw)
    gr.api(race, api_name="race", **kw)
    return {"generate": signature_defaults(generate)[:-1], "race": signature_defaults(race)[:-1]}
