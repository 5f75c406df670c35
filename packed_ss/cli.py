"""Command line: ``python -m packed_ss generate --schedule packed --prompt "def f(x):"``.

Prints the generated text and the run metrics, or one JSON object with ``--json``. Bad arguments exit
with status 2 and a one-line message, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from packed_ss.config import DecodeConfig
from packed_ss.inputs import embedded_model, threads_problem
from packed_ss.threads import configure_threads
from packed_ss.models import DTYPES

DEFAULT_MODEL = str(embedded_model())  # the checkout's assets/model, or the copy pip installed


class UsageError(Exception):
    """A user error reported as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (no usage block) and exits with status 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def decode_config(args) -> DecodeConfig:
    """The :class:`DecodeConfig` of parsed ``generate`` arguments. Raises ValueError with a one-line message."""
    return DecodeConfig(block_size=args.block_size, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, seed=args.seed, stop_strings=tuple(args.stop),
                        drafter_lora=bool(args.drafter_lora), order=args.order,
                        confidence_threshold=args.confidence_threshold)


def load_model(name: str, device: str | None, dtype: str | None, family: str | None = None,
               drafter_lora: str | None = None, base_model: str | None = None, cache: str = "static",
               compiled: bool = False, path: str = "auto", announce: bool = True):
    """``DualModeModel.from_pretrained`` with every failure (bad device included) as a one-line ValueError;
    ``base_model`` given for a checkpoint that is not SetDLM's is one too. Where ``path="auto"`` cannot use the
    native forward, one line on stderr says why (:func:`announce_path`); a front end that may still refuse the
    run after loading passes ``announce=False`` and calls :func:`announce_path` once its checks pass, so that a
    refusal is one line."""
    from packed_ss.models import DualModeModel, ModelLoadError

    if base_model is not None and not base_model.strip():
        raise ModelLoadError("--base-model is empty: give a folder or hub id, or leave the flag out")
    try:
        model = DualModeModel.from_pretrained(name, device=device, dtype=dtype, family=family,
                                              drafter_lora=drafter_lora, base_model=base_model, cache=cache,
                                              compiled=compiled, path=path)
    except ModelLoadError:
        raise
    except (RuntimeError, AssertionError, AttributeError, TypeError) as error:  # e.g. moving to a missing device
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"cannot load model {name!r} on {device or 'the default device'}: {first}") from None
    if base_model and model.family != "setdlm":
        raise ModelLoadError(f"--base-model applies to SetDLM checkpoints only; {name!r} is a {model.family} model")
    if announce:
        announce_path(model)
    return model


def announce_path(model) -> None:
    """The one ``note:`` line on stderr naming why the native forward does not serve ``model``, if it does not."""
    if model.path_note:
        print(f"note: {model.path_note}", file=sys.stderr)


