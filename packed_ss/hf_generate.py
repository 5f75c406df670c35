"""The schedules behind transformers' ``generate``, in its two forms of custom decoding.

The callable form: ``model.generate(**inputs, custom_generate=packed_ss.custom_generate, schedule="packed",
block_size=8, max_new_tokens=64)``. transformers prepares the call (generation config, new-token limit, EOS) and
hands :func:`custom_generate` the prompt; the run is :func:`packed_ss.engine.decode` on a
:class:`~packed_ss.models.DualModeModel` wrapped around the same network (:meth:`DualModeModel.wrap`).

The folder form: a checkpoint that carries ``custom_generate/generate.py`` (:func:`write_custom_generate` writes it)
runs the schedules when loaded with ``trust_remote_code=True`` (``model.generate`` is then this module's
:func:`checkpoint_generate`), or through ``model.generate(..., custom_generate=FOLDER, trust_remote_code=True)``.

Both return what transformers' ``generate`` returns: the (1, P + N) prompt and new ids, or with
``return_dict_in_generate=True`` a :class:`SpeculativeDecoderOnlyOutput`. Whatever transformers would apply that the
engine does not (beams, penalties, other logits processors, stopping criteria, padding, a filled cache, scores) is
refused with one ValueError, never silently dropped.

Shape legend: P prompt tokens, N new tokens.
"""

from __future__ import annotations

import functools
import inspect
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import GenerationConfig, GenerationMixin
from transformers.generation import GenerateDecoderOnlyOutput
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

from packed_ss.config import DecodeConfig
from packed_ss.engine import decode, finish_run
from packed_ss.models import DualModeModel
from packed_ss.records import summarize
from packed_ss.registry import get_schedule

# generate() arguments this module reads beside transformers' own (custom_generate's keyword parameters)
SETTINGS = ("schedule", "block_size", "seed", "order", "confidence_threshold", "drafter_width", "branches",
            "mask_token_id", "tokenizer")
# transformers' settings the run honours; every other one that would change the output is refused
HONOURED = ("max_new_tokens", "max_length", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
            "return_dict_in_generate")
# The warpers transformers builds from temperature, top_k and top_p: the engine applies those settings itself.
OWN_WARPERS = (TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)
OWN_CRITERIA = (MaxLengthCriteria, EosTokenCriteria)  # the new-token limit and EOS, which the engine stops at
# What transformers' generate puts into the model's inputs; the engine builds its own.
PREPARED_INPUTS = frozenset({"attention_mask", "position_ids", "past_key_values", "use_cache", "logits_to_keep",
                             "cache_position"})
# Arguments of generate() that feed nothing the engine has: refused in the folder form (the callable form never
# sees them: transformers keeps them from a callable).
UNSUPPORTED = ("streamer", "assistant_model", "prefix_allowed_tokens_fn", "negative_prompt_ids",
               "negative_prompt_attention_mask", "stop_strings")
TEMPLATE = Path(__file__).resolve().parent / "custom_generate_template" / "generate.py"


@dataclass
class SpeculativeDecoderOnlyOutput(GenerateDecoderOnlyOutput):
    """transformers' ``GenerateDecoderOnlyOutput`` of a run: ``sequences`` (1, P + N) long ids; no scores, logits,
    attentions, hidden states or cache. The run's figures beside it: ``nfe`` model calls, ``tokens_per_nfe``,
    ``mean_acceptance_length`` (tokens per verification, the paper's acceptance length), ``metrics``
    (:meth:`packed_ss.records.RunRecord.metrics`, JSON-ready; ``text`` empty without a tokenizer) and ``records``
    (one :class:`~packed_ss.records.IterationRecord` per iteration)."""

    nfe: int | None = None
    tokens_per_nfe: float | None = None
    mean_acceptance_length: float | None = None
    metrics: dict | None = None
    records: tuple | None = None


