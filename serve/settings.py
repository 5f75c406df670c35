"""The settings a request carries: raw page or API values validated into one frozen :class:`RunSettings`
(:func:`make_settings`), the app's caps, and the race's lane and block-size choices."""

from __future__ import annotations

import math
from dataclasses import dataclass

from packed_ss.config import SEED_RANGE, DecodeConfig
from packed_ss.inputs import PromptTextError, check_prompt, shown
from packed_ss.schedules import REGISTRY, SPECULATIVE

from serve.errors import UserError


NEW_TOKENS_CAP = 512  # largest new-token limit the app accepts
APP_MAX_BLOCK_SIZE = 32  # Quadratic-SS evaluates B(B+1) rows: 1056 at B = 32
MAX_PROMPT_CHARS = 20_000
MAX_SEED = SEED_RANGE[1]  # largest seed every front end takes (2^32 - 1: exact as a float, distinct for torch)
OPTIONAL_LANES = ("lookup", "packed-mixed", "partial", "diffusion")  # race lanes beyond AR and the self-speculative ones
DRAFTERS = ("model", "scripted")  # the model's own drafter, or the scripted one (packed_ss.models.scripted)
PRECISIONS = ("", "bfloat16", "float32")  # "" = the server's default (bfloat16 on CUDA, float32 on CPU)


# --- settings ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunSettings:
    """Everything that defines a run: model name, prompt text, schedule, decoding config, the precision
    the model runs in ("" = the server's default: bfloat16 on CUDA, float32 on CPU) and, for teaching,
    the quality q of a scripted drafter (None = the model's own drafter; :mod:`packed_ss.models.scripted`)."""

    model: str
    prompt: str
    schedule: str
    config: DecodeConfig
    precision: str = ""
    scripted: float | None = None
    chat: bool = False

    def prompt_ids(self, model) -> list[int]:
        """The prompt's token ids for ``model``: the text itself, or (``chat``) the text as one user message in
        the model's chat template (paper E.3). Raises: UserError when ``chat`` is asked of a model without one."""
        if not self.chat:
            return list(model.encode(self.prompt))
        try:
            return list(model.encode(model.chat_text(self.prompt)))
        except (ValueError, AttributeError):
            raise UserError("this model has no chat template: untick \"Send as a chat message\"") from None

    @property
    def model_ref(self) -> tuple[str, str, float | None]:
        """(model name, precision, scripted drafter quality or None): what a run is decoded with.
        ``ModelStore.get(*model_ref[:2])`` gives the loaded model."""
        return self.model, self.precision, self.scripted


EMPTY_WHY = " (a number too long for the page to hold, such as one of hundreds of digits, arrives empty)"