def compile_from_env() -> bool | None:
    """``--compile``'s default: the environment variable ``PACKED_SS_COMPILE`` (1, true, yes or on; 0, false, no or
    off), or None where it is unset: CUDA graphs where the native forward runs a CUDA model, else eager calls
    (:meth:`packed_ss.models.DualModeModel.from_pretrained`).

    Raises: ValueError for any other non-empty value (a typo must not silently turn compiling off)."""
    value = os.environ.get("PACKED_SS_COMPILE", "").strip().lower()
    if not value:
        return None
    if value in ("0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"PACKED_SS_COMPILE={value!r}: use 1 (compile) or 0 (do not), or leave it unset")


def resolve_compile(args) -> bool | None:
    """Set ``args.compile`` from the environment where the command line left it out (see
    :func:`compile_from_env`) and return it. Raises: ValueError for a bad ``PACKED_SS_COMPILE``."""
    if getattr(args, "compile", None) is None:
        args.compile = compile_from_env()
    return args.compile


def one_line_warnings() -> None:
    """Warnings as one ``warning: ...`` line on stderr (a compile failure's fallback, for example), not Python's
    two lines with the source file and line (the command-line entry points call this)."""
    import warnings

    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"warning: {message}\n"


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """``--family``, ``--drafter-lora`` and ``--base-model``, shared by the CLI, the benchmark and app.py."""
    parser.add_argument("--family", default=None, choices=("plain", "nemotron", "setdlm"),
                        help="model family (default: detected from config.json)")
    parser.add_argument("--base-model", default=os.environ.get("PACKED_SS_BASE_MODEL") or None,
                        metavar="PATH_OR_HUB_ID",
                        help="SetDLM checkpoints: the base model whose config.json gives the backbone (env "
                             "PACKED_SS_BASE_MODEL; default: the one the checkpoint names, e.g. "
                             "Qwen/Qwen3-1.7B-Base); a local folder works offline")
    parser.add_argument("--drafter-lora", default=None, metavar="PATH_OR_SUBFOLDER",
                        help="peft LoRA applied to proposal rows only, e.g. linear_spec_lora (NLD's subfolder)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="model calls at a few padded row counts through torch.compile (CPU: needs a C++ "
                             "compiler), or replayed as CUDA graphs where the native forward runs on CUDA (default: "
                             "env PACKED_SS_COMPILE=1/0, else CUDA graphs on CUDA's native path and eager calls "
                             "elsewhere); a compile or capture failure decodes eagerly with one warning line")
    parser.add_argument("--cache", default="static", choices=("static", "dynamic"),
                        help="KV cache: static (preallocated, rollback moves its length; default) or dynamic "
                             "(transformers' DynamicCache, grown and cropped)")
    parser.add_argument("--path", default="auto", choices=("auto", "native", "transformers"),
                        help="whose forward runs the calls: auto (default: the project's native forward for "
                             "Llama-family models on the CPU and CUDA, else transformers', with one line saying "
                             "why), native (an error where it cannot) or transformers")


def _parser() -> argparse.ArgumentParser:
    from packed_ss.schedules import REGISTRY

    parser = _Parser(prog="python -m packed_ss")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="decode one prompt with one schedule", prog="python -m packed_ss generate")
    gen.add_argument("--schedule", default="packed", help=f"one of {', '.join(REGISTRY)} (default packed)")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", type=Path, help="file holding the prompt")
    gen.add_argument("--model", default=DEFAULT_MODEL, help="model folder or hub id (default: the embedded model)")
    gen.add_argument("--block-size", type=int, default=8, help="B; the speculative width is B - 1")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--order", default="ltr", choices=("ltr", "confidence"),
                     help="any-order models: verification order (paper Appendix C; default ltr)")
    gen.add_argument("--confidence-threshold", type=float, default=DecodeConfig.confidence_threshold,
                     help="diffusion schedule only: commit predictions at least this probable, in (0, 1] (default "
                          f"{DecodeConfig.confidence_threshold:g}; SetDLM's own default is 1.0)")
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--dtype", default=None, help=f"one of {', '.join(DTYPES)} (default float32 on CPU)")
    gen.add_argument("--threads", type=int, default=None,
                     help="torch CPU threads (default: measured, 1 against the cores, on the model's probe calls)")
    add_model_flags(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _generate(args) -> int:
    from packed_ss.engine import generate
    from packed_ss.inputs import check_prompt, positions_problem, read_prompt_file
    from packed_ss.models import ModelLoadError
    from packed_ss.registry import get_schedule

    try:
        resolve_compile(args)
        get_schedule(args.schedule)
        config = decode_config(args)
        if threads_problem(args.threads):
            raise UsageError(threads_problem(args.threads))
        # One rule for prompts in every front end (packed_ss.inputs); --prompt bytes that are not UTF-8
        # reach Python as lone surrogates and are refused there.
        prompt = read_prompt_file(args.prompt_file) if args.prompt_file is not None else check_prompt(args.prompt)
        problem = positions_problem(args.model, config.max_new_tokens, config.block_size)  # before loading
        if problem:
            raise UsageError(problem)
        model = load_model(args.model, args.device, args.dtype, args.family, args.drafter_lora, args.base_model,
                           args.cache, args.compile, args.path, announce=False)
        get_schedule(args.schedule, model)
        if config.order != "ltr" and not getattr(model, "any_order", False):
            raise UsageError(f"--order {config.order} needs an any-order model (e.g. --model assets/model-anyorder)")
        announce_path(model)  # after the last refusal: a refused run prints one line
        print(configure_threads(model, args.threads), file=sys.stderr)
        ids = model.encode(prompt)
        if model.compiled:  # compile every shape of the run before the one that is timed
            generate(model, ids, config, args.schedule)
            if model.compiled:
                count = len(model.static.shapes)
                done = "recorded CUDA graphs of" if model.graphs else "compiled"
                print(f"{done} {count} call shape{'s' if count != 1 else ''} in {model.static.compile_s:.1f} s "
                      f"(not part of the timed run)", file=sys.stderr)
        run = generate(model, ids, config, args.schedule)
    except (ValueError, ModelLoadError, UsageError) as error:
        raise UsageError(str(error).splitlines()[0] if str(error) else type(error).__name__) from None
    metrics = {**run.metrics(), "cache": model.cache_kind, "path": model.path, "compiled": model.compiled,
               "graphs": model.graphs,
               "compile_s": round(model.static.compile_s, 3) if model.static else 0.0}
    if args.json:
        metrics["floor"] = call_floor(model, run)
        print(json.dumps(metrics))
    else:
        print(run.text)
        order = f" order={config.order}" if getattr(model, "any_order", False) else ""
        print(f"\n[{run.schedule}] B={run.block_size}{order} tokens={run.tokens} NFE={run.nfe} "
              f"tokens/NFE={run.tokens_per_nfe:.2f} wall={run.wall_s:.3f}s "
              f"time/NFE={run.time_per_nfe_ms:.2f}ms throughput={run.throughput:.1f} tok/s "
              f"mean acceptance length={run.mean_acceptance_length:.2f} stop={run.stop_reason}",
              file=sys.stderr)
    return 0


def quiet_loaders() -> None:
    """transformers reports only errors and draws no loading bars: a refused checkpoint gets our one-line message,
    not its load table."""
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()


def call_floor(model, run) -> dict | None:
    """Each call's model time over its floor (:func:`packed_ss.cost.roofline`: the larger of the call's arithmetic at
    the measured GFLOP/s and one read of the weights at the measured bandwidth): ``floor_ms`` the weight read (a
    1-row call's floor), ``compute_ms_per_row`` and ``crossover_rows`` (where the arithmetic takes over), the
    datasheet's peaks where the device is known (None otherwise), every call's ratio in order
    (``over_floor_per_call``, the prefill first, with its rows in ``rows_per_call``), the median and largest ratio,
    and the median ratio per row count (issue 55: how far a path's calls are from what the hardware must do). None
    for a model without a network (scripted test models) or where the device had no memory left to measure the
    floor."""
    import statistics

    from packed_ss.cost import roofline

    try:
        limits = roofline(model)
    except ValueError:
        return None
    calls = [call for record in run.records for call in record.calls]
    ratios = [limits.over(call.model_ms, call.layout.rows) for call in calls]
    by_rows: dict[int, list[float]] = {}
    for call, ratio in zip(calls, ratios):
        by_rows.setdefault(call.layout.rows, []).append(ratio)
    return {"floor_ms": round(limits.read_ms, 4), "read_gbs": round(limits.read_gbs, 1),
            "compute_ms_per_row": round(limits.compute_ms_per_row, 6), "gflops": round(limits.gflops, 1),
            "crossover_rows": round(limits.crossover_rows, 1), "spec_gflops": limits.spec_gflops,
            "spec_read_gbs": limits.spec_read_gbs, "weight_mb": round(limits.weight_bytes / 1e6, 1),
            "over_floor_per_call": [round(r, 2) for r in ratios], "rows_per_call": [c.layout.rows for c in calls],
            "median_over_floor": round(statistics.median(ratios), 2) if ratios else None,
            "max_over_floor": round(max(ratios), 2) if ratios else None,
            "median_over_floor_by_rows": {rows: round(statistics.median(v), 2) for rows, v in sorted(by_rows.items())}}


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    quiet_loaders()
    one_line_warnings()
    try:
        return _generate(args)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except Exception as error:  # noqa: BLE001 - an engine fault still gets one line, not a traceback
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(f"error: unexpected {type(error).__name__}: {first} (please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
