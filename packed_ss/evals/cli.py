"""``python -m packed_ss.bench --task ...``: the paper's experiments from the command line (the flags are the
benchmark's, parsed by :mod:`packed_ss.bench.cli`): check everything that can be checked before the model
loads (tasks, data, folder, sandbox), then run :func:`~packed_ss.evals.harness.run_harness` with a progress
bar per task and print the paper-style tables."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from packed_ss.bench.files import OutLock, check_out_folder
from packed_ss.bench.plan import NO_BLOCK, BenchError, check_positions, config_from_args
from packed_ss.bench.run import any_order_problem
from packed_ss.evals.harness import HarnessPlan, Processes, chat_wanted, check_resumable, print_paths, run_harness
from packed_ss.evals.paper import paper_markdown
from packed_ss.evals.task import load_task_data
from packed_ss.evals.task import Task
from packed_ss.evals.tasks import PAPER_BLOCK_SIZES, PAPER_SCHEDULES, parse_data, parse_tasks
from packed_ss.hf_reference import ReferenceFailed
from packed_ss.inputs import model_fingerprint, model_name, threads_problem
from packed_ss.sandbox import SandboxMissing, find_sandbox
from packed_ss.threads import configure_threads


def task_main(args) -> int:
    """``--task``: the paper's experiments through :mod:`packed_ss.evals.harness`, from the arguments
    :mod:`packed_ss.bench.cli` parsed. Returns the exit status: 0, 2 on a usage or write error (one line on
    stderr), 130 on an interrupt."""

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
        configs = tuple(config_from_args(args, task_defaults(task, args.temperature)) for task in tasks)
        for config in configs:
            check_positions(args.model, config)  # before anything is loaded or made
        data = tuple(_limited(load_task_data(task, paths.get(task.name)), args.limit) for task in tasks)
        lock = OutLock(args.out)  # one run per folder, held until this run ends
        check_out_folder(args.out, keep=args.resume, overwrite=args.overwrite, resumable=True)
        if args.resume:
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


def task_defaults(task: Task, temperature: float) -> dict:
    """What a task run takes where the flags are left out: the task's output cap, the paper's block sizes (32,
    Quadratic-SS 8) and schedules, and at T > 0 the task's samples per prompt (E.1-E.4)."""
    return {"block_size": PAPER_BLOCK_SIZES, "max_new_tokens": task.max_new_tokens, "schedules": PAPER_SCHEDULES,
            "samples": task.samples_sampled if temperature > 0 else 1}


def _limited(data, limit):
    """``data`` with its first ``limit`` records (all of them for None); its identity stays the whole data's."""
    return data if limit is None else dataclasses.replace(data, records=data.records[:limit])


def _run_tasks(args, plan) -> int:
    import torch
    import transformers

    from packed_ss.cli import announce_path, load_model

    procs = Processes(args.device)
    try:
        model = load_model(args.model, procs.device(args.device), args.dtype, args.family, args.drafter_lora,
                           args.base_model, args.cache, args.compile, args.path, announce=False)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
    for config in plan.configs:
        any_order_problem(model, config)
    announce_path(model)  # after the last refusal: a refused run prints one line
    print(configure_threads(model, args.threads), file=sys.stderr)
    chats = tuple(chat_wanted(model, task, config.temperature, plan.chat) for task, config in zip(plan.tasks, plan.configs))
    plan = dataclasses.replace(plan, chats=chats)
    first = plan.configs[0]
    meta = {"model": model_name(args.model), "model_sha256": model_fingerprint(args.model), "family": model.family,
            "any_order": bool(model.any_order), "device": str(model.device),
            "dtype": str(model.dtype).replace("torch.", ""), "torch": torch.__version__,
            "transformers": transformers.__version__, "temperature": first.temperature, "samples": first.samples,
            "order": first.order,
            "block_sizes": {s: first.block_size(s) for s in first.schedules if s not in NO_BLOCK},
            "threads": torch.get_num_threads(), "compiled": model.compiled,
            "graphs": model.graphs}
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
