"""One-shot GPU check: environment, CUDA tests, the graph path's call cost, the paper's experiment, lossless check.

Usage::

    python scripts/gpu_check.py [--out gpu_check.json] [--device cuda] [--quick] [--budget-s 270]
                                [--cuda-tests-s 150] [--quality 0.985] [--only SECTIONS]

Writes ONE JSON file (rewritten after every section, so a run cut short still leaves what it measured)
with the sections, in this order (the last ones are skipped first when time runs out):

1. ``environment``: Python, torch and transformers versions, device name, CUDA version, dtypes checked.
2. ``cuda_tests``: ``pytest tests/test_cuda.py`` in a subprocess, in one process (no xdist), verbose, stopping at
   the first failure, with the slowest durations, within ``--cuda-tests-s`` seconds (its own budget, not the
   sections'): exit code, whether it timed out, summary line and the output's tail; the whole output is written as
   it comes to ``<out>.cuda_tests.log``, so a timeout (or this script's end) keeps what it printed.
3. ``graph_call_cost``: the graph path's per-call model time (ms) against R = 1..256 for NLD-3B- and NLD-8B-shaped
   bfloat16 models: the adapter's whole call and the graph's replay alone (CUDA events), each over the floor (the
   larger of the call's arithmetic and one read of the weights, measured on the device, the datasheet's peaks
   beside); what ran, read after the calls: graphs, note, the shapes replayed, graphs captured and replays.
4. ``paper_experiment``: the paper's race in its own regime: randomly initialised decoders shaped like NLD-8B and
   NLD-3B (Ministral3 layers; both shapes in bfloat16, then both in float32), each raced on the graph path and on
   transformers' forward over the same weights: AR, Linear-SS (B = 32), Quadratic-SS (B = 8) and Packed-SS
   (B = 32) with the scripted drafter at quality ``--quality`` (default 0.985; ``follow``: its reference follows a
   run that leaves AR's output at a near-tie), on a few prompts, each lane run once untimed and once timed:
   tokens/NFE, model time per iteration (the paper's Table 5 quantity, ms), time/NFE (ms), throughput
   (tokens/s), agreement with AR, the Packed/Linear and Packed/Quadratic speed ratios and each lane's
   graph-path/transformers speed ratio, with paired bootstrap intervals over the prompts; written after each
   shape, dtype and forward.
5. ``lossless``: greedy decoding of the embedded model (``assets/model``) on the app's default path (on CUDA the
   graph path) in float32 and bfloat16; for each speculative schedule, the prompts whose tokens differ from AR's in
   the same dtype, with the first differing index and AR's top-2 logit margin there (logits, from one no-cache
   forward) and whether that margin is a near-tie (threshold per dtype, written into the JSON).
6. ``race_graphs``: AR, Linear-SS, Quadratic-SS and Packed-SS on one prompt (embedded model, bfloat16, B = 8,
   128 new tokens) on the graph path, repeats in rotated order: medians of wall time (s), tokens/NFE, time/NFE
   (ms) and throughput (tokens/s); its graphs recorded in an untimed full-length warm-up (the recording time is
   reported, and what ran, read after the runs: graphs, shapes, captures, and why it fell back to eager calls).
7. ``race``: the same race on transformers' forward.
8. ``per_call_cost``: transformers' forward per call (the baseline of section 3), R = 1, 2, 4, ..., 256 on top of
   a fixed cached prefix, median of several repeats after warm-up, for the embedded model (float32, bfloat16) and
   a randomly initialised ~1B-parameter model of Nemotron-Labs-Diffusion's shape (Ministral3, bfloat16).
9. ``kernel_profile``: where an eager native call of the paper's shapes spends its device time (kernels per call,
   their time, the 8 that take most; ``torch.profiler``), after every timing, so that no profiler runs between
   timings that are compared.

The sections keep within ``--budget-s`` seconds (default 270) besides the CUDA tests' ``--cuda-tests-s`` (default
150), so that the check ends within 7.5 minutes with model loading and start-up: sections that no longer fit are
recorded as ``"skipped: time budget"``.
Expected failures (no CUDA, out of memory, a load error) are recorded as strings in the JSON
and the remaining sections still run. ``--quick`` shrinks every size so that ``--device cpu --quick``
finishes in well under two minutes on a laptop CPU.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EMBEDDED = ROOT / "assets" / "model"
DTYPES = ("float32", "bfloat16")  # dtypes the lossless check and the embedded model's cost cover
SKIPPED = "skipped: time budget"

PROMPTS = (
    "def fibonacci(n):\n",
    "def is_even(n):\n    \"\"\"Return True when n is even.\"\"\"\n",
    "import os\n\ndef list_files(path):\n",
    "class Stack:\n    def __init__(self):\n",
    "for i in range(10):\n",
    "The quick brown fox",
    "# Sort a list of numbers\nnumbers = [5, 3, 8, 1]\n",
    "def read_json(path):\n    with open(path) as f:\n",
)

# Nemotron-Labs-Diffusion-like decoder of about 1B parameters (Ministral3 layers, yarn rope with the
# Llama-4 query scaling), and a few-MB version of it for --quick.
NLD_SHAPE = dict(hidden_size=2048, head_dim=128, num_attention_heads=16, num_key_value_heads=8,
                 num_hidden_layers=16, intermediate_size=6144, vocab_size=131072)
NLD_QUICK_SHAPE = dict(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=2, intermediate_size=128, vocab_size=4096)
NLD_ROPE = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 16384, "rope_theta": 1e6,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": 0.1}
NLD_MASK_ID = 100
# The paper's model sizes (random weights), and two small stand-ins for --quick
PAPER_SHAPES = {"NLD-8B": dict(hidden_size=4096, head_dim=128, num_attention_heads=32, num_key_value_heads=8,
                               num_hidden_layers=36, intermediate_size=12288, vocab_size=131072),
                "NLD-3B": dict(hidden_size=3072, head_dim=128, num_attention_heads=32, num_key_value_heads=8,
                               num_hidden_layers=26, intermediate_size=9216, vocab_size=131072)}
PAPER_QUICK_SHAPES = {"small-2L": NLD_QUICK_SHAPE, "small-3L": {**NLD_QUICK_SHAPE, "num_hidden_layers": 3}}
PAPER_LANES = (("ar", 32), ("linear", 32), ("quadratic", 8), ("packed", 32))  # the paper's block sizes
PAPER_QUALITY = 0.985  # the scripted drafter: a proposal k tokens past its last verified one is right with 0.985**k


class Sizes:
    """Sizes of one check: full (on a GPU) or ``--quick`` (tiny, for trying the script on a CPU)."""

    def __init__(self, quick: bool, quality: float = PAPER_QUALITY):
        self.paper_quality = quality  # the paper experiment's scripted drafter (PAPER_QUALITY)
        self.prompts = PROMPTS[:2] if quick else PROMPTS
        self.block_size = 8
        self.lossless_tokens = 16 if quick else 64  # new tokens per lossless run
        self.cost_prefix = 16 if quick else 128  # cached tokens under each timed call
        self.cost_rows = tuple(2**k for k in range(5 if quick else 9))  # R = 1..16 or 1..256
        self.cost_repeats = 3 if quick else 7  # timed calls per R (median taken)
        self.cost_warmup = 1 if quick else 3  # untimed calls per R before the timed ones
        self.nld_shape = NLD_QUICK_SHAPE if quick else NLD_SHAPE
        self.race_tokens = 32 if quick else 128
        self.race_repeats = 2 if quick else 3
        self.race_schedules = ("ar", "linear", "quadratic", "packed")
        self.paper_shapes = PAPER_QUICK_SHAPES if quick else PAPER_SHAPES
        self.paper_lanes = tuple((name, min(b, 8) if quick else b) for name, b in PAPER_LANES)
        self.paper_prompts = PROMPTS[:2] if quick else PROMPTS[:3]
        self.paper_dtypes = ("bfloat16", "float32")  # the paper's precision first
        self.paper_tokens = 24 if quick else 128


class Budget:
    """Wall-clock budget of the sections, in seconds from the script's start less the seconds set aside (work with a
    budget of its own, the CUDA tests)."""

    def __init__(self, total_s: float):
        self.total_s = total_s
        self.start = time.perf_counter()
        self.aside = 0.0  # seconds spent on work outside this budget

    def elapsed(self) -> float:
        """Seconds since the start (all of them, those set aside included)."""
        return time.perf_counter() - self.start

    def set_aside(self, seconds: float) -> None:
        """Leave ``seconds`` already spent out of the budget (they were another budget's)."""
        self.aside += seconds

    def left(self) -> float:
        """Seconds still available (negative once over)."""
        return self.total_s - (self.elapsed() - self.aside)

    def allows(self, needed_s: float) -> bool:
        """Whether ``needed_s`` more seconds still fit."""
        return self.left() >= needed_s


def error_text(error: BaseException) -> dict:
    """An exception as JSON: its one-line message and the innermost frame it came from (no traceback)."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}" if frames else ""
    return {"error": f"{type(error).__name__}: {error}".strip(), "where": where}


def median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def free_memory() -> None:
    """Release what deleted models left on the GPU (no-op without CUDA)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# --- 1. environment --------------------------------------------------------------------------------
def environment(device: str, quick: bool, budget_s: float) -> dict:
    """Versions and the device this check ran on."""
    import torch
    import transformers

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "cuda_version": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "dtypes": list(DTYPES),
        "quick": quick,
        "budget_s": budget_s,
    }
    if torch.device(device).type == "cuda" and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info.update(device_name=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    compute_capability=f"{props.major}.{props.minor}",
                    cudnn_version=torch.backends.cudnn.version(), bf16_supported=torch.cuda.is_bf16_supported())
    else:
        info.update(device_name=platform.processor() or platform.machine(), cpu_threads=torch.get_num_threads())
    return info


