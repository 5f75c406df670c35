"""``python -m packed_ss.bench``: parse the arguments, load the model, run, write the files (one-line errors,
exit 2; 130 on an interrupt). With ``--task`` the same flags drive the evaluation harness instead
(:func:`packed_ss.evals.cli.task_main`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from packed_ss import stats
from packed_ss.config import ORDERS, DecodeConfig
from packed_ss.models import DTYPES
from packed_ss.inputs import model_fingerprint, model_name, threads_problem
from packed_ss.machine import machine
from packed_ss.threads import configure_threads
from packed_ss.bench.plan import (KNOWN, BenchConfig, BenchError, Prompt, check_positions, config_from_args,
                                  load_prompts)
from packed_ss.bench.files import OutLock, check_out_folder, set_aside
from packed_ss.bench.report import PLOTLYJS, summary_markdown, write_outputs
from packed_ss.hf_reference import ReferenceFailed
from packed_ss.measure import EAGER_AR
from packed_ss.bench.run import any_order_problem, run_benchmark


# --- command line -----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as a BenchError (one line, no usage block)."""

    def error(self, message):
        raise BenchError(message)


def _parser() -> argparse.ArgumentParser:
    from packed_ss.cli import DEFAULT_MODEL, add_model_flags
    from packed_ss.evals.tasks import PAPER_SCHEDULES, TASKS  # the --task flags' help

    p = _Parser(prog="python -m packed_ss.bench",
                description="Paired throughput benchmark of the decoding schedules (paper E.5, F.1, F.3).")
    p.add_argument("--prompts", default=None, help="'humaneval' (default) or a JSONL file with a 'prompt' field")
    p.add_argument("--task", default=None, metavar="TASKS",
                   help="the paper's tasks instead of --prompts, comma-separated from " + ",".join(TASKS)
                        + ": their prompts, output caps (512 code and writing, 1,024 mathematics) and block sizes "
                          "(32, Quadratic-SS 8) as defaults, graded accuracy beside speed, the paper's tables")
    p.add_argument("--data", default=None, action="append", metavar="[TASK=]PATH",
                   help="--task: a local copy of a task's records in the dataset's own format; TASK=PATH for each "
                        "of several tasks (repeat the flag), a bare PATH with one task")
    p.add_argument("--chat", default="paper", choices=("paper", "on", "off"),
                   help="--task: send prompts as a user message in the tokenizer's chat template: paper (default: "
                        "where the paper did, WritingBench at T > 0), on or off")
    p.add_argument("--resume", action="store_true",
                   help="--task: keep the runs already written to --out and measure only the prompts that lack some "
                        "(a finished run is re-graded without decoding anything)")
    p.add_argument("--overwrite", action="store_true",
                   help="--out may hold earlier results: they are moved into --out/replaced-<time>/, never deleted")
    p.add_argument("--unsafe-grading", action="store_true",
                   help="--task: grade generated code without a sandbox (bubblewrap) when none is installed: only "
                        "resource limits and an audit hook stand between the code and this machine")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts (N >= 1)")
    p.add_argument("--schedules", default=None,
                   help="comma-separated, from " + ",".join(KNOWN) + " (hf-*: transformers' own generate, greedy); "
                        "default all, --task: " + PAPER_SCHEDULES)
    p.add_argument("--drafter-width", type=int, default=DecodeConfig.drafter_width,
                   help="packed-mixed: masks per call in the diffusion half (default 3)")
    p.add_argument("--branches", type=int, default=DecodeConfig.branches,
                   help="partial: Quadratic-SS branches per call (default -1: from the fitted call cost)")
    p.add_argument("--order", default=DecodeConfig.order, choices=ORDERS,
                   help="any-order models: verification order, ltr or confidence (paper Appendix C, E.6)")
    p.add_argument("--confidence-threshold", type=float, default=DecodeConfig.confidence_threshold,
                   help="diffusion: commit the predictions at least this probable (default "
                        f"{DecodeConfig.confidence_threshold:g}; SetDLM's own default is 1.0)")
    p.add_argument("--block-size", default=None,
                   help="B for all (default 8; --task: 32 and quadratic=8) or per schedule (linear=8,quadratic=4)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=None,
                   help="runs per prompt and schedule (T > 0 only; default 1, --task at T > 0: the paper's 20 for "
                        "HumanEval, 7 for MBPP, 1 for the others)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (--task: the task's cap)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe-block-sizes", default=None, help="block-size probe, e.g. 4,8,16,32 (F.1)")
    p.add_argument("--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples (default 20000)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out)")
    p.add_argument("--plotlyjs", default="inline", choices=PLOTLYJS,
                   help="report.html: plotly.js embedded once (inline, the default: opens offline, about 4.8 MB) "
                        "or linked from plotly's CDN (cdn: some 50 kB); runs without --task")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model folder or hub id (default: the embedded model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help=f"one of {', '.join(DTYPES)} (default float32 on CPU)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: measured once before the runs, 1 against the cores)")
    add_model_flags(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """Command line entry point. Returns 0, 2 on a usage error (one line on stderr), 130 on an interrupt."""
    from packed_ss.cli import one_line_warnings, quiet_loaders, resolve_compile

    quiet_loaders()  # a refused checkpoint gets one line, not transformers' load table
    one_line_warnings()
    _file_size_limit_is_an_error()
    lock = None
    try:
        args = _parser().parse_args(argv)
        args.command_line = list(sys.argv[1:] if argv is None else argv)  # written into the report's header
        try:
            resolve_compile(args)
        except ValueError as error:
            raise BenchError(str(error)) from None
        if args.task is not None:
            from packed_ss.evals.cli import task_main

            return task_main(args)
        for flag, given in (("--data", args.data), ("--resume", args.resume), ("--chat", args.chat != "paper"),
                            ("--unsafe-grading", args.unsafe_grading)):
            if given:
                raise BenchError(f"{flag} applies to --task runs only")
        config = config_from_args(args)
        if args.limit is not None and args.limit < 1:
            raise BenchError(f"--limit must be an integer >= 1, got {args.limit}")
        if threads_problem(args.threads):
            raise BenchError(threads_problem(args.threads))
        if EAGER_AR in config.schedules and args.compile is False:  # None: the device decides (after loading)
            raise BenchError(f"{EAGER_AR} times AR on eager calls beside compiled AR, but compiling is off "
                             "(--no-compile or PACKED_SS_COMPILE=0): use ar")
        from packed_ss.models import device_dtype_problem

        problem = device_dtype_problem(args.device, args.dtype)
        if problem:
            raise BenchError(problem)
        check_positions(args.model, config)
        prompts = load_prompts(args.prompts or "humaneval", args.limit)
        lock = OutLock(args.out)  # one run per folder, held until this run ends
        check_out_folder(args.out, overwrite=args.overwrite)  # found now, not after the measurements
    except BenchError as error:
        if lock is not None:
            lock.release()
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _run(args, config, prompts)
    except (BenchError, ReferenceFailed) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before any measurement; nothing written", file=sys.stderr)
        return 130
    finally:
        lock.release()


def _file_size_limit_is_an_error() -> None:
    """Past a file-size limit (``ulimit -f``) a write fails with EFBIG, reported in one line, instead of the signal
    (SIGXFSZ) ending the process with a temporary file left behind."""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        except ValueError:  # not the main thread (a test calling main): the limit's signal stays as it is
            pass


def _run(args, config: BenchConfig, prompts: list[Prompt]) -> int:
    import torch
    from tqdm import tqdm

    from packed_ss.cli import announce_path, load_model

    try:
        model = load_model(args.model, args.device, args.dtype, args.family, args.drafter_lora, args.base_model,
                           args.cache, args.compile, args.path, announce=False)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    if EAGER_AR in config.schedules and not model.compiled:  # compile None on a CPU, or compiling failed
        raise BenchError(f"{EAGER_AR} times AR on eager calls beside compiled AR, but this model's calls are eager "
                         f"({model.compile_note or 'add --compile; CUDA graphs, the default on CUDA, need the native forward'})")
    any_order_problem(model, config)
    announce_path(model)  # after the last refusal: a refused run prints one line
    print(configure_threads(model, args.threads), file=sys.stderr)
    bars = []

    def progress(done: int, total: int, label: str) -> None:
        if not bars:
            bars.append(tqdm(total=total, unit="run", desc="benchmark", file=sys.stderr, dynamic_ncols=True))
        bar = bars[0]
        bar.set_postfix_str(label, refresh=False)
        if done > bar.n:
            bar.update(done - bar.n)  # keeps tqdm's rate estimate, hence the ETA
        else:
            bar.refresh()

    meta = {"model": model_name(args.model), "any_order": bool(getattr(model, "any_order", False)),
            "model_sha256": model_fingerprint(args.model), "prompt_source": str(args.prompts or "humaneval"),
            "limit": args.limit,
            "threads": torch.get_num_threads(), "machine": machine(),
            "command": "python -m packed_ss.bench " + shlex.join(getattr(args, "command_line", []))}
    result = run_benchmark(model, prompts, config, progress, meta)
    for bar in bars:
        bar.close()
    try:
        aside = set_aside(Path(args.out)) if args.overwrite else None
        if aside is not None:
            print(f"moved the earlier results in {args.out} to {aside}", file=sys.stderr)
        paths = write_outputs(result, args.out, args.plotlyjs)
    except OSError as error:
        raise BenchError(f"cannot write to {args.out!r}: {error}") from None
    print(summary_markdown(result.summary))
    print("\n".join(f"wrote {path}" for path in paths.values()), file=sys.stderr)
    if result.interrupted:
        print(f"interrupted: wrote the {result.summary['meta']['runs_done']} of "
              f"{result.summary['meta']['runs_planned']} runs measured so far", file=sys.stderr)
        return 130
    return 0
