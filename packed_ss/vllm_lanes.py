"""vLLM as reference lanes: the serving engine's own greedy loop and speculative methods on the same weights.

``vllm-ar`` is vLLM's plain greedy decoding, ``vllm-ngram`` its n-gram (prompt lookup) proposer, ``vllm-suffix``
its suffix decoding (its cache of earlier responses off, so a repeated prompt gains nothing) and ``vllm-linear``
Linear-SS inside vLLM (the model's own diffusion drafter as vLLM's proposer,
``packed_ss/vllm_side/linear_ss_proposer.py``; its NFE counts vLLM's steps and the drafter's calls), with ``B - 1``
draft tokens, as the engine's own ``lookup`` and ``linear`` draft W = B - 1. They decode the project's own token ids, greedy, at batch 1,
and their tokens must equal ``ar``'s (the benchmark checks it, as for transformers' and llama.cpp's lanes).

vLLM pins an older transformers than the project, so it lives in an environment of its own
(``bash scripts/make_vllm_env.sh`` makes ``.venv-vllm``; ``PACKED_SS_VLLM_PYTHON`` names another python) and runs
in its own process (:mod:`packed_ss.vllm_worker`), one per method, started once per network and kept: its start-up
(building the engine and compiling, about a minute here) is reported apart and never timed. A run is timed as one
``generate`` call inside that process, the prefill included; its NFE counts vLLM's engine steps, and its acceptance
length and per-position acceptance come from vLLM's own counters.

Everything else works without it: :func:`vllm_problem` says in one line why the lanes cannot run, and the benchmark
leaves them out with that line.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import signal
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from packed_ss.hf_reference import ReferenceFailed, ReferenceRun

VLLM_REFERENCES = ("vllm-ar", "vllm-ngram", "vllm-suffix", "vllm-linear")
METHODS = {"vllm-ar": "ar", "vllm-ngram": "ngram", "vllm-suffix": "suffix", "vllm-linear": "linear"}
LOSSLESS_SAMPLING = ("ar", "linear")  # methods whose T > 0 output is the model's own in vLLM's CPU build (see below)
ROOT = Path(__file__).resolve().parents[1]
ENV_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
INSTALL = "bash scripts/make_vllm_env.sh"
WORKER = Path(__file__).with_name("vllm_worker.py")
LANES = "packed_ss_vllm_workers"  # attribute of the transformers network holding its vLLM workers (per method, k)
STARTUP_S = 600.0  # the most a worker may take to build its engine (it compiles)
CALL_S = 300.0  # the most one prompt may take
KV_CACHE_GIB = 1  # vLLM's CPU KV cache per worker (its default is a fraction of the machine's memory)
# Python packages a method needs beyond vLLM (suffix decoding: Arctic Inference's suffix tree)
NEEDS = {"suffix": ("arctic_inference", "pip install arctic-inference (a source package: see scripts/make_vllm_env.sh)")}


def env_python() -> Path:
    """The vLLM environment's python: ``PACKED_SS_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` of the checkout."""
    named = os.environ.get("PACKED_SS_VLLM_PYTHON")
    return Path(named) if named else ENV_PYTHON


@functools.lru_cache(maxsize=16)
def _imports(python: Path, module: str) -> bool:
    """Whether ``python`` imports ``module`` (asked once per process: a vLLM import takes seconds of CPU)."""
    try:
        return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def vllm_problem(model=None, schedule: str | None = None) -> str | None:
    """Why the vLLM lane ``schedule`` (any of them when None) cannot run here, in one line naming what to install or
    what the model lacks, or None. ``model``: a :class:`~packed_ss.models.DualModeModel` whose checkpoint folder vLLM
    must load."""
    python = env_python()
    if not python.exists():
        return f"the vLLM lanes need vLLM's environment ({INSTALL}; {python} is missing)"
    if not _imports(python, "vllm"):
        return f"the vLLM lanes need vLLM's environment ({INSTALL}; `import vllm` fails with {python})"
    method = METHODS.get(schedule or "")
    if method in NEEDS and not _imports(python, NEEDS[method][0]):
        return f"{schedule} needs {NEEDS[method][0]} in vLLM's environment ({NEEDS[method][1]})"
    if model is not None:
        folder = checkpoint_folder(model)
        if folder is None:
            return "the vLLM lanes load a local checkpoint folder, and this model was not loaded from one"
        config = json.loads((folder / "config.json").read_text())
        if config.get("model_type") == "nemotron_labs_diffusion":
            return ("vLLM has no Nemotron-Labs-Diffusion architecture: write the checkpoint as the Ministral3 folder "
                    f"it loads (python -m packed_ss.vllm_export {folder} OUT) and benchmark OUT")
        if method == "linear" and config.get("mask_token_id") is None:
            return "vllm-linear drafts with the mask token, and the checkpoint's config.json has no mask_token_id"
    return None


