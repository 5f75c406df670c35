"""``python -m packed_ss.bench``: parse the arguments, load the model, run, write the files (one-line errors,
exit 2; 130 on an interrupt)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from packed_ss import stats
from packed_ss.config import ORDERS, DecodeConfig
from packed_ss.models import DTYPES
from packed_ss.inputs import model_fingerprint, model_name, threads_problem
from packed_ss.threads import configure_threads
from packed_ss.bench.plan import (ALL_SCHEDULES, KNOWN, NO_BLOCK, BenchConfig, BenchError, Prompt, load_prompts, parse_block_sizes,
                                 parse_probe_block_sizes, parse_schedules)
from packed_ss.bench.files import OutLock, check_out_folder, set_aside
from packed_ss.bench.report import PLOTLYJS, summary_markdown, write_outputs
from packed_ss.hf_reference import ReferenceFailed
from packed_ss.measure import EAGER_AR
from packed_ss.bench.run import any_order_problem, run_benchmark
from packed_ss.bench.sandbox import SandboxMissing, find_sandbox
from packed_ss.bench.tasks import PAPER_BLOCK_SIZES, PAPER_SCHEDULES, TASKS, load_task_data, parse_data, parse_tasks


# --- command line -----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as a BenchError (one line, no usage block)."""

    def error(self, message):
        raise BenchError(message)


def _parser() -> argparse.ArgumentParser:
    from packed_ss.cli import DEFAULT_MODEL, add_model_flags

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