def whole_number(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` (any raw value) as an int in ``[low, high]``. Raises: UserError naming ``name``."""
    if value is None:
        span = f" from {low} to {high}" if low is not None and high is not None else ""
        raise UserError(f"{name} must be a whole number{span}, got an empty field{EMPTY_WHY}")
    if isinstance(value, bool):  # JSON true is no number of tokens (Python would read it as 1)
        raise UserError(f"{name} must be a whole number, got {shown(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{name} must be a whole number, got {shown(value)}") from None
    if not math.isfinite(number) or number != int(number):
        raise UserError(f"{name} must be a whole number, got {shown(value)}")
    number = int(number)
    if low is not None and high is not None and not low <= number <= high:
        raise UserError(f"{name} must be a whole number from {low} to {high}, got {shown(number)}")
    if low is not None and number < low:
        raise UserError(f"{name} must be at least {low}, got {shown(number)}")
    return number


def real_number(value, name: str) -> float:
    """``value`` (any raw value) as a finite float. Raises: UserError naming ``name``."""
    if value is None:
        raise UserError(f"{name} must be a number, got an empty field{EMPTY_WHY}")
    if isinstance(value, bool):  # JSON true is no temperature (Python would read it as 1.0)
        raise UserError(f"{name} must be a number, got {shown(value)}")
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise UserError(f"{name} must be a number, got {shown(value)}") from None
    if not math.isfinite(number):
        raise UserError(f"{name} must be a finite number, got {shown(value)}")
    return number


@dataclass(frozen=True)
class RequestValues:
    """The values a request carries, as the page's settings or the API's parameters send them (any type a client
    sends: nothing is validated here). Fields in the page's order; defaults are the API's documented ones.
    :meth:`settings` validates them into a :class:`RunSettings`."""

    model: object = ""
    prompt: object = None
    schedule: object = "packed"
    block_size: object = 8
    temperature: object = 0.0
    top_k: object = 0
    top_p: object = 1.0
    seed: object = 0
    max_new_tokens: object = 128
    drafter_lora: object = False
    precision: object = ""
    drafter: object = "model"
    drafter_quality: object = 0.8
    order: object = "ltr"
    chat: object = False

    def settings(self, cap: int = NEW_TOKENS_CAP) -> RunSettings:
        """The validated settings, with a new-token limit of at most ``cap``.

        Raises:
            UserError: a prompt that is not text, empty or not valid Unicode, a model name that is not text,
                unknown schedule, block size outside [2, 32], negative temperature, new-token limit outside
                [1, cap], seed outside [0, MAX_SEED], a drafter-LoRA switch that is not true/false, a precision
                not in PRECISIONS, a drafter other than "model" or "scripted", a scripted drafter quality
                outside [0, 1], an order other than "ltr" or "confidence", a chat switch that is not
                true/false, or any value :class:`DecodeConfig` rejects.
        """
        prompt = self.prompt
        try:
            check_prompt(prompt)  # the rule of every front end: non-empty, valid Unicode, whitespace allowed
        except PromptTextError as error:
            raise UserError(str(error)) from None
        if len(prompt) > MAX_PROMPT_CHARS:
            raise UserError(f"the prompt is too long ({len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,})")
        model = text_value(self.model, "model")
        schedule = self.schedule
        if not isinstance(schedule, str) or schedule not in REGISTRY:
            raise UserError(f"unknown schedule {shown(schedule)}; choose one of {', '.join(REGISTRY)}")
        block = whole_number(self.block_size, "block size", 2, APP_MAX_BLOCK_SIZE)
        temp = real_number(self.temperature, "temperature")
        if temp < 0:
            raise UserError(f"temperature must be >= 0 (0 = greedy), got {temp}")
        drafter_lora = False if self.drafter_lora is None else self.drafter_lora
        if not isinstance(drafter_lora, bool):
            raise UserError(f"drafter_lora must be true or false, got {type(drafter_lora).__name__} {shown(drafter_lora)}")
        chat = False if self.chat is None else self.chat
        if not isinstance(chat, bool):
            raise UserError(f"chat must be true or false, got {type(chat).__name__} {shown(chat)}")
        precision = text_value(self.precision, "precision").strip()
        if precision not in PRECISIONS:
            raise UserError(f"precision must be bfloat16 or float32 (empty = the server's default), got {shown(precision)}")
        drafter = text_value(self.drafter, "drafter").strip() or "model"
        if drafter not in DRAFTERS:
            raise UserError(f"drafter must be 'model' (the model's own) or 'scripted', got {shown(drafter)}")
        quality = real_number(0.8 if self.drafter_quality is None else self.drafter_quality, "drafter quality")
        if not 0 <= quality <= 1:
            raise UserError(f"drafter quality must be from 0 to 1, got {quality}")
        limit = whole_number(self.max_new_tokens, "new-token limit")
        if not 1 <= limit <= cap:
            raise UserError(f"the new-token limit must be from 1 to {cap} (the app's cap), got {limit}")
        try:
            config = DecodeConfig(block_size=block, temperature=temp, top_k=whole_number(self.top_k, "top-k", 0),
                                  top_p=real_number(self.top_p, "top-p"), max_new_tokens=limit,
                                  seed=whole_number(self.seed, "seed", 0, MAX_SEED), drafter_lora=drafter_lora,
                                  order=text_value(self.order, "order").strip() or "ltr")
        except ValueError as error:
            raise UserError(str(error)) from None
        return RunSettings(model=model.strip(), prompt=prompt, schedule=schedule, config=config, precision=precision,
                           scripted=quality if drafter == "scripted" else None, chat=chat)


def make_settings(*values, cap: int = NEW_TOKENS_CAP, **named) -> RunSettings:
    """Validate raw page/API values (in :class:`RequestValues` order, or by name) into :class:`RunSettings`.
    Raises: UserError (see :meth:`RequestValues.settings`)."""
    return RequestValues(*values, **named).settings(cap)


def text_value(value, name: str) -> str:
    """A text field's value (None = empty). Raises: UserError when it is not text."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise UserError(f"{name} must be text, got {type(value).__name__} {shown(value)}")
    return value


def parse_lanes(lanes) -> list[str]:
    """Optional race lanes from a list or a comma-separated text: "lookup" (prompt lookup, the peer without a
    drafter), "packed-mixed" (Packed-SS with drafter and n-gram drafts), "partial" (partial-branch SS),
    "diffusion" ("ar", "linear", "quadratic" and "packed" are accepted and change nothing: they are always lanes).

    Raises: UserError for a value that is not text or an unknown lane.
    """
    if isinstance(lanes, str) or lanes is None:
        items = [s.strip() for s in (lanes or "").split(",") if s.strip()]
    elif isinstance(lanes, (list, tuple)):
        items = [text_value(s, "a race lane").strip() for s in lanes]
    else:
        raise UserError(f"lanes must be text such as 'ar,diffusion', got {type(lanes).__name__} {shown(lanes)}")
    unknown = [s for s in items if s not in ("ar", *SPECULATIVE, *OPTIONAL_LANES)]
    if unknown:
        raise UserError(f"optional race lanes are {', '.join(map(repr, OPTIONAL_LANES))}, got "
                        f"{', '.join(map(shown, unknown))}")
    return items


def wants_best_sizes(choice) -> bool:
    """A race's block-size choice: "same" (every lane at the settings' B, default) or "best" (each
    schedule at its own best B). Raises: UserError for anything else."""
    choice = text_value(choice, "block_sizes").strip() or "same"
    if choice not in ("same", "best"):
        raise UserError(f"block_sizes must be 'same' (every lane at B) or 'best' (each schedule at its own best B), "
                        f"got {shown(choice)}")
    return choice == "best"
