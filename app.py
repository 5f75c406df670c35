"""Gradio app: step through a schedule, see its attention masks, race Linear, Quadratic and Packed.

Run ``python app.py`` (options: ``python app.py --help``). This file is the table of contents: the tabs
live in ``tabs/`` (one file each), what a request needs in ``serve/``, the UI pieces in ``components/``,
decoding in ``packed_ss/``, CSS and images in ``assets/``. No model is loaded at import time.

API endpoints (``gradio_client``): ``/generate`` and ``/race`` take the prompt first, have defaults for
everything else and return JSON metrics (:mod:`serve.api`); the page's own events (``/step``, ``/back``,
``/reset``, ``/scrub``, ``/ui_race``) are callable too but undocumented.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import gradio as gr

from packed_ss.cli import one_line_warnings, quiet_loaders

from components.style import ASSETS, page_script
from serve.api import add_api
from serve.asgi_io import ArrivingBodies
from serve.address_shares import address_share
from serve.request_gate import RequestGate
from serve.blocks import PageBlocks
from serve.limits import MAX_ROWS_PER_REQUEST, MAX_SECONDS_PER_REQUEST
from serve.models import DEFAULT_MODEL
from serve.options import allowed_models, app_parser, options_problem
from serve.server import Server
from serve.sessions import MAX_HELD
from serve.settings import NEW_TOKENS_CAP
from serve.uploads import BoundUploads
from tabs.benchmark import build_benchmark_tab
from tabs.explain import build_explain_tab
from tabs.race import build_race_tab
from tabs.settings import build_settings, example_prompts
from tabs.step import build_step_tab

MAX_UPLOAD = "2mb"  # largest upload the server accepts (serve.uploads.MAX_UPLOAD_BYTES)
UNUSED_FILES_S = 900  # uploads nobody used (and served copies of outputs) are removed after this many seconds
TITLE = "packed-ss: self-speculative decoding with diffusion drafting"
INTRO = ("# Packed self-speculative decoding\nOne model drafts in diffusion mode and verifies in causal mode. Step "
         "through a schedule, look at its attention masks, and race Linear-SS, Quadratic-SS and Packed-SS on the "
         "same prompt.")


def page_theme() -> gr.themes.Base:
    """Gradio's default theme with its sans-serif font in two whole weights: Gradio ships Source Sans Pro's regular
    and bold faces whole but its semibold (the theme's 600, for buttons, headings and labels) as a 5 kB subset, so
    most bold letters fell back to DejaVu Sans Bold beside a few semibold ones. Every weight above 400 now takes the
    bold face (CSS picks the nearest heavier face), one family in every weight."""
    from gradio.themes.utils import fonts

    return gr.themes.Default(font=(fonts.LocalFont("Source Sans Pro", weights=(400, 700)), "ui-sans-serif",
                                   "system-ui", "sans-serif"))


def launch_kwargs(demo: gr.Blocks | None = None) -> dict:
    """Keyword arguments for ``demo.launch``: the page's CSS and script (Gradio 6 takes both at launch) and, for a
    demo built by :func:`build_demo`, the request gate's middleware. Also gives uvicorn its header deadline
    (:mod:`serve.slow_clients`), so call it before launching."""
    from starlette.middleware import Middleware

    from serve.slow_clients import install

    install()  # uvicorn closes a connection whose header block takes over 10 s (it has no such limit of its own)
    kwargs: dict = {"css_paths": [str(ASSETS / "style.css")], "js": page_script(), "theme": page_theme(),
                    "max_file_size": MAX_UPLOAD,  # the Benchmark tab takes a small JSONL or summary.json
                    # Gradio keeps a copy of every component's settings per session hash (about 120 kB), 10,000 of
                    # them by default: every raw API call, a new session, grew the process by ~25 MB per 100. As
                    # many as the server remembers sessions (serve.sessions.MAX_HELD); the page keeps no gr.State.
                    "state_session_capacity": MAX_HELD}
    bodies = ArrivingBodies()  # what request bodies hold while they arrive, uploads and the gate's alike
    middleware = [Middleware(BoundUploads, bodies=bodies)]  # a few files per upload request
    endpoints = getattr(demo, "api_defaults", None)
    if endpoints:
        arity = {f.api_name: len(f.inputs) for f in demo.fns.values()
                 if f.api_name and getattr(f, "api_visibility", "public") != "private"}
        takes_files = {key for index, f in demo.fns.items() if any(isinstance(c, gr.File) for c in f.inputs)
                       for key in (index, f.api_name) if key is not None}  # the page's own upload events only
        events = {index: len(f.inputs) for index, f in demo.fns.items()
                  if f.fn is not None}  # an event that runs in the browser only has nothing to call on the server
        middleware.append(Middleware(RequestGate, endpoints=endpoints, arity=arity,
                                     listeners=getattr(demo, "call_listeners", None), takes_files=takes_files,
                                     events=events, queue=lambda: demo._queue,
                                     component_server=any(getattr(b, "server_fns", None) for b in demo.blocks.values()),
                                     shares=group_shares(demo), bodies=bodies))
    kwargs["app_kwargs"] = {"middleware": middleware}
    return kwargs


# Queue groups of which one address holds at most a share: every group that computes (a request, a race, Explain's
# fits; the benchmark; the Step tab, whose first Step of a scripted-drafter run computes a whole AR reference run:
# four of them from one address held all four Step places, issue 54). One page has at most three Step-tab events in
# flight (a Step or a tick, a slider's input and release), within the Step group's share of 4 of its 8 places.
SHARED_GROUPS = ("compute", "benchmark", "step")


def group_shares(demo: gr.Blocks) -> dict:
    """``{fn_index and api name: (its queue group, the places one address may hold)}`` of the events of
    :data:`SHARED_GROUPS`: one address may have :func:`serve.address_shares.address_share` of a group's events
    waiting or running (one benchmark, since the server runs one for everyone; 4 of the 8 model requests)."""
    found = {}
    for index, f in demo.fns.items():
        if f.fn is not None and f.concurrency_id in SHARED_GROUPS and isinstance(f.concurrency_limit, int):
            share = (f.concurrency_id, address_share(f.concurrency_limit))
            found.update({index: share, **({f.api_name: share} if f.api_name else {})})
    return found


def build_demo(model: str = DEFAULT_MODEL, *, device: str | None = None, dtype=None, preloaded: dict | None = None,
               allowed_models: Sequence[str] = (), models_held: int = 2, max_rows: int = MAX_ROWS_PER_REQUEST,
               new_tokens_cap: int = NEW_TOKENS_CAP, queue_size: int = 32, step_concurrency: int = 8,
               compute_concurrency: int = 8, family: str | None = None,
               drafter_lora: str | None = None, max_seconds: float | None = MAX_SECONDS_PER_REQUEST,
               base_model: str | None = None, cache: str = "static", compiled: bool | None = None,
               path: str = "auto", threads: int | None = None) -> gr.Blocks:
    """Build the app (nothing is loaded until a request needs a model).

    Args:
        model, device, dtype, preloaded, allowed_models, models_held, family, drafter_lora, base_model, cache,
            compiled, path: the models offered (:class:`serve.server.Server`; tests pass loaded ones as ``preloaded``).
        threads: torch threads per model call; None: measured at the first request, 1 against the cores, and again
            when calls drift (:class:`packed_ss.threads.ThreadTuner`).
        max_rows: worst-case model rows one request may need (``serve.limits``); more is refused.
        max_seconds: predicted worst-case decoder seconds one request may take (None: no limit); more is refused.
        new_tokens_cap: largest new-token limit accepted (larger requests get an error message).
        queue_size: most requests waiting in the queue. step_concurrency: Steps in progress at once.
        compute_concurrency: races / full runs / measurements in progress at once, of which at most two
            heavy ones (:mod:`serve.admission`), so short ones find a slot. Whatever the limits, model
            iterations run one at a time (a shared gate, least work first), so measured times stay honest
            and a short request is served between two iterations of a long one.
    Returns: the ``gr.Blocks``; launch it with ``demo.launch(**launch_kwargs(demo))``.
    """
    import torch

    server = Server(model, device=device, dtype=dtype, preloaded=preloaded, allowed=allowed_models,
                    models_held=models_held, family=family, drafter_lora=drafter_lora, max_rows=max_rows,
                    cap=new_tokens_cap, max_seconds=max_seconds, base_model=base_model, cache=cache,
                    compiled=compiled, path=path, threads=threads)
    on_cuda = torch.cuda.is_available() and not str(device or "").startswith("cpu")
    # delete_cache: Gradio removes files in its upload folder older than UNUSED_FILES_S (checked every minute), so an
    # upload no session used does not stay on disk; a session's own files go when it ends (serve.uploads).
    with PageBlocks(title=TITLE, delete_cache=(60, UNUSED_FILES_S)) as demo:
        server.blocks = demo
        gr.Markdown(INTRO)
        panel = build_settings(server, example_prompts(), on_cuda)
        with gr.Tabs():
            build_step_tab(server, panel, step_concurrency)
            build_race_tab(server, panel, compute_concurrency)
            build_explain_tab(server, panel, compute_concurrency)
            with gr.Tab("Benchmark", id="benchmark"):
                build_benchmark_tab(server.store.get, server.store.offered,
                                    turn=lambda: server.gate.turn(float(server.max_rows)), max_rows=server.max_rows,
                                    alive_for=server.alive, max_seconds=server.max_seconds,
                                    session_files=server.files,
                                    touch=server.session, any_order=server.store.any_order,
                                    admit_for=lambda request: server.admit(request, "the prompts, schedules or new "
                                                                                    "tokens"),
                                    gate=server.gate)
        # Raw HTTP calls that leave parameters out get these defaults (launch_kwargs adds the middleware).
        demo.api_defaults = add_api(server, compute_concurrency)
        demo.call_listeners = server.listeners  # the middleware notes who reads raw calls' results

        def on_unload(request: gr.Request):  # the tab was closed: forget its session
            server.sessions.drop(request.session_hash)

        demo.unload(on_unload)
    # api_open off: Gradio's direct routes (run/<name>) do not skip the queue (a Space's default, now everywhere)
    demo.queue(max_size=queue_size, api_open=False)
    return demo


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line (:mod:`serve.options`) and launch the app (blocks until stopped)."""
    parser = app_parser()
    args = parser.parse_args(argv)
    allowed = allowed_models(args)
    problem = options_problem(args, allowed)
    if problem:
        parser.error(problem)
    quiet_loaders()
    one_line_warnings()
    demo = build_demo(args.model, device=args.device, dtype=args.dtype, allowed_models=allowed,
                      models_held=args.models_held, max_rows=args.max_rows, new_tokens_cap=args.cap,
                      queue_size=args.queue_size, family=args.family, drafter_lora=args.drafter_lora,
                      max_seconds=args.max_seconds, base_model=args.base_model, cache=args.cache,
                      compiled=args.compile, path=args.path, threads=args.threads)
    try:
        demo.launch(server_name=args.host, server_port=args.port, **launch_kwargs(demo))
    except OSError as error:  # e.g. the port is taken
        sys.exit(f"app.py: cannot start the server: {error}".splitlines()[0]
                 + " (choose another --port, or leave it out to take the next free one)")


if __name__ == "__main__":
    main()