def checkpoint_folder(model) -> Path | None:
    """The local folder ``model`` (an adapter or a transformers network) was loaded from, or None."""
    network = getattr(model, "model", model)
    name = getattr(getattr(network, "config", None), "_name_or_path", "") or getattr(network, "name_or_path", "")
    folder = Path(str(name)).expanduser()
    return folder.resolve() if name and (folder / "config.json").is_file() else None


class VllmWorker:
    """One vLLM engine in its own process (:mod:`packed_ss.vllm_worker`), for one method and draft length.

    Attributes: ``startup_s``, seconds it took to build the engine and decode a warm-up prompt (never timed);
    ``version``, vLLM's. Raises: ReferenceFailed (one line) when the process cannot start or its engine fails."""

    def __init__(self, folder: Path, dtype: str, method: str, k: int, max_model_len: int, threads: int,
                 proposer_log: Path | None = None):
        cores = f"0-{threads - 1}" if threads > 1 else "0"
        environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "VLLM_CPU_OMP_THREADS_BIND": cores,
                       "OMP_NUM_THREADS": str(threads), "VLLM_LOGGING_LEVEL": "WARNING", "TQDM_DISABLE": "1"}
        preload = [str(p) for p in (env_python().parent.parent / "lib" / "libiomp5.so",
                                    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")) if p.exists()]
        if preload:  # Intel OpenMP and TCMalloc, as vLLM's CPU docs advise (its speculative decoding is slow without)
            environment["LD_PRELOAD"] = ":".join(preload + [environment.get("LD_PRELOAD", "")]).rstrip(":")
        self._lock = threading.Lock()
        try:
            # a process group of its own: closing it ends vLLM's engine processes too, whatever state they are in
            self.process = subprocess.Popen([str(env_python()), str(WORKER)], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                            env=environment, cwd=str(ROOT), start_new_session=True)
        except OSError as error:
            raise ReferenceFailed(f"vLLM lanes: cannot start vLLM's python ({error})") from None
        atexit.register(self.close)
        setup = {"model": str(folder), "dtype": dtype, "method": method, "k": k, "max_model_len": max_model_len}
        if proposer_log is not None:
            setup["proposer_log"] = str(proposer_log)
        answer = self._ask(setup, STARTUP_S)
        self.startup_s, self.version = float(answer["startup_s"]), answer.get("vllm", "")
        self.method = method

    def _sampling(self, temperature: float) -> float:
        """``temperature`` where this method samples losslessly in vLLM's CPU build, else ValueError: its rejection
        sampler divides by uninitialised temperatures at T > 0 (packed_ss/vllm_side/cpu_sampling_fix.py), which only
        the Linear-SS proposer corrects in vLLM's process; plain greedy or sampled decoding never calls it."""
        if temperature > 0 and self.method not in LOSSLESS_SAMPLING:
            raise ValueError(f"vLLM's {self.method} lane is greedy only: vLLM 0.32.0's CPU build samples its "
                             f"speculative tokens wrongly at T > 0 (docs/vllm.md)")
        return float(temperature)

    def _ask(self, request: dict, timeout_s: float) -> dict:
        with self._lock:
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
            except (BrokenPipeError, OSError):
                raise ReferenceFailed("vLLM lanes: vLLM's process has ended") from None
            line = _read_line(self.process, timeout_s)
        if not line:
            self.close()
            raise ReferenceFailed(f"vLLM lanes: no answer from vLLM's process within {timeout_s:.0f} s")
        try:
            answer = json.loads(line)
        except ValueError:
            self.close()
            raise ReferenceFailed(f"vLLM lanes: vLLM's process answered {line.strip()[:120]!r}") from None
        if "error" in answer:
            self.close()
            raise ReferenceFailed(f"vLLM lanes: {answer['error']}")
        return answer

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> dict:
        """vLLM's output for ``prompt_ids`` (greedy at ``temperature`` 0): the worker's answer (token ids, wall
        seconds, steps, counters)."""
        return self._ask({"prompt": [int(t) for t in prompt_ids], "max_new_tokens": int(max_new_tokens),
                          "temperature": self._sampling(temperature), "seed": int(seed)}, CALL_S)

    def generate_batch(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 0.0,
                       seed: int = 0) -> dict:
        """The prompts decoded together as one vLLM batch (request i seeded ``seed + i``): ``token_ids`` holds one
        list per prompt, the counters are the batch's."""
        return self._ask({"prompts": [[int(t) for t in ids] for ids in prompts], "max_new_tokens": int(max_new_tokens),
                          "temperature": self._sampling(temperature), "seed": int(seed)}, CALL_S)

    def close(self) -> None:
        """End the process and vLLM's engine processes (its process group): asked first, then killed."""
        if self.process.poll() is None:
            try:
                self.process.stdin.write("\n")
                self.process.stdin.flush()
                self.process.wait(timeout=30)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _read_line(process, timeout_s: float) -> str:
    """The next line ``process`` writes, or "" when it ends or ``timeout_s`` passes."""
    found: list[str] = []
    reader = threading.Thread(target=lambda: found.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return found[0] if found else ""


def worker(model, schedule: str, block_size: int) -> VllmWorker:
    """The network's vLLM worker for ``schedule`` at draft length B - 1, started on first use and kept.

    Raises: ReferenceFailed naming why the lane cannot run."""
    network = model.model
    workers = getattr(network, LANES, None)
    if workers is None:
        workers = {}
        object.__setattr__(network, LANES, workers)
    method = METHODS[schedule]
    key = (method, 0 if method == "ar" else max(1, block_size - 1))
    if key not in workers:
        problem = vllm_problem(model, schedule)
        if problem:
            raise ReferenceFailed(problem)
        dtype = str(model.dtype).removeprefix("torch.")
        workers[key] = VllmWorker(checkpoint_folder(model), dtype, method, key[1], int(model.max_length),
                                  torch.get_num_threads())
    return workers[key]


def vllm_generate(model, prompt_ids: Sequence[int], max_new_tokens: int, schedule: str,
                  block_size: int) -> ReferenceRun:
    """One greedy run of a vLLM lane (:data:`VLLM_REFERENCES`) on ``model``'s checkpoint: its new tokens (stopped at
    the model's EOS, which is kept, as the engine keeps it), vLLM's engine steps as NFE, its wall time (the decoding
    alone, prefill included) and its acceptance length from vLLM's counters.

    Raises: ReferenceFailed (one line) when vLLM cannot run it."""
    lane = worker(model, schedule, block_size)
    answer = lane.generate(prompt_ids, max_new_tokens)
    tokens = tuple(int(t) for t in answer["token_ids"])
    eos = getattr(model, "eos_token_id", None)
    reason = "eos" if eos is not None and tokens and tokens[-1] == eos else "limit"
    steps = max(1, int(answer["steps"]))  # the first step is the prefill's; each later one verified a draft or none
    verifying = steps - 1
    # Linear-SS in vLLM: each verifying step follows one drafting call of the proposer (Table 2: two calls each)
    nfe = steps + int(answer.get("drafts", 0)) if METHODS[schedule] == "linear" else steps
    return ReferenceRun(schedule, tokens, nfe, float(answer["wall_s"]), reason, iterations=steps,
                        mean_acceptance_length=(len(tokens) - 1) / verifying if verifying else float("nan"),
                        verify_iterations=verifying, per_position_acceptance=_per_position(answer))


def _per_position(answer: dict) -> tuple[float, ...]:
    """vLLM's accepted drafts per position over its drafts: the fraction of drafts accepted at each position."""
    drafts = int(answer.get("drafts", 0))
    return tuple(a / drafts for a in answer.get("accepted_per_position", [])) if drafts else ()


def startup_seconds(model) -> dict[str, float]:
    """Start-up seconds of the network's vLLM workers so far, by method and draft length (reported, never timed)."""
    workers = getattr(getattr(model, "model", model), LANES, None) or {}
    return {f"{method} k={k}": round(lane.startup_s, 1) for (method, k), lane in workers.items()}
