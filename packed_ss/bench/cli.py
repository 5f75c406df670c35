"""``python -m packed_ss.bench``: parse the arguments, load the model, run, write the files (one-line errors,
exit 2; 130 on an interrupt)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


from packed_ss import stats
from packed_ss.config import ORDERS, DecodeConfig
from packed_ss.models import DTYPES
from packed_ss.inputs import model_fingerprint, model_name, threads_problem
from packed_ss.bench.plan import (ALL_SCHEDULES, KNOWN, BenchConfig, BenchError, Prompt, load_prompts, parse_block_sizes,
                                 parse_probe_block_sizes, parse_schedules)
from packed_ss.bench.report import summary_markdown, write_outputs
from packed_ss.bench.run import any_order_problem, run_benchmark


# --- command line -----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as a BenchError (one line, no usage block)."""

    def error(self, message):
        raise BenchError(message)


def _parser() -> argparse.ArgumentParser:
    from packed_ss.cli import DEFAULT_MODEL, add_model_flags

    p = _Parser(prog="python -m packed_ss.bench",
                description="Paired throughput benchmark of the decoding schedules (paper E.5, F.1, F.3).")
    p.add_argument("--prompts", default="humaneval", help="'humaneval' or a JSONL file with a 'prompt' field")
    p.add_argument("--limit", type=int, default=None, help="use the first N prompts (N >= 1)")
    p.add_argument("--schedules", default=",".join(ALL_SCHEDULES),
                   help="comma-separated, from " + ",".join(KNOWN) + " (hf-*: transformers' own generate, greedy)")
    p.add_argument("--drafter-width", type=int, default=DecodeConfig.drafter_width,
                   help="packed-mixed: masks per call in the diffusion half (default 3)")
    p.add_argument("--branches", type=int, default=DecodeConfig.branches,
                   help="partial: Quadratic-SS branches per call (default -1: from the fitted call cost)")
    p.add_argument("--order", default=DecodeConfig.order, choices=ORDERS,
                   help="any-order models: verification order, ltr or confidence (paper Appendix C, E.6)")
    p.add_argument("--block-size", default="8", help="B for all (8) or per schedule (linear=8,quadratic=4,packed=8)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--samples", type=int, default=1, help="runs per prompt and schedule (T > 0 only)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probe-block-sizes", default=None, help="block-size probe, e.g. 4,8,16,32 (F.1)")
    p.add_argument("--resamples", type=int, default=stats.RESAMPLES, help="bootstrap resamples (default 20000)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up runs")
    p.add_argument("--out", default="bench-out", help="output folder (default bench-out)")
    p.add_argument("--model", default=DEFAULT_MODEL, help="model folder or hub id (default: the embedded model)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help=f"one of {', '.join(DTYPES)} (default float32 on CPU)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    add_model_flags(p)
    return p


def check_out_folder(out_dir: str | Path) -> None:
    """Create ``out_dir`` and check that files can be written in it, before anything is measured.

    Raises: BenchError naming the folder and the reason (a file in the way, no permission...).
    """
    out = Path(out_dir)
    try:
        if out.exists() and not out.is_dir():
            raise BenchError(f"--out {str(out_dir)!r} is a file; give a folder")
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-check"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as error:
        raise BenchError(f"cannot write to --out {str(out_dir)!r}: {error.strerror or error}") from None


def config_from_args(args) -> BenchConfig:
    """Build and validate a :class:`BenchConfig` from parsed arguments. Raises: BenchError."""
    default, overrides = parse_block_sizes(args.block_size)
    probe = parse_probe_block_sizes(args.probe_block_sizes) if args.probe_block_sizes is not None else ()
    return BenchConfig(schedules=parse_schedules(args.schedules), block_sizes=overrides, default_block_size=default,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, samples=args.samples,
                       max_new_tokens=args.max_new_tokens, seed=args.seed, probe_block_sizes=probe,
                       warmup=not args.no_warmup, resamples=args.resamples, drafter_lora=bool(args.drafter_lora),
                       drafter_width=args.drafter_width, branches=args.branches, order=args.order)


def main(argv: list[str] | None = None) -> int:
    """Command line entry point. Returns 0, 2 on a usage error (one line on stderr), 130 on an interrupt."""
    try:
        args = _parser().parse_args(argv)
        config = config_from_args(args)
        if args.limit is not None and args.limit < 1:
            raise BenchError(f"--limit must be an integer >= 1, got {args.limit}")
        if threads_problem(args.threads):
            raise BenchError(threads_problem(args.threads))
        check_out_folder(args.out)  # found now, not after the measurements
        from packed_ss.models import device_dtype_problem

        problem = device_dtype_problem(args.device, args.dtype)
        if problem:
            raise BenchError(problem)
        prompts = load_prompts(args.prompts, args.limit)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        return _run(args, config, prompts)
    except BenchError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted before any measurement; nothing written", file=sys.stderr)
        return 130


def _run(args, config: BenchConfig, prompts: list[Prompt]) -> int:
    import torch
    from tqdm import tqdm

    from packed_ss.cli import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        model = load_model(args.model, args.device, args.dtype, args.family, args.drafter_lora, args.base_model)
    except ValueError as error:  # ModelLoadError included
        raise BenchError(str(error).splitlines()[0] if str(error) else repr(error)) from None
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
            "model_sha256": model_fingerprint(args.model), "prompt_source": str(args.prompts), "limit": args.limit,
            "threads": torch.get_num_threads()}
    result = run_benchmark(model, prompts, config, progress, meta)
    for bar in bars:
        bar.close()
    try:
        paths = write_outputs(result, args.out)
    except OSError as error:
        raise BenchError(f"cannot write to {args.out!r}: {error}") from None
    print(summary_markdown(result.summary))
    print("\n".join(f"wrote {path}" for path in paths.values()), file=sys.stderr)
    if result.interrupted:
        print(f"interrupted: wrote the {result.summary['meta']['runs_done']} of "
              f"{result.summary['meta']['runs_planned']} runs measured so far", file=sys.stderr)
        return 130
    return 0
