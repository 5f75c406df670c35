"""The ``packed-ss`` model of lm-evaluation-harness (0.4.13): generation requests decoded by our schedules, scores
from the verifier.

Importing this module registers the model (lm-eval's ``register_model``); ``python -m packed_ss.lmeval`` does so
before running lm-eval's own command line. Requests are decoded one at a time (batch size 1, as the engine
decodes). Where the text a task sees depends on it, the model follows lm-eval's ``hf`` model
(``lm_eval/models/huggingface.py``), so that the same weights give the same generations and scores:

* contexts are encoded as ``hf`` encodes them (the tokenizer's own special tokens, none when the text already
  starts with BOS) and cut from the left to ``max_length - max_gen_toks`` tokens, and 2B more where needed: every
  schedule's calls need room for two blocks past the new tokens (a warning says how many requests lost more than
  ``hf`` would cut);
* ``max_gen_toks`` (default 256) new tokens at most; the run stops at EOS or once one of ``until`` (and the EOS
  text, as ``hf`` adds it) is generated; the text is decoded without special tokens and cut at the first stop
  sequence, as lm-eval's ``postprocess_generated_text`` does;
* ``do_sample``/``temperature``: greedy, or exact sampling (every speculative schedule's output distribution is
  the AR distribution, Algorithm 2) from the distribution ``hf`` samples: ``top_k``/``top_p`` from the task, else
  from the checkpoint's generation config, else transformers' defaults (50 and 1.0). Each sampled request draws its
  run's seed from torch's global generator, which lm-eval seeds (``--seed``): the same seeds give the same run;
* ``loglikelihood``: log-probabilities of the continuation under the verifier (causal mode, one prefill call over
  ``(context + continuation)[-(max_length + 1):][:-1]``), the drafter not involved; ``loglikelihood_rolling``: the
  same over lm-eval's rolling windows (``get_rolling_token_windows``, context 1, the BOS or EOS prefix token).

Model arguments (``--model_args``): see :data:`ARGUMENTS`; ``schedule`` may list several schedules joined by ``+``
(``packed+ar``): each request is decoded by each, lm-eval grades the first one's text, and the figures compare them.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs,
                                  postprocess_generated_text, resolve_max_length)
from lm_eval.utils import get_rolling_token_windows, hash_string, make_disjoint_window
from tqdm import tqdm

from packed_ss.cli import DEFAULT_MODEL, load_model
from packed_ss.config import DecodeConfig, SEED_RANGE
from packed_ss.engine import generate, scripted_drafter
from packed_ss.layout import prefill_layout
from packed_ss.lmeval.figures import RequestFigures, request_figures, summarize, summary_line, write_figures
from packed_ss.registry import get_schedule
from packed_ss.threads import configure_threads

log = logging.getLogger(__name__)

# Model argument -> what it means (the one-line error for an unknown argument lists these names).
ARGUMENTS = {
    "pretrained": "a model folder or hub id (default: the embedded model, assets/model)",
    "schedule": "ar, linear, quadratic, packed, packed-mixed, partial, lookup, diffusion; several joined by +",
    "block_size": "B, 2 to 64 (default 8)",
    "drafter": "'model' (the network's own diffusion mode, default) or 'scripted' (tests and teaching)",
    "drafter_quality": "the scripted drafter's q, 0 to 1 (default 0.8)",
    "drafter_lora": "a peft LoRA folder or the model's subfolder holding one (NLD: linear_spec_lora)",
    "family": "plain, nemotron or setdlm (default: detected)",
    "base_model": "SetDLM: the backbone's folder or hub id",
    "order": "any-order models: ltr or confidence (default ltr)",
    "confidence_threshold": "native diffusion lanes: commit predictions at least this probable (default 0.9)",
    "drafter_width": "packed-mixed: masks per call (default 3)",
    "branches": "partial: branches per call, -1 picks them from the call-cost fit (default)",
    "device": "cpu, cuda... (default: CUDA when available)",
    "dtype": "float32, bfloat16, float64... (default: the family's own)",
    "path": "auto, native or transformers: whose forward runs the calls",
    "cache": "static or dynamic",
    "compile": "true: compiled calls (static cache)",
    "threads": "torch threads (default: measured, 1 against the cores)",
    "max_length": "the longest sequence in tokens (default: as lm-eval's hf model reads it from the config)",
    "figures": "a folder for the decoding figures (python -m packed_ss.lmeval sets OUTPUT_PATH/packed-ss-decoding)",
    "batch_size": "1 (the engine decodes one request at a time)",
    "max_batch_size": "ignored (batch size 1)",
}
DRAFTERS = ("model", "scripted")
TRANSFORMERS_SAMPLING = {"top_k": 50, "top_p": 1.0, "temperature": 1.0}  # GenerationConfig's defaults (5.23)
HARMLESS = {"num_beams": 1, "num_return_sequences": 1, "repetition_penalty": 1.0}  # settings that change nothing
GENERATION_KEYS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


class ModelArgumentError(ValueError):
    """A model argument or request packed-ss cannot honour; its message is one line."""


@register_model("packed-ss")
class PackedSSLM(TemplateLM):
    """lm-eval's view of a packed-ss model and schedule (see the module docstring for what follows ``hf``).

    Raises (at construction): ModelArgumentError for an unknown argument, schedule, drafter or batch size;
    ValueError (from :class:`~packed_ss.config.DecodeConfig` or the loader) for a value out of range or a model that
    cannot be loaded, each one line.
    """

    def __init__(self, pretrained: str = DEFAULT_MODEL, schedule: str = "packed", block_size: int = 8,
                 drafter: str = "model", drafter_quality: float = 0.8, drafter_lora: str | None = None,
                 family: str | None = None, base_model: str | None = None, order: str = "ltr",
                 confidence_threshold: float = 0.9, drafter_width: int = 3, branches: int = -1,
                 device: str | None = None, dtype: str | None = None, path: str = "auto", cache: str = "static",
                 compile: bool = False, threads: int | None = None, max_length: int | None = None,
                 figures: str | None = None, batch_size: int | str = 1, max_batch_size=None, **unknown):
        super().__init__()
        if unknown:
            raise ModelArgumentError(f"unknown model argument{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(map(repr, unknown))} for packed-ss; valid: {', '.join(ARGUMENTS)}")
        if str(batch_size) != "1":
            raise ModelArgumentError(f"batch size {batch_size!r}: packed-ss decodes one request at a time; use "
                                     f"--batch_size 1")
        if drafter not in DRAFTERS:
            raise ModelArgumentError(f"drafter {drafter!r}: choose one of {', '.join(DRAFTERS)}")
        if drafter_lora is not None and not isinstance(drafter_lora, str):
            raise ModelArgumentError(f"drafter_lora={drafter_lora!r}: give the adapter's folder or the model's "
                                     f"subfolder holding it (NLD: linear_spec_lora)")
        # Every decoding setting checked once, before the model loads (DecodeConfig's one-line errors).
        self._config = DecodeConfig(block_size=block_size, confidence_threshold=confidence_threshold,
                                    drafter_lora=drafter_lora is not None, drafter_width=drafter_width,
                                    branches=branches, order=order)
        names = [name.strip() for name in str(schedule).split("+")]
        if len(set(names)) != len(names) or not all(names):
            raise ModelArgumentError(f"schedule {schedule!r}: name each schedule once, joined by + (packed+ar)")
        if drafter == "scripted" and not 0 <= float(drafter_quality) <= 1:
            raise ModelArgumentError(f"drafter_quality {drafter_quality!r}: the scripted drafter's q is in [0, 1]")
        if str(device or "").startswith("cuda") and not torch.cuda.is_available():
            # lm-eval passes "cuda:0" unless told otherwise; its hf model then falls back as well
            log.warning("packed-ss: no CUDA device here; decoding on the CPU (device %s asked)", device)
            device = "cpu"
        self.model = load_model(str(pretrained), device, dtype, family, drafter_lora, base_model, cache,
                                bool(compile), path)
        for name in names:
            get_schedule(name, self.model)  # one line naming the schedules the model runs
        self.schedules = tuple(names)
        self.tokenizer = self.model.tokenizer
        self.drafter, self.drafter_quality = drafter, float(drafter_quality)
        self._max_length = int(max_length) if max_length is not None else None
        if self.max_length > self.model.max_length:
            raise ModelArgumentError(f"max_length {self.max_length} exceeds the model's {self.model.max_length} "
                                     f"positions")
        print(configure_threads(self.model, threads), file=sys.stderr)
        self.figures: list[RequestFigures] = []
        self.folder = Path(figures) if figures else None
        self.stamp = time.strftime("%Y-%m-%dT%H-%M-%S", time.gmtime())
        self.settings = dict(pretrained=str(pretrained), schedules=list(self.schedules), block_size=block_size,
                             drafter=drafter, drafter_quality=self.drafter_quality if drafter == "scripted" else None,
                             drafter_lora=drafter_lora, order=order, path=self.model.path, dtype=str(self.model.dtype),
                             device=str(self.model.device))
        self.truncated_beyond_hf = 0  # requests whose context lost the 2B tokens the schedules need past hf's cut

    # --- what lm-eval asks of a model ---------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        eos = self.tokenizer.eos_token_id
        return self.model.eos_token_id if eos is None else eos

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context is replaced by: BOS, or EOS without one (as ``hf``)."""
        bos = self.tokenizer.bos_token_id
        return self.eot_token_id if bos is None else bos

    @property
    def max_length(self) -> int:
        """The longest sequence lm-eval may send, in tokens: ``max_length`` when given, else read from the config
        as lm-eval's ``hf`` model reads it (``resolve_max_length``)."""
        if self._max_length:
            return self._max_length
        return resolve_max_length(self.model.model.config, self.tokenizer)

    @property
    def device(self):
        return self.model.device

    @property
    def tokenizer_name(self) -> str:
        return str(self.tokenizer.name_or_path).replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat as the tokenizer's template writes it (``--apply_chat_template``). Raises: ModelArgumentError
        when the tokenizer has none."""
        if not self.model.has_chat_template:
            raise ModelArgumentError("this model's tokenizer has no chat template: leave out --apply_chat_template")
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs) -> list[int]:
        """Token ids as ``hf`` encodes them: the tokenizer's own special tokens unless told, none when ``string``
        already starts with the prefix token's text; the last ``left_truncate_len`` only when given."""
        options = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            options["add_special_tokens"] = False
        ids = self.tokenizer.encode(string, **options)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def context_ids(self, context: str) -> list[int]:
        """A generation request's context as ``hf`` encodes it for ``generate`` (``tok_batch_encode`` of one text:
        no added special tokens when it starts with BOS)."""
        options = {"add_special_tokens": False} if has_bos_prefix(context, self.tokenizer.bos_token) else {}
        return self.tokenizer(context, **options)["input_ids"]

    # --- generation ----------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Decode each request with every schedule of ``schedule``; return the first one's texts, cut at the stop
        sequences. Raises: ModelArgumentError for generation settings the engine cannot honour (one line)."""
        out = []
        eos_text = self.tokenizer.decode([self.eot_token_id], skip_special_tokens=False)
        for number, request in enumerate(tqdm(requests, disable=disable_tqdm, desc="packed-ss: generate_until")):
            context, gen_kwargs = request.args
            config, until = self.request_config(gen_kwargs, eos_text, getattr(request, "task_name", None))
            ids = self.truncated(self.context_ids(context) or [self.prefix_token_id], config)
            text = self.decoded(ids, config, until, request, number)
            out.append(text)
            self.cache_hook.add_partial("generate_until", request.args, text)
        self.report()
        return out

    def request_config(self, gen_kwargs: dict, eos_text: str, task: str | None) -> tuple[DecodeConfig, list[str]]:
        """The :class:`DecodeConfig` and the stop sequences of one request's ``gen_kwargs`` (lm-eval's
        ``normalize_gen_kwargs`` first, then ``hf``'s sampling defaults)."""
        where = f" (task {task})" if task else ""
        if not isinstance(gen_kwargs, dict):
            raise ModelArgumentError(f"generation settings must be a dict{where}, got {gen_kwargs!r:.60}")
        kwargs = normalize_gen_kwargs(gen_kwargs, 256)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos_text)
        if any(not isinstance(s, str) or not s for s in until):
            raise ModelArgumentError(f"an empty stop sequence in `until`{where}: it would end every generation at "
                                     f"its first token; remove it from the task's generation_kwargs")
        max_new = int(kwargs.pop("max_gen_toks"))
        sampled = bool(kwargs.pop("do_sample", False))
        sampling = {key: kwargs.pop(key, None) for key in ("temperature", "top_k", "top_p")}
        odd = {k: v for k, v in kwargs.items() if HARMLESS.get(k, object()) != v}
        if odd:
            raise ModelArgumentError(f"generation settings packed-ss cannot honour{where}: "
                                     f"{', '.join(f'{k}={v!r}' for k, v in odd.items())} (it takes "
                                     f"{', '.join(GENERATION_KEYS)})")
        temperature = 0.0
        top_k, top_p = 0, 1.0
        if sampled:
            own = getattr(self.model.model, "generation_config", None)

            def value(key):
                for source in (sampling[key], getattr(own, key, None), TRANSFORMERS_SAMPLING[key]):
                    if source is not None:
                        return source

            temperature, top_k, top_p = float(value("temperature")), int(value("top_k")), float(value("top_p"))
            if temperature <= 0:
                raise ModelArgumentError(f"do_sample with temperature {temperature:g}{where}: sampling needs a "
                                         f"temperature > 0 (or do_sample: false for greedy decoding)")
        seed = int(torch.randint(SEED_RANGE[0], SEED_RANGE[1], ())) if sampled else 0
        config = replace(self._config, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new,
                         seed=seed, stop_strings=tuple(until))
        return config, until

    def truncated(self, ids: list[int], config: DecodeConfig) -> list[int]:
        """``ids`` cut from the left as ``hf`` cuts a context (``max_length - max_gen_toks``), and 2B tokens more
        where the schedules' two blocks past the new tokens would not fit. Raises: ModelArgumentError when
        ``max_gen_toks`` and two blocks leave no room for a context."""
        limit = min(self.max_length, self.model.max_length)
        room = limit - config.max_new_tokens - 2 * config.block_size
        if room < 1:
            raise ModelArgumentError(f"max_gen_toks {config.max_new_tokens} and 2 blocks of {config.block_size} leave "
                                     f"no room for a context in the model's {limit} positions: lower max_gen_toks or "
                                     f"block_size")
        if len(ids) > room:  # hf would keep up to 2B more (max_length - max_gen_toks)
            self.truncated_beyond_hf += 1
        return ids[-room:]

    def decoded(self, ids: list[int], config: DecodeConfig, until: list[str], request, number: int) -> str:
        """Decode ``ids`` with every schedule, keep their figures, and return the first schedule's text."""
        texts = []
        for name in self.schedules:
            model = self.model
            if self.drafter == "scripted" and name != "ar":
                model = scripted_drafter(self.model, ids, config, self.drafter_quality, config.seed)
            run = generate(model, ids, config, name)
            text = postprocess_generated_text(self.tokenizer.decode(list(run.token_ids), skip_special_tokens=True),
                                              until, None)
            # Lossless schedules give AR's text at T = 0 in left-to-right order; the confidence order and native
            # diffusion may differ by design (Appendix C, unverified commits), so they are not compared.
            comparable = (texts and config.greedy and config.order == "ltr"
                          and "diffusion" not in (name, self.schedules[0]))
            agrees = text == texts[0] if comparable else None
            texts.append(text)
            self.figures.append(request_figures(run, getattr(request, "task_name", None),
                                                getattr(request, "doc_id", None), hash_string(request.args[0]),
                                                number, graded=len(texts) == 1, agrees=agrees))
        return texts[0]

    def report(self) -> None:
        """Print a summary line per task and schedule on stderr, and write the figures (``figures``)."""
        reference = "ar"
        for row in summarize(self.figures, reference):
            print(f"packed-ss: {summary_line(row, reference)}", file=sys.stderr)
        if self.truncated_beyond_hf:
            log.warning("packed-ss: %d context(s) were cut %d tokens shorter than lm-eval's hf model cuts them "
                        "(room for two blocks past the new tokens)", self.truncated_beyond_hf,
                        2 * self._config.block_size)
        if self.folder is not None:
            paths = write_figures(self.folder, self.stamp, self.figures, self.settings, reference)
            print(f"packed-ss: decoding figures in {paths[1].parent}", file=sys.stderr)

    # --- scores --------------------------------------------------------------------------------------
    def verifier_logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probabilities (len(ids), V), float64, of the verifier's causal rows over ``ids`` (one prefill call,
        no token forbidden: the scores of every id, as ``hf`` gives them)."""
        self.model.reset(len(ids))
        out = self.model.forward(prefill_layout(ids, 0, self.model.mask_token_id), tuple(range(len(ids))))
        return torch.log_softmax(out.logits.double(), dim=-1)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log-probability of the continuation, whether it is the verifier's greedy choice at every token) per
        ``(strings, context_ids, continuation_ids)``, on ``(context + continuation)[-(max_length + 1):][:-1]`` as
        ``hf`` truncates. Raises: ModelArgumentError on an any-order model (no left-to-right scores)."""
        if self.model.any_order:
            raise ModelArgumentError("an any-order model (SetDLM) has no left-to-right causal scores: use "
                                     "generation tasks with it")
        out = []
        for strings, context, continuation in tqdm(requests, disable=disable_tqdm, desc="packed-ss: scores"):
            ids = (list(context) + list(continuation))[-(self.max_length + 1):][:-1]
            logp = self.verifier_logprobs(ids)[-len(continuation):]
            target = torch.tensor(continuation, dtype=torch.long)
            answer = (float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all()))
            out.append(answer)
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The verifier's log-probability of each whole text over lm-eval's rolling windows (``max_length``
        tokens, context 1, the prefix token first)."""
        out = []
        for request in tqdm(requests, disable=disable_tqdm, desc="packed-ss: rolling scores"):
            (string,) = request.args
            windows = [make_disjoint_window(window) for window in get_rolling_token_windows(
                token_list=self.tok_encode(string), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            total = sum(score for score, _ in self._loglikelihood_tokens([(None,) + w for w in windows], True))
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out