def custom_generate(model, input_ids: torch.Tensor, logits_processor=None, stopping_criteria=None,
                    generation_config: GenerationConfig | None = None, schedule: str = "packed", block_size: int = 8,
                    seed: int = 0, order: str = "ltr", confidence_threshold: float = DecodeConfig.confidence_threshold,
                    drafter_width: int = DecodeConfig.drafter_width, branches: int = DecodeConfig.branches,
                    mask_token_id: int | None = None, tokenizer=None, **model_kwargs):
    """Decode one prompt with a packed-ss schedule, as transformers' ``generate`` calls a ``custom_generate`` callable.

    Args:
        model: the transformers network (a dual-mode model: a mask token id in its config, or ``mask_token_id``).
        input_ids: (1, P) prompt ids.
        logits_processor, stopping_criteria, generation_config: what transformers prepared from the call's settings;
            ``max_new_tokens`` (or ``max_length``), ``do_sample``, ``temperature``, ``top_k``, ``top_p`` and
            ``eos_token_id`` are honoured.
        schedule: ``"ar"``, ``"linear"``, ``"quadratic"``, ``"packed"``... (:data:`packed_ss.schedules.REGISTRY`;
            any-order models: :data:`packed_ss.any_order.ORDER_REGISTRY`).
        block_size, seed, order, confidence_threshold, drafter_width, branches: :class:`DecodeConfig`'s settings.
        mask_token_id: overrides the config's mask token id.
        tokenizer: keeps the vocabulary's padding rows out of the output and fills ``metrics["text"]``
            (transformers does not hand its ``tokenizer=`` to a callable: bind it with ``functools.partial``).
        model_kwargs: the inputs transformers prepared for the model (the engine builds its own).
    Returns:
        (1, P + N) long tensor on ``input_ids``' device, or a :class:`SpeculativeDecoderOnlyOutput` when
        ``generation_config.return_dict_in_generate``.
    Raises:
        ValueError: more than one sequence, padding, a filled cache, a setting out of range or unknown (the allowed
        values named), a schedule the model does not run, anything transformers would apply that the engine does not,
        or a model without a mask token id (:class:`~packed_ss.models.ModelLoadError`).
    """
    config = generation_config if generation_config is not None else model.generation_config
    refuse_unhonoured(config, logits_processor, stopping_criteria)
    prompt = one_prompt(input_ids, config, model_kwargs)
    settings = DecodeConfig(block_size=block_size, max_new_tokens=new_tokens(config, len(prompt)), seed=seed,
                            order=order, confidence_threshold=confidence_threshold, drafter_width=drafter_width,
                            branches=branches, **sampling(config))
    adapter = DualModeModel.wrap(model, tokenizer=tokenizer, mask_token_id=mask_token_id)
    adapter.eos_token_id = end_of_sequence(config)  # transformers' generation config decides where a run ends
    if not isinstance(schedule, str):
        raise ValueError(f"schedule must be a name, got {type(schedule).__name__}")
    get_schedule(schedule, adapter)  # an unknown name: one ValueError naming the model's schedules
    records = decode(adapter, prompt, settings, schedule)
    run = (finish_run(adapter, records, settings, schedule, len(prompt)) if tokenizer is not None
           else summarize(list(records), schedule, settings.block_size, settings.temperature, len(prompt)))
    new = torch.tensor(run.token_ids, dtype=input_ids.dtype, device=input_ids.device)  # (N,)
    sequences = torch.cat([input_ids, new[None]], dim=1)  # (1, P + N)
    if not config.return_dict_in_generate:
        return sequences
    return SpeculativeDecoderOnlyOutput(sequences=sequences, nfe=run.nfe, tokens_per_nfe=run.tokens_per_nfe,
                                        mean_acceptance_length=run.mean_acceptance_length, metrics=run.metrics(),
                                        records=run.records)


def one_prompt(input_ids: torch.Tensor, config: GenerationConfig, model_kwargs: dict) -> list[int]:
    """The prompt's ids of a (1, P) ``input_ids``. Raises: ValueError for beams or several returned sequences, a
    batch of more than one sequence, padding, a cache that already holds tokens, model inputs the engine cannot pass
    on, or no ids (``inputs_embeds``)."""
    for name in ("num_beams", "num_return_sequences"):
        if (getattr(config, name, None) or 1) != 1:
            raise ValueError(f"{name}={getattr(config, name)}: packed-ss decodes one sequence per prompt (leave "
                             f"{name} at 1)")
    if input_ids.dim() != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"packed-ss decodes one sequence at a time: input_ids has shape {tuple(input_ids.shape)}, "
                         f"give (1, prompt length) and call generate once per prompt")
    if input_ids.shape[1] == 0:
        raise ValueError("packed-ss needs the prompt as input_ids (at least one token), not inputs_embeds")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool((mask == 1).all()):
        raise ValueError("the attention mask holds padding: packed-ss decodes one unpadded prompt (drop the padding)")
    cache = model_kwargs.get("past_key_values")
    if cache is not None and cache.get_seq_length() > 0:
        raise ValueError("past_key_values already holds tokens: packed-ss builds its own cache from the prompt")
    extra = sorted(k for k, v in model_kwargs.items() if k not in PREPARED_INPUTS and v is not None)
    if extra:
        raise ValueError(f"packed-ss builds the model's inputs itself and cannot pass on {', '.join(extra)}")
    return input_ids[0].tolist()