def config_from_args(args, task=None) -> BenchConfig:
    """Build and validate a :class:`BenchConfig` from parsed arguments (a task's own defaults for the output cap
    and the block sizes when ``task`` is given and the arguments leave them out). Raises: BenchError."""
    blocks = args.block_size if args.block_size is not None else (PAPER_BLOCK_SIZES if task is not None else "8")
    new_tokens = args.max_new_tokens if args.max_new_tokens is not None else (
        task.max_new_tokens if task is not None else 128)
    samples = args.samples if args.samples is not None else (
        task.samples_sampled if task is not None and args.temperature > 0 else 1)
    default, overrides = parse_block_sizes(blocks)
    probe = parse_probe_block_sizes(args.probe_block_sizes) if args.probe_block_sizes is not None else ()
    schedules = args.schedules if args.schedules is not None else (
        PAPER_SCHEDULES if task is not None else ",".join(ALL_SCHEDULES))
    return BenchConfig(schedules=parse_schedules(schedules), block_sizes=overrides, default_block_size=default,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, samples=samples,
                       max_new_tokens=new_tokens, seed=args.seed, probe_block_sizes=probe,
                       warmup=not args.no_warmup, resamples=args.resamples, drafter_lora=bool(args.drafter_lora),
                       drafter_width=args.drafter_width, branches=args.branches, order=args.order)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point. Returns 0, 2 on a usage error (one line on stderr), 130 on an interrupt."""
    from packed_ss.cli import one_line_warnings, quiet_loaders, resolve_compile

    quiet_loaders()  # a refused checkpoint gets one line, not transformers' load table
    one_line_warnings()
    _file_size_limit_is_an_error()
    lock = None
    try:
        args = _parser().parse_args(argv)
        try:
            resolve_compile(args)
        except ValueError as error:
            raise BenchError(str(error)) from None
        if args.task is not None:
            return _task_main(args)
        for flag, given in (("--data", args.data), ("--resume", args.resume), ("--chat", args.chat != "paper"),
                            ("--unsafe-grading", args.unsafe_grading)):
            if given:
                raise BenchError(f"{flag} applies to --task runs only")
        config = config_from_args(args)
        if args.limit is not None and args.limit < 1:
            raise BenchError(f"--limit must be an integer >= 1, got {args.limit}")
        if threads_problem(args.threads):
            raise BenchError(threads_problem(args.threads))
        if EAGER_AR in config.schedules and not args.compile:
            raise BenchError(f"{EAGER_AR} times AR on eager calls beside --compile's AR: add --compile, or use ar")
        from packed_ss.models import device_dtype_problem

        problem = device_dtype_problem(args.device, args.dtype)
        if problem:
            raise BenchError(problem)
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


def _task_main(args) -> int:
    """``--task``: the paper's experiments through :mod:`packed_ss.bench.harness`. Returns the exit status."""
    from packed_ss.bench.harness import HarnessPlan

    lock = None
    try:
        tasks = parse_tasks(args.task)
        if args.prompts is not None:
            raise BenchError("--task and --prompts exclude each other (the task gives the prompts)")
        if args.resume and args.overwrite:
            raise BenchError("--resume keeps the runs in --out and --overwrite sets them aside: give one of them")
        paths = parse_data(args.data, tasks)
        if args.limit is not None and args.limit < 1:
            raise BenchError(f"--limit must be an integer >= 1, got {args.limit}")
        if args.probe_block_sizes is not None:
            raise BenchError("--probe-block-sizes is not part of the task runs; leave it out")
        if args.plotlyjs != "inline":
            raise BenchError("--plotlyjs applies to runs without --task only (the paper report embeds plotly.js)")
        if threads_problem(args.threads):
            raise BenchError(threads_problem(args.threads))
        from packed_ss.models import device_dtype_problem

        problem = device_dtype_problem(args.device, args.dtype)
        if problem:
            raise BenchError(problem)
        configs = tuple(config_from_args(args, task) for task in tasks)
        data = tuple(_limited(load_task_data(task, paths.get(task.name)), args.limit) for task in tasks)
        lock = OutLock(args.out)  # one run per folder, held until this run ends
        check_out_folder(args.out, keep=args.resume, overwrite=args.overwrite, resumable=True)
        if args.resume:
            from packed_ss.bench.harness import check_resumable

            check_resumable(Path(args.out), tasks)
        sandbox = None
        if any(task.runs_code for task in tasks):  # before the model loads: grading must be possible
            try:
                sandbox = find_sandbox(unsafe=args.unsafe_grading)
            except SandboxMissing as error:
                raise BenchError(str(error)) from None
            if sandbox.bwrap is None:
                print("warning: --unsafe-grading: generated code runs without a sandbox (audit hook and limits only)",
                      file=sys.stderr)
        plan = HarnessPlan(tasks, configs, data, chat=args.chat, resume=args.resume, overwrite=args.overwrite,
                           sandbox=sandbox)
        return _run_tasks(args, plan)
    except (BenchError, ReferenceFailed) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk or a file-size limit while writing the results
        print(f"error: cannot write to --out {args.out!r}: {error.strerror or error} (the files written before "
              f"are whole; nothing half-written is left)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        runs = Path(args.out) / "runs"
        print(f"interrupted: the runs measured so far are in {runs}; --resume goes on from there" if any(
            runs.glob("*.rows.jsonl")) else "interrupted before any run was measured", file=sys.stderr)
        return 130
    finally:
        if lock is not None:
            lock.release()


def _limited(data, limit):
    """``data`` with its first ``limit`` records (all of them for None); its identity stays the whole data's."""
    return data if limit is None else dataclasses.replace(data, records=data.records[:limit])


def _run_tasks(args, plan) -> int:
    import torch
    import transformers

    from packed_ss.bench.harness import Processes, chat_wanted, print_paths, run_harness
    from packed_ss.bench.paper import paper_markdown
    from packed_ss.cli import load_model

    procs = Processes(args.device)
    try:
        model = load_model(args.model, procs.device(args.device), args.dtype, args.family, args.drafter_lora,
                           args.base_model, args.cache, args.compile, args.path)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    print(configure_threads(model, args.threads), file=sys.stderr)
    for config in plan.configs:
        any_order_problem(model, config)
    chats = tuple(chat_wanted(model, task, config.temperature, plan.chat) for task, config in zip(plan.tasks, plan.configs))
    plan = dataclasses.replace(plan, chats=chats)
    first = plan.configs[0]
    meta = {"model": model_name(args.model), "model_sha256": model_fingerprint(args.model), "family": model.family,
            "any_order": bool(model.any_order), "device": str(model.device),
            "dtype": str(model.dtype).replace("torch.", ""), "torch": torch.__version__,
            "transformers": transformers.__version__, "temperature": first.temperature, "samples": first.samples,
            "order": first.order,
            "block_sizes": {s: first.block_size(s) for s in first.schedules if s not in NO_BLOCK},
            "threads": torch.get_num_threads(), "compiled": bool(args.compile)}
    report = run_harness(model, plan, Path(args.out), procs, meta, _bar_factory())
    if report is not None:
        print(paper_markdown(report))
        print_paths(Path(args.out), plan.tasks)
    return 0


def _bar_factory():
    """``label -> progress(done, total, text)``: one tqdm bar per label, on stderr."""
    from tqdm import tqdm

    def factory(label: str):
        bars = []

        def progress(done: int, total: int, text: str) -> None:
            if not bars:
                bars.append(tqdm(total=total, unit="run", desc=label, file=sys.stderr, dynamic_ncols=True))
            bar = bars[0]
            bar.set_postfix_str(text, refresh=False)
            bar.update(max(0, done - bar.n))
            if done >= total:
                bar.close()

        return progress

    return factory


def _run(args, config: BenchConfig, prompts: list[Prompt]) -> int:
    import torch
    from tqdm import tqdm

    from packed_ss.cli import load_model

    try:
        model = load_model(args.model, args.device, args.dtype, args.family, args.drafter_lora, args.base_model,
                           args.cache, args.compile, args.path)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
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

    any_order_problem(model, config)
    meta = {"model": model_name(args.model), "any_order": bool(getattr(model, "any_order", False)),
            "model_sha256": model_fingerprint(args.model), "prompt_source": str(args.prompts or "humaneval"),
            "limit": args.limit,
            "threads": torch.get_num_threads()}
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