# --- 2. CUDA tests ---------------------------------------------------------------------------------
CUDA_TESTS = "tests/test_cuda.py"
CUDA_TESTS_S = 150.0  # the CUDA tests' own budget (seconds), apart from the sections' --budget-s
INTERRUPT_GRACE_S = 10.0  # after a timeout: seconds between the interrupt (pytest then prints where it was) and a kill
TAIL_LINES, TAIL_CHARS = 40, 4000  # the output kept in the JSON


def run_captured(command: list[str], timeout_s: float, log: Path) -> dict:
    """Run ``command`` (in the repository, Python unbuffered) with its stdout and stderr written to ``log`` as they
    come, so that what it printed is kept however it ends, this script's own end included. After ``timeout_s``
    seconds its process group is interrupted (pytest prints the test it was in), and killed
    :data:`INTERRUPT_GRACE_S` seconds later if still there.

    Returns ``exit_code`` (None when it timed out), ``timed_out``, ``wall_s`` (seconds), ``output_tail`` (its last
    :data:`TAIL_LINES` non-empty lines, at most :data:`TAIL_CHARS` characters) and ``log`` (the path)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "wb") as sink:
        process = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        try:
            code, timed_out = process.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            code, timed_out = None, True
            _stop(process)
    lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return {"exit_code": code, "timed_out": timed_out, "wall_s": round(time.perf_counter() - start, 2),
            "output_tail": "\n".join(lines[-TAIL_LINES:])[-TAIL_CHARS:], "log": str(log)}


def _stop(process: subprocess.Popen) -> None:
    """Interrupt ``process``'s process group (its own), then kill the group if it is still there after the grace."""
    for sent, wait_s in ((signal.SIGINT, INTERRUPT_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sent)
        except ProcessLookupError:  # gone already
            break
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def cuda_tests(timeout_s: float, log: Path, module: str = CUDA_TESTS) -> dict:
    """Run ``pytest`` on ``module`` in a subprocess: one process (no xdist workers), verbose (each test named as it
    starts), stopping at the first failure, with the 15 slowest tests' durations; its output in ``log``
    (:func:`run_captured`). Returns the command, exit code, whether it timed out, summary line, wall time (s) and
    the output's tail (the durations, or the failure, or where it was when it timed out)."""
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:xdist", "-o", "addopts=-p no:cacheprovider -rs",
               "-x", "--durations=15", module]
    done = run_captured(command, timeout_s, log)
    lines = done["output_tail"].splitlines()
    summary = (f"timed out after {timeout_s:.0f} s in {_running(lines)}" if done["timed_out"]
               else lines[-1] if lines else "(no output)")
    return {"command": shlex.join(command[1:]), "timeout_s": timeout_s, "summary": summary, **done}


def _running(lines: list[str]) -> str:
    """The test pytest ``-v`` had started and not finished in ``lines`` (its last test line without an outcome)."""
    outcomes = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
    started = [line.split()[0] for line in lines if "::" in line and not any(o in line.split() for o in outcomes)]
    return started[-1] if started else "(no test started)"