def refuse_unhonoured(config: GenerationConfig, logits_processor, stopping_criteria) -> None:
    """Raise ValueError naming what transformers would apply and the engine does not: requested scores, logits,
    attentions or hidden states, a logits processor other than the temperature, top-k and top-p warpers, a stopping
    criterion other than the new-token limit and EOS."""
    for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states"):
        if getattr(config, name, None):
            raise ValueError(f"{name}=True: packed-ss returns the sequences and its own figures (nfe, "
                             f"mean_acceptance_length, records), not {name[len('output_'):]}")
    others = sorted({type(p).__name__ for p in logits_processor or () if not isinstance(p, OWN_WARPERS)})
    if others:
        raise ValueError(f"packed-ss applies temperature, top_k and top_p only; this call would also apply "
                         f"{', '.join(others)} (from generate's settings or logits_processor=): leave it out")
    stops = sorted({type(c).__name__ for c in stopping_criteria or () if not isinstance(c, OWN_CRITERIA)})
    if stops:
        raise ValueError(f"packed-ss stops at max_new_tokens and eos_token_id only; this call would also stop on "
                         f"{', '.join(stops)} (max_time, stop_strings or stopping_criteria=): leave it out")


def sampling(config: GenerationConfig) -> dict:
    """:class:`DecodeConfig`'s temperature, top_k and top_p of a generation config: greedy unless ``do_sample``."""
    if not config.do_sample:
        return {"temperature": 0.0}
    return {"temperature": 1.0 if config.temperature is None else float(config.temperature),
            "top_k": int(config.top_k or 0), "top_p": 1.0 if config.top_p is None else float(config.top_p)}


def new_tokens(config: GenerationConfig, prompt_len: int) -> int:
    """N, the new-token limit: ``max_new_tokens``, else ``max_length`` less the prompt.
    Raises: ValueError when neither leaves room for one token."""
    if config.max_new_tokens is not None:
        limit = config.max_new_tokens
    elif config.max_length is not None:
        limit = config.max_length - prompt_len
    else:
        raise ValueError("give max_new_tokens (how many tokens to generate)")
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1 (max_length above the prompt's {prompt_len} "
                         f"tokens), got {limit!r}")
    return limit


def end_of_sequence(config: GenerationConfig) -> int | None:
    """The one EOS id the run stops at (None: it runs to the limit). Raises: ValueError for several EOS ids."""
    ids = config.eos_token_id
    if ids is None or isinstance(ids, int):
        return ids
    found = sorted({int(i) for i in (ids.tolist() if isinstance(ids, torch.Tensor) else ids)})
    if len(found) > 1:
        raise ValueError(f"packed-ss stops at one end-of-sequence id; the generation config has {found}: pass "
                         f"eos_token_id=<one of them>")
    return found[0] if found else None


def checkpoint_generate(model, **arguments):
    """What a checkpoint's ``custom_generate/generate.py`` runs: ``model.generate(**arguments,
    custom_generate=custom_generate)`` through transformers' own ``generate``, with ``tokenizer=`` reaching the
    run. ``arguments`` are those of transformers' ``generate`` and :data:`SETTINGS`; same return value as
    :func:`custom_generate`.

    Raises: ValueError for an argument neither transformers' generate nor packed-ss knows (the settings named),
    one of :data:`UNSUPPORTED`, and as :func:`custom_generate`.
    """
    known = known_arguments(model)
    unknown = sorted(name for name in arguments if name not in known)
    if unknown:
        raise ValueError(f"unknown generate() argument {', '.join(map(repr, unknown))}: packed-ss takes "
                         f"{', '.join(SETTINGS)}, beside transformers' {', '.join(HONOURED)}")
    given = [name for name in UNSUPPORTED if arguments.get(name) is not None]
    if given:
        raise ValueError(f"packed-ss cannot use {', '.join(given)}: leave {'it' if len(given) == 1 else 'them'} out")
    bound = functools.partial(custom_generate, tokenizer=arguments.pop("tokenizer", None))
    for name in UNSUPPORTED:
        arguments.pop(name, None)
    return GenerationMixin.generate(model, custom_generate=bound, **arguments)


@functools.cache
def _generate_parameters() -> frozenset[str]:
    """transformers' ``generate`` parameters and every generation-config field."""
    named = set(inspect.signature(GenerationMixin.generate).parameters) - {"self", "kwargs", "custom_generate"}
    return frozenset(named | set(GenerationConfig().to_dict()) | {"tokenizer", "assistant_tokenizer"})


def known_arguments(model) -> frozenset[str]:
    """Names a ``generate`` call may carry: transformers' parameters, generation-config fields, the model's forward
    inputs and :data:`SETTINGS`."""
    return _generate_parameters() | set(inspect.signature(model.forward).parameters) | set(SETTINGS)


def write_custom_generate(folder: str | Path) -> Path:
    """Write ``custom_generate/generate.py`` into a checkpoint ``folder`` (one holding ``config.json``), so that
    transformers runs packed-ss's schedules as its ``generate`` when loaded with ``trust_remote_code=True``.
    Returns the written file's path. Raises: ValueError when ``folder`` holds no ``config.json``."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{str(folder)!r} is no checkpoint folder (it holds no config.json)")
    target = folder / "custom_generate" / "generate.py"
    target.parent.mkdir(exist_ok=True)
    shutil.copyfile(TEMPLATE, target)
    return target