# --- models ----------------------------------------------------------------------------------------
class Models:
    """The embedded model, loaded once per dtype and path on the check's device."""

    def __init__(self, device: str):
        self.device = device
        self._loaded = {}

    def embedded(self, dtype: str, path: str = "auto"):
        """``path="auto"``: the app's default (on CUDA the graph path); ``"transformers"``: transformers' forward."""
        if (dtype, path) not in self._loaded:
            from packed_ss.models import DualModeModel

            self._loaded[dtype, path] = DualModeModel.from_pretrained(EMBEDDED, device=self.device, dtype=dtype,
                                                                      path=path)
        return self._loaded[dtype, path]


def nld_shaped_model(device: str, shape: dict, tokenizer, dtype: str = "bfloat16", path: str = "transformers",
                     compiled: bool | None = False):
    """A randomly initialised Ministral3 model of ``shape`` in ``dtype``, built directly on ``device``.

    Wrapped as a :class:`DualModeModel` with the embedded model's tokenizer, mask id 100 and no EOS (``path``,
    ``compiled``: as ``DualModeModel`` takes them; ``path="native", compiled=None`` is the graph path on CUDA and
    eager native calls elsewhere). :func:`wrapped` gives the same network on another path.
    """
    import torch
    from transformers import Ministral3Config, Ministral3ForCausalLM

    vocab = max(shape["vocab_size"], len(tokenizer))
    config = Ministral3Config(**{**shape, "vocab_size": vocab}, rope_parameters=dict(NLD_ROPE),
                              tie_word_embeddings=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Ministral3ForCausalLM._from_config(config, dtype=getattr(torch, dtype))
    return wrapped(model, tokenizer, path, compiled)


def wrapped(network, tokenizer, path: str, compiled: bool | None = False):
    """An NLD-shaped ``network`` (a transformers causal LM) as a :class:`DualModeModel` on ``path``."""
    from packed_ss.models import DualModeModel

    return DualModeModel(network, tokenizer, mask_token_id=NLD_MASK_ID, eos_token_id=None, path=path,
                         compiled=compiled)


# --- 3. lossless -----------------------------------------------------------------------------------
def lossless(models: Models, sizes: Sizes, budget: Budget) -> dict:
    """Greedy tokens of every speculative schedule against AR's, per dtype, with margins at differences."""
    from packed_ss import DecodeConfig, generate
    from packed_ss.schedules import SPECULATIVE

    from packed_ss.divergence import NEAR_TIE_LOGITS

    config = DecodeConfig(block_size=sizes.block_size, max_new_tokens=sizes.lossless_tokens)
    thresholds = {str(dtype).removeprefix("torch."): value for dtype, value in NEAR_TIE_LOGITS.items()}
    result = {"near_tie_threshold_logits": thresholds, "block_size": config.block_size,
              "max_new_tokens": config.max_new_tokens, "prompts": list(sizes.prompts)}
    for dtype in DTYPES:
        if not budget.allows(20):
            result[dtype] = SKIPPED
            continue
        try:
            result[dtype] = lossless_one_dtype(models.embedded(dtype), dtype, sizes, config, budget,
                                               SPECULATIVE, generate)
        except Exception as error:  # noqa: BLE001 - record and go on with the next dtype
            result[dtype] = error_text(error)
    return result


def lossless_one_dtype(model, dtype, sizes, config, budget, schedules, generate) -> dict:
    """Per schedule: prompts checked, prompts differing from AR, and each difference with AR's top-2
    margin there and the near-tie verdict (:func:`packed_ss.divergence.divergence`)."""
    from packed_ss.divergence import divergence

    per_schedule = {name: {"prompts_checked": 0, "prompts_differing": 0, "differences": []} for name in schedules}
    out = {"schedules": per_schedule}
    for index, text in enumerate(sizes.prompts):
        if not budget.allows(15):
            out["partial"] = f"{SKIPPED} after {index} prompts"
            break
        prompt = model.encode(text)
        ar = list(generate(model, prompt, config, "ar").token_ids)
        for name in schedules:
            tokens = list(generate(model, prompt, config, name).token_ids)
            entry = per_schedule[name]
            entry["prompts_checked"] += 1
            found = divergence(model, prompt, ar, tokens)
            if found is not None:
                entry["prompts_differing"] += 1
                entry["differences"].append({"prompt_index": index, **found.as_dict()})
    for entry in per_schedule.values():
        entry["all_differences_near_ties"] = all(d["near_tie"] for d in entry["differences"])
    return out


# --- 4. per-call cost ------------------------------------------------------------------------------
def call_costs(model, sizes: Sizes, budget: Budget) -> dict:
    """Model time (ms) of one causal call of R rows over a cached prefix of ``sizes.cost_prefix`` tokens.

    Every call computes the logits of all its R rows (a packed call needs nearly all of them). The cache, sized for
    the longest call from the start (one capacity for every call), is rolled back to the prefix before each call.
    Returns R -> median / min ms and the ratio to R = 1, and ``graph_replays``: how many of the timed calls replayed
    a graph, read from the calls' count after them (None where the calls do not count replays); on the graph path
    also ``replay_ms``, the device time of the graph's replay alone (CUDA events, :meth:`GraphCalls.replay_ms`).
    """
    import torch

    from packed_ss.layout import verify_layout

    generator = torch.Generator().manual_seed(0)
    prefix = sizes.cost_prefix
    ids = torch.randint(2, len(model.tokenizer), (prefix + max(sizes.cost_rows),), generator=generator).tolist()
    model.reset(prefix + max(sizes.cost_rows))
    model.forward(verify_layout(ids[:prefix], [], 0), ())
    rows_table = []
    for rows in sizes.cost_rows:
        if not budget.allows(10):
            rows_table.append({"rows": rows, "skipped": SKIPPED})
            break
        layout = verify_layout(ids[prefix:prefix + rows], [], prefix)
        keep = tuple(range(rows))
        times, before = [], None
        for attempt in range(sizes.cost_warmup + sizes.cost_repeats):
            model.rollback(prefix)
            if attempt == sizes.cost_warmup:
                before = _replays(model)
            ms = model.forward(layout, keep).model_ms
            if attempt >= sizes.cost_warmup:
                times.append(ms)
        after = _replays(model)
        rows_table.append({"rows": rows, "median_ms": median(times), "min_ms": min(times), "repeats": len(times),
                           "graph_replays": None if before is None or after is None else after - before})
    replays = model.static.replay_ms(sizes.cost_repeats) if getattr(model, "graphs", False) else {}
    for row in rows_table:
        if row["rows"] in replays:
            row["replay_ms"] = replays[row["rows"]]
    model.reset()
    base = rows_table[0].get("median_ms")
    for row in rows_table:
        if base and row.get("median_ms") is not None:
            row["relative_to_1_row"] = row["median_ms"] / base
    return {"cached_prefix_tokens": prefix, "warmup_calls_per_R": sizes.cost_warmup, "by_rows": rows_table}


def _replays(model) -> int | None:
    """The graph replays ``model``'s calls have made so far, or None where its calls do not count them."""
    return getattr(model.static, "replays", None) if model.static is not None else None


def per_call_cost(models: Models, sizes: Sizes, budget: Budget, device: str) -> dict:
    """Call cost against rows on transformers' forward (the baseline of :func:`graph_call_cost`) for the embedded
    model (each dtype) and the NLD-shaped bfloat16 model."""
    result = {"unit": "ms per call (model time, CUDA-synchronised)", "forward": "transformers (eager)"}
    for dtype in DTYPES:
        key = f"embedded_{dtype}"
        if not budget.allows(15):
            result[key] = SKIPPED
            continue
        try:
            result[key] = call_costs(models.embedded(dtype, "transformers"), sizes, budget)
        except Exception as error:  # noqa: BLE001
            result[key] = error_text(error)
    key = "nld_shaped_bfloat16"
    if not budget.allows(30):
        result[key] = SKIPPED
        return result
    model = None
    try:
        model = nld_shaped_model(device, sizes.nld_shape, models.embedded("float32").tokenizer)
        shape = {**sizes.nld_shape, "vocab_size": model.vocab_size,
                 "parameters": sum(p.numel() for p in model.model.parameters())}
        result[key] = {"shape": shape, "rope_parameters": NLD_ROPE, **call_costs(model, sizes, budget)}
    except Exception as error:  # noqa: BLE001 - e.g. out of memory on a small GPU
        result[key] = error_text(error)
    finally:
        del model
        free_memory()
    return result


def what_ran(*adapters) -> dict:
    """What the calls of ``adapters`` ran, read after them (a capture that fails turns every adapter of the network
    to eager calls and says why; one out of memory twice leaves that shape eager): ``graphs`` whether all of them
    replay CUDA graphs now and, where replays are counted, replayed at least one, ``note`` the first one's note
    (``compile_note``: why not, or which shape runs eagerly, or None), ``shapes`` the (rows, cache capacity) of their
    graphs or compiled calls, ``eager_shapes`` those whose capture ran out of memory (their calls ran eagerly), and
    ``captures`` and ``replays``, graphs captured and replays made, summed over them (None where the calls do not
    count them)."""
    statics = [adapter.static for adapter in adapters if adapter.static is not None]

    def counted(name: str) -> int | None:
        found = [getattr(static, name, None) for static in statics]
        return None if not found or None in found else sum(found)

    replays = counted("replays")
    refused = {tuple(key[:2]) for static in statics for key in getattr(getattr(static, "_recorder", None),
                                                                          "too_large", None) or {}}
    return {"graphs": bool(adapters) and all(adapter.graphs for adapter in adapters) and replays != 0,
            "note": next((adapter.compile_note for adapter in adapters if adapter.compile_note), None),
            "shapes": [list(shape) for shape in dict.fromkeys(tuple(s) for static in statics for s in static.shapes)],
            "eager_shapes": [list(shape) for shape in sorted(refused)],
            "captures": counted("captures"), "replays": replays}


def graph_call_cost(models: Models, sizes: Sizes, budget: Budget, device: str) -> dict:
    """Per-call model time on the graph path (issue 55: the native forward's calls replayed as CUDA graphs) for the
    paper's shapes in bfloat16, against R = 1..256, with the floor (:func:`packed_ss.cost.roofline`: the larger of
    the call's arithmetic and one read of the weights, measured on the device) and each R's median over it, for each
    way the native forward can attend (``attention``, an adapter of its own each). What ran is read after the calls
    (:func:`what_ran`): where the graph path cannot run (no CUDA device, a capture failure) ``graphs`` is false,
    ``note`` says why and the calls measured from then on are eager native ones. Where an eager call's device time
    goes is the last section's (:func:`kernel_profiles`), after every timing."""
    from packed_ss.cost import roofline
    from packed_ss.models.native import ATTENTIONS

    result = {"unit": "ms per call: median_ms the adapter's call (host copies and replay; CUDA-synchronised), "
                      "replay_ms the graph's replay alone (CUDA events)", "dtype": "bfloat16",
              "attentions": {"written": "the call's keys written into the cache, then scores, softmax and values "
                                       "over the cache as separate kernels (the default)",
                             "sdpa": "the call's keys written into the cache, then one "
                                     "scaled_dot_product_attention over it"}}
    from packed_ss.models.op_count import COMPILED_FORM, GRAPH_FORMS, operations_per_layer

    # the kernels a layer launches, counted on the host (what the kernel profile sees on the device)
    result["operations_per_layer"] = {"compiled_form": sum(operations_per_layer(COMPILED_FORM).values()),
                                      **{form.attention: sum(operations_per_layer(form).values())
                                         for form in GRAPH_FORMS}}
    tokenizer = models.embedded("float32").tokenizer
    for name, shape in sizes.paper_shapes.items():
        if not budget.allows(30):
            result[name] = SKIPPED
            continue
        model = None
        try:
            model = nld_shaped_model(device, shape, tokenizer, "bfloat16", path="native", compiled=None)
            limits = roofline(model)
            entry = {"path": model.path, **floor_fields(limits)}
            # each attention of the native forward (ATTENTIONS) on an adapter of its own: its own graphs
            for attention in ATTENTIONS:
                if attention != ATTENTIONS[0] and not budget.allows(20):
                    entry[attention] = SKIPPED
                    continue
                adapter = model.share()
                # the graphs' attention (GraphCalls.graph_attention); off the graph path, the eager calls'
                setattr(adapter.static, "graph_attention" if adapter.graphs else "attention", attention)
                part = call_costs(adapter, sizes, budget)
                part.update(what_ran(adapter), capture_s=round(adapter.static.compile_s, 2))
                for row in part["by_rows"]:
                    if row.get("median_ms") is not None:
                        row["over_floor"] = limits.over(row["median_ms"], row["rows"])
                    if row.get("replay_ms") is not None:
                        row["replay_over_floor"] = limits.over(row["replay_ms"], row["rows"])
                entry[attention] = part
                adapter = None
            entry.update(_ran_over(entry, on_cuda=device.startswith("cuda")))
            result[name] = entry
        except Exception as error:  # noqa: BLE001 - out of memory, a capture failure: data, the rest still runs
            result[name] = error_text(error)
        finally:
            model = None
            free_memory()
    return result


def floor_fields(limits) -> dict:
    """A :class:`packed_ss.cost.Roofline` as JSON: the weight read (ms, the floor up to ``crossover_rows``), the
    arithmetic per row (ms), the measured GFLOP/s and GB/s and the datasheet's (None where the device is not known)."""
    return {"floor_ms": limits.read_ms, "compute_ms_per_row": limits.compute_ms_per_row,
            "crossover_rows": limits.crossover_rows, "gflops": limits.gflops, "read_gbs": limits.read_gbs,
            "spec_gflops": limits.spec_gflops, "spec_read_gbs": limits.spec_read_gbs}


def _ran_over(entry: dict, on_cuda: bool) -> dict:
    """What ran over a shape's attentions (their :func:`what_ran` parts): graphs only if every one replayed them,
    the first note (without graphs on a CPU: that there is no CUDA device), captures and replays summed."""
    parts = [part for part in entry.values() if isinstance(part, dict) and "graphs" in part]
    note = next((part["note"] for part in parts if part["note"]), None)
    counts = {key: None if not parts or any(part[key] is None for part in parts) else sum(part[key] for part in parts)
              for key in ("captures", "replays")}
    graphs = bool(parts) and all(part["graphs"] for part in parts)
    return {"graphs": graphs,
            "note": note or (None if on_cuda or graphs else "no CUDA device: eager native calls"), **counts}


def kernel_profiles(models: Models, sizes: Sizes, budget: Budget, device: str) -> dict:
    """Where an eager native call's device time goes (:func:`kernel_profile`) for each of the paper's shapes in
    bfloat16 and each way the native forward attends: the last section, after every timing (a profiler running
    between two timings that are compared skews the second). What the next step toward the floor has to fuse."""
    from packed_ss.models.native import ATTENTIONS

    tokenizer = models.embedded("float32").tokenizer
    result = {"dtype": "bfloat16"}
    for name, shape in sizes.paper_shapes.items():
        if not budget.allows(15):
            result[name] = SKIPPED
            continue
        model = None
        try:
            model = nld_shaped_model(device, shape, tokenizer, "bfloat16", path="native", compiled=False)
            result[name] = {attention: kernel_profile(model, sizes, attention=attention) for attention in ATTENTIONS}
        except Exception as error:  # noqa: BLE001 - out of memory: data, the rest still runs
            result[name] = error_text(error)
        finally:
            model = None
            free_memory()
    return result


def kernel_profile(model, sizes: Sizes, rows: int = 32, calls: int = 3, attention: str = "written") -> dict:
    """Where one eager native call of ``rows`` rows spends its device time (``torch.profiler``): on CUDA its kernels
    per call, their summed time per call (ms: about what the call's graph replay costs, launches aside) and the 8
    kernels that take most; on a CPU the same for its operators (self times). What the next step toward the floor
    has to fuse."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from packed_ss.layout import verify_layout

    cuda = model.device.type == "cuda"
    eager = model.share(compiled=False)
    eager.static.attention = attention
    prefix = sizes.cost_prefix
    never = set(model.never_emit_ids)
    ids = [t for t in range(2, 2 + prefix + rows + len(never)) if t not in never][:prefix + rows]
    eager.reset(prefix + rows)
    eager.forward(verify_layout(ids[:prefix], [], 0), ())
    layout = verify_layout(ids[prefix:], [], prefix)
    for _ in range(2):  # untimed
        eager.rollback(prefix)
        eager.forward(layout, tuple(range(rows)))
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            eager.rollback(prefix)
            eager.forward(layout, tuple(range(rows)))
    kind = DeviceType.CUDA if cuda else DeviceType.CPU
    found = [e for e in prof.key_averages() if e.device_type == kind]
    own = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)  # microseconds
    top = sorted(found, key=own, reverse=True)[:8]
    per_call = sum(e.count for e in found) / calls
    layers = model.model.config.num_hidden_layers
    return {"rows": rows, "cached_tokens": prefix, "unit": "kernels" if cuda else "operators",
            "per_call": per_call, "per_layer": per_call / layers,  # the head's, the mask's... shared among layers
            "ms_per_call": sum(map(own, found)) / 1000 / calls,
            "top": [{"name": e.key[:100], "ms_per_call": own(e) / 1000 / calls, "per_call": e.count / calls}
                    for e in top]}


# --- 5. race ---------------------------------------------------------------------------------------
def race(models: Models, sizes: Sizes, budget: Budget, path: str = "transformers") -> dict:
    """Each schedule on one prompt, repeats in rotated order; medians per schedule. ``path``: ``"transformers"``
    (its forward, eager) or ``"auto"`` (the app's default: on CUDA the graph path, whose graphs are recorded in an
    untimed full-length warm-up, at the timed runs' cache capacity; the recording time is reported, and what ran,
    read after the runs: :func:`what_ran`).

    Units: wall_s seconds of decoder time, time_per_nfe_ms milliseconds, throughput tokens per second.
    """
    from packed_ss import DecodeConfig, generate

    model = models.embedded("bfloat16", path)
    compiled = model.compiled
    prompt_text = sizes.prompts[0]
    prompt = model.encode(prompt_text)
    config = DecodeConfig(block_size=sizes.block_size, max_new_tokens=sizes.race_tokens)
    warmup = config if compiled else DecodeConfig(block_size=sizes.block_size, max_new_tokens=8)
    schedules = sizes.race_schedules
    for name in schedules:  # untimed: first-call kernels and allocator growth stay out of the medians
        generate(model, prompt, warmup, name)
    runs = {name: [] for name in schedules}
    out = {"prompt": prompt_text, "dtype": "bfloat16", "block_size": config.block_size,
           "max_new_tokens": config.max_new_tokens, "path": model.path}
    for repeat in range(sizes.race_repeats):
        if repeat and not budget.allows(10):
            out["partial"] = f"{SKIPPED} after {repeat} repeats"
            break
        order = schedules[repeat % len(schedules):] + schedules[:repeat % len(schedules)]
        for name in order:
            runs[name].append(generate(model, prompt, config, name))
    # what ran, read after the runs: a capture that failed in them turned the graphs off and says why
    out.update(what_ran(model), compiled=model.compiled, compile_s=model.static.compile_s if model.static else 0.0)
    ar_tokens = runs["ar"][0].token_ids if runs.get("ar") else None
    table = {}
    for name, done in runs.items():
        table[name] = {
            "repeats": len(done),
            "tokens": done[0].tokens,
            "nfe": done[0].nfe,
            "wall_s": median(r.wall_s for r in done),
            "tokens_per_nfe": median(r.tokens_per_nfe for r in done),
            "time_per_nfe_ms": median(r.time_per_nfe_ms for r in done),
            "throughput": median(r.throughput for r in done),
            "same_tokens_as_ar": None if ar_tokens is None else done[0].token_ids == ar_tokens,
        }
    ar_throughput = table.get("ar", {}).get("throughput")
    for row in table.values():
        row["speedup_vs_ar"] = row["throughput"] / ar_throughput if ar_throughput else None
    out["schedules"] = table
    return out


# --- 6. the paper's experiment ----------------------------------------------------------------------
def paper_experiment(models: Models, sizes: Sizes, budget: Budget, device: str, progress=None) -> dict:
    """The paper's race on NLD-shaped models (module docstring, section 7), on the graph path and on transformers'
    forward over the same network. ``progress(partial)``: called with the section so far after each shape, dtype
    and forward (the driver writes the JSON then).

    Units: model_ms_per_iteration and time_per_nfe_ms milliseconds, throughput tokens per second, wall_s seconds.
    """
    from packed_ss import DecodeConfig, generate

    tokenizer = models.embedded("float32").tokenizer
    on_cuda = device.startswith("cuda")
    out = {"quality": sizes.paper_quality, "lanes": dict(sizes.paper_lanes), "new_tokens": sizes.paper_tokens,
           "prompts": list(sizes.paper_prompts),
           "forwards": {"graphs": "the native forward, its calls replayed as CUDA graphs" if on_cuda else
                        "the native forward, eager (no CUDA device: the graph path's code without its graphs)",
                        "transformers": "transformers' forward, eager"},
           "runs": {}}
    widest = max(block for _, block in sizes.paper_lanes)
    # every shape in the paper's precision before any in float32 (a budget that runs out drops float32 first)
    for dtype, (shape_name, shape) in itertools.product(sizes.paper_dtypes, sizes.paper_shapes.items()):
        key = f"{shape_name}, {dtype}"
        if not budget.allows(30):
            out["runs"][key] = SKIPPED
            continue
        entry = out["runs"][key] = {}
        try:
            built = time.perf_counter()
            graphs = nld_shaped_model(device, shape, tokenizer, dtype, path="native", compiled=None)
            forwards = {"graphs": graphs, "transformers": wrapped(graphs.model, tokenizer, "transformers")}
            entry["build_s"] = round(time.perf_counter() - built, 2)
            # AR's output one widest block past the runs' end, on the graph path: the scripted drafters' script
            # (one per prompt, untimed, shared by both forwards; each forward's run that leaves it follows its
            # own verified prefix)
            config = DecodeConfig(block_size=widest, max_new_tokens=sizes.paper_tokens + widest)
            scripts = [generate(graphs, graphs.encode(text), config, "ar").token_ids
                       for text in sizes.paper_prompts]
            lanes = {}
            for name, model in forwards.items():
                if not budget.allows(20):
                    entry[name] = SKIPPED
                    continue
                entry[name], lanes[name] = paper_lanes(model, scripts, sizes, budget)
                if progress is not None:
                    progress(out)
            if len(lanes) == 2:
                entry["graphs_over_transformers"] = {
                    lane: _paired_ratio(lanes["graphs"][lane], lanes["transformers"][lane])
                    for lane in lanes["graphs"]}
        except Exception as error:  # noqa: BLE001 - out of memory, a load error: data, the rest still runs
            entry.update(error_text(error))
        finally:
            graphs = forwards = None
            free_memory()
        if progress is not None:
            progress(out)
    return out


def paper_lanes(model, scripts: list, sizes: Sizes, budget: Budget) -> tuple[dict, dict]:
    """The paper's lanes on ``model`` over ``sizes.paper_prompts`` (their AR ``scripts``): each lane once untimed
    (graphs recorded, the scripted drafter's continuations after near-ties computed) and once timed, in rotated
    order. Returns (the report: path, what ran read after the runs (:func:`what_ran` over the lanes' adapters),
    recording time, table and ratios; the timed runs per lane)."""
    from packed_ss import DecodeConfig, generate
    from packed_ss.engine import ar_continuation
    from packed_ss.models.scripted import ScriptedDrafter

    report = {"path": model.path}
    # One adapter per drafting lane and one for the continuations, kept across the prompts: each records the
    # graphs of its shapes once, on its own cache (a live adapter's cache is its own)
    bases = {name: model.share() for name, _ in sizes.paper_lanes if name != "ar"}
    follow = ar_continuation(model)
    lanes = {name: [] for name, _ in sizes.paper_lanes}
    made = {name: [] for name, _ in sizes.paper_lanes}  # continuations each untimed run made
    for index, (text, script) in enumerate(zip(sizes.paper_prompts, scripts)):
        if index and not budget.allows(15):
            report["partial"] = f"{SKIPPED} after {index} prompts"
            break
        prompt = model.encode(text)
        anchors: dict = {}  # the scripted drafter's continuations after near-ties, shared by the lanes
        order = sizes.paper_lanes[index % 4:] + sizes.paper_lanes[:index % 4]
        for name, block in order:
            config = DecodeConfig(block_size=block, max_new_tokens=sizes.paper_tokens)
            if name == "ar":
                if model.compiled:  # untimed: its graph recorded at the timed run's cache capacity
                    generate(model, prompt, config, name)
                lanes[name].append(generate(model, prompt, config, name))
                made[name].append(0)
                continue
            drafter = ScriptedDrafter(bases[name], list(prompt) + list(script), sizes.paper_quality, index,
                                      follow=follow, anchors=anchors)
            generate(drafter, prompt, config, name)  # untimed: continuations, graphs and first-call costs
            made[name].append(drafter.anchored)
            lanes[name].append(generate(drafter, prompt, config, name))  # timed: computes none
    adapters = [model, *bases.values(), follow.adapter]
    report.update(what_ran(*adapters))  # after the runs: a capture that failed in them turned the graphs off
    report["recording_s"] = round(sum(a.static.compile_s for a in adapters if a.static), 2)
    report["lanes"] = _paper_table(lanes, made)
    report["ratios"] = {f"packed/{other}": _paired_ratio(lanes["packed"], lanes[other])
                        for other in ("linear", "quadratic")}
    return report, lanes


def _paired_ratio(a: list, b: list) -> dict | None:
    """Speed of runs ``a`` over runs ``b`` (aligned by prompt) with a paired bootstrap interval over the prompts."""
    from packed_ss.stats import paired_speed_ratio

    pairs = [((x.tokens, x.wall_s * 1000), (y.tokens, y.wall_s * 1000)) for x, y in zip(a, b)]
    interval = paired_speed_ratio([x for x, _ in pairs], [y for _, y in pairs]) if pairs else None
    return None if interval is None else {"estimate": interval.estimate, "low": interval.low, "high": interval.high,
                                          "prompts": len(pairs)}


def _paper_table(lanes: dict, made: dict) -> dict:
    """Per lane: medians over prompts of the timed runs, agreement with AR's tokens on each prompt, and the scripted
    drafter's continuations after near-ties (``made``: per lane and prompt)."""
    ar = lanes.get("ar") or []
    table = {}
    for name, runs in lanes.items():
        if not runs:
            continue
        agree = [run.token_ids == reference.token_ids for run, reference in zip(runs, ar)]
        first = [next((i for i, (x, y) in enumerate(zip(run.token_ids, reference.token_ids)) if x != y), None)
                 for run, reference in zip(runs, ar)]
        table[name] = {
            "prompts": len(runs),
            "tokens_per_nfe": median(r.tokens_per_nfe for r in runs),
            "model_ms_per_iteration": median(sum(c.model_ms for it in r.records for c in it.calls) / len(r.records)
                                             for r in runs if r.records),
            "time_per_nfe_ms": median(r.time_per_nfe_ms for r in runs),
            "throughput": median(r.throughput for r in runs),
            "wall_s": median(r.wall_s for r in runs),
            "same_tokens_as_ar": f"{sum(agree)}/{len(agree)}",
            "first_difference_from_ar": first,
            "continuations_after_near_ties": made.get(name, []),
        }
    return table


# --- driver ----------------------------------------------------------------------------------------
def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(report, indent=2, default=str) + "\n")
    temporary.replace(path)


def summary_lines(report: dict) -> list[str]:
    """A short human-readable summary of the report."""
    lines = []
    env = report.get("environment", {})
    lines.append(f"device: {env.get('device_name', '?')} ({env.get('device')}), torch {env.get('torch')}, "
                 f"transformers {env.get('transformers')}, CUDA {env.get('cuda_version')}")
    tests = report.get("cuda_tests")
    if isinstance(tests, dict) and "exit_code" in tests:
        lines.append(f"cuda tests: exit {tests['exit_code']}: {tests['summary']}")
    elif tests is not None:
        lines.append(f"cuda tests: {tests}")
    loss = report.get("lossless", {})
    for dtype in (DTYPES if "lossless" in report else ()):
        part = loss.get(dtype) if isinstance(loss, dict) else None
        if isinstance(part, dict) and "schedules" in part:
            cells = []
            for name, entry in part["schedules"].items():
                ties = "" if not entry["prompts_differing"] else (
                    " (all near-ties)" if entry["all_differences_near_ties"] else " (NOT near-ties)")
                cells.append(f"{name} {entry['prompts_differing']}/{entry['prompts_checked']} differ{ties}")
            lines.append(f"lossless {dtype}: " + ", ".join(cells))
        else:
            lines.append(f"lossless {dtype}: {part if part is not None else loss}")
    cost = report.get("per_call_cost", {})
    if "per_call_cost" in report and (not isinstance(cost, dict) or "error" in cost):
        lines.append(f"ms/call: {cost}")
    for key, part in (cost.items() if isinstance(cost, dict) else ()):
        if isinstance(part, dict) and "by_rows" in part:
            cells = [f"R={r['rows']}: {r['median_ms']:.2f}" for r in part["by_rows"] if r.get("median_ms") is not None]
            lines.append(f"ms/call {key}: " + ", ".join(cells))
        elif key not in ("unit", "section_s", "error", "where", "forward"):
            lines.append(f"ms/call {key}: {part}")
    graphs = report.get("graph_call_cost")
    for key, part in (graphs.items() if isinstance(graphs, dict) else ()):
        if not isinstance(part, dict) or "floor_ms" not in part:
            if key == "operations_per_layer":
                lines.append("graph path operations per layer (bfloat16, counted on the host): "
                             + ", ".join(f"{form} {count}" for form, count in part.items()))
            elif key not in ("unit", "dtype", "section_s", "attentions"):
                lines.append(f"graph path {key}: {part}")
            continue
        for attention in ("written", "sdpa"):
            costs = part.get(attention)
            if not isinstance(costs, dict):
                lines.append(f"graph path {key} {attention}: {costs}")
                continue
            cells = [f"R={r['rows']}: {r['median_ms']:.2f} ({r.get('over_floor', 0):.1f}x"
                     + (f"; replay {r['replay_ms']:.2f}, {r['replay_over_floor']:.1f}x" if "replay_ms" in r else "")
                     + ")" for r in costs["by_rows"] if r.get("median_ms") is not None]
            lines.append(f"graph path {key} {attention} (graphs: {costs.get('graphs')}, captures "
                         f"{costs.get('captures')}; floor {part['floor_ms']:.2f} ms, "
                         f"{part.get('compute_ms_per_row', 0):.4f} ms per row): " + ", ".join(cells)
                         + (f" | {costs['note']}" if costs.get("note") else ""))
    profiles = report.get("kernel_profile")
    for key, part in (profiles.items() if isinstance(profiles, dict) else ()):
        for attention, found in (part.items() if isinstance(part, dict) else ()):
            if not isinstance(found, dict) or not found.get("top"):
                lines.append(f"kernel profile {key} {attention}: {found}")
                continue
            most = ", ".join(f"{t['name'][:40]} {t['ms_per_call']:.2f} ms x{t['per_call']:.0f}"
                             for t in found["top"][:4])
            lines.append(f"kernel profile {key} {attention}, eager {found['rows']}-row call: {found['per_call']:.0f} "
                         f"{found['unit']} ({found.get('per_layer', 0):.1f} per layer), {found['ms_per_call']:.2f} ms; "
                         f"most: {most}")
    for name in ("race", "race_graphs"):
        if name not in report:
            continue
        part = report.get(name)
        if isinstance(part, dict) and "schedules" in part:
            cells = [f"{n} {r['throughput']:.0f} tok/s ({r['tokens_per_nfe']:.2f} tok/NFE, "
                     f"{r['time_per_nfe_ms']:.2f} ms/NFE)" for n, r in part["schedules"].items()]
            lines.append(f"{name}: " + "; ".join(cells))
        else:
            lines.append(f"{name}: {part}")
    paper = report.get("paper_experiment")
    for key, entry in (paper.get("runs", {}).items() if isinstance(paper, dict) else ()):
        if not isinstance(entry, dict) or "error" in entry:
            lines.append(f"paper {key}: {entry}")
            continue
        for forward in ("graphs", "transformers"):
            part = entry.get(forward)
            if not isinstance(part, dict):
                lines.append(f"paper {key} {forward}: {part}")
                continue
            cells = [f"{n} {r['tokens_per_nfe']:.2f} tok/NFE {r['model_ms_per_iteration']:.1f} ms/it "
                     f"{r['throughput']:.0f} tok/s (AR's tokens {r['same_tokens_as_ar']})"
                     for n, r in part["lanes"].items()]
            lines.append(f"paper {key} {forward}: " + "; ".join(cells) + _ratio_cells(part.get("ratios", {})))
        if entry.get("graphs_over_transformers"):
            lines.append(f"paper {key} graphs/transformers:" + _ratio_cells(entry["graphs_over_transformers"]))
    lines.append(f"total {report.get('elapsed_s', 0):.1f} s")
    return lines


def _ratio_cells(ratios: dict) -> str:
    cells = [f"{k} {v['estimate']:.2f} [{v['low']:.2f}, {v['high']:.2f}]" for k, v in ratios.items() if v]
    return " | " + ", ".join(cells) if cells else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_check.json", help="JSON file to write (default gpu_check.json)")
    parser.add_argument("--device", default="cuda", help="torch device (default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to try the script on a CPU")
    parser.add_argument("--budget-s", type=float, default=270.0,
                        help="wall-clock budget of the sections in seconds, the CUDA tests' time left out; sections "
                             "that do not fit are skipped (default 270)")
    parser.add_argument("--cuda-tests-s", type=float, default=CUDA_TESTS_S,
                        help=f"the CUDA tests' own time limit in seconds (default {CUDA_TESTS_S:.0f}); their output "
                             f"is written as it comes to the JSON's name with .cuda_tests.log")
    parser.add_argument("--only", default=None, metavar="SECTIONS",
                        help="comma-separated sections to run (the environment always runs), e.g. "
                             "graph_call_cost,paper_experiment for a second try within a GPU's time")
    parser.add_argument("--quality", type=float, default=PAPER_QUALITY,
                        help="the paper experiment's scripted drafter: a proposal k tokens past its last verified "
                             f"one is right with probability quality**k (default {PAPER_QUALITY})")
    args = parser.parse_args(argv)
    if not 0.0 <= args.quality <= 1.0:
        parser.error(f"--quality must be in [0, 1], got {args.quality}")
    if args.cuda_tests_s <= 0:
        parser.error(f"--cuda-tests-s must be positive, got {args.cuda_tests_s}")
    budget = Budget(args.budget_s)
    out = Path(args.out)

    import torch  # imported here so that --help stays fast
    import transformers

    from packed_ss.models import device_dtype_problem

    transformers.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    if args.device == "cpu":
        torch.set_num_threads(1)  # small models: intra-op threads only add overhead (and spin on a busy CPU)
    sizes = Sizes(args.quick, args.quality)
    models = Models(args.device)
    report: dict = {"script": "scripts/gpu_check.py", "elapsed_s": 0.0}
    sections = [
        ("environment", lambda: environment(args.device, args.quick, args.budget_s), 0),
        # issue 55's own figures first (the graph path's call cost, the paper's experiment), then the embedded
        # model's: a budget that runs out drops the sections measured on a GPU before
        # the CUDA tests run on a budget of their own (--cuda-tests-s), set aside from the sections' below
        ("cuda_tests", lambda: cuda_tests(args.cuda_tests_s, out.with_name(out.stem + ".cuda_tests.log")), 0),
        ("graph_call_cost", lambda: graph_call_cost(models, sizes, budget, args.device), 30),
        ("paper_experiment", lambda: paper_experiment(
            models, sizes, budget, args.device,
            progress=lambda partial: write_json(out, {**report, "paper_experiment": partial})), 60),
        ("lossless", lambda: lossless(models, sizes, budget), 20),
        ("race_graphs", lambda: race(models, sizes, budget, path="auto"), 15),
        ("race", lambda: race(models, sizes, budget), 15),
        ("per_call_cost", lambda: per_call_cost(models, sizes, budget, args.device), 15),
        ("kernel_profile", lambda: kernel_profiles(models, sizes, budget, args.device), 15),  # after every timing
    ]
    names = [name for name, _, _ in sections]
    only = None if args.only is None else [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in (only or ()) if name not in names]
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; the sections are {', '.join(names)}")
    problem = device_dtype_problem(args.device, None)
    if not problem and not (EMBEDDED / "model.safetensors").exists():
        problem = f"the embedded model has no weights ({EMBEDDED / 'model.safetensors'} is missing)"
    for name, run, needed_s in sections:
        start = time.perf_counter()
        if only is not None and name not in only and name != "environment":
            continue
        if problem and name != "environment":
            report[name] = f"skipped: {problem}"
        elif not budget.allows(needed_s):
            report[name] = SKIPPED
        else:
            try:
                report[name] = run()
            except Exception as error:  # noqa: BLE001 - an expected failure is data, not a crash
                report[name] = error_text(error)
            if name == "cuda_tests":
                budget.set_aside(time.perf_counter() - start)
        if isinstance(report[name], dict):
            report[name]["section_s"] = round(time.perf_counter() - start, 2)
        report["elapsed_s"] = round(budget.elapsed(), 2)
        write_json(out, report)
    if problem:
        report["environment"]["problem"] = problem
        write_json(out, report)
    print("\n".join(summary_lines(report)))
    print(f"wrote {out}")
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
