"""The vLLM side of the vLLM reference lanes (:mod:`packed_ss.vllm_lanes`): one vLLM engine, one method, kept alive.

Run by path with the vLLM environment's python (``bash scripts/make_vllm_env.sh``); it imports nothing of packed_ss,
whose transformers is newer than the one vLLM pins. It reads one JSON object per line on stdin and writes one per
line on stdout:

* first, the set-up ``{"model": folder, "dtype": "float32", "method": "ar" | "ngram" | "suffix" | "linear", "k": draft
  tokens, "max_model_len": tokens, "proposer_log": file (optional)}``, answered ``{"ready": true, "startup_s": s, "vllm": version}`` once the engine is built and
  has decoded one warm-up prompt (or ``{"error": line}``);
* then ``{"prompt": [ids], "max_new_tokens": n, "temperature": T (default 0), "seed": s}``, answered ``{"token_ids": [...], "wall_s": s, "steps": engine steps
  (vLLM's own count), "drafts": d, "draft_tokens": t,
  "accepted": a, "accepted_per_position": [...]}``: the prompt decoded at batch 1 (``wall_s`` the ``generate`` call
  alone), its speculative counters read from vLLM's own metrics before and after;
* or ``{"prompts": [[ids], ...], ...}``: the prompts decoded together as one batch (request i seeded ``seed + i``),
  answered with ``"token_ids"`` as one list per prompt and the batch's counters.

``linear`` is Linear-SS inside vLLM: the model's own diffusion drafter as vLLM's ``custom_class`` proposer
(``packed_ss/vllm_side/linear_ss_proposer.py``, put on ``PYTHONPATH`` here; ``proposer_log`` names its log of drafts).

An empty line or end of input ends it.
"""

import json
import os
import sys
import time
from pathlib import Path

PROPOSER = "linear_ss_proposer.LinearSSProposer"
PROPOSER_FOLDER = Path(__file__).resolve().with_name("vllm_side")


def counters(llm) -> dict:
    """vLLM's speculative-decoding counters so far (its Prometheus metrics, logged stats on)."""
    found = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "accepted_per_position": [], "engine_steps": None}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for metric in llm.get_metrics():
        if metric.name in names:
            found[names[metric.name]] = int(metric.value)
        elif metric.name == "vllm:iteration_tokens_total":  # one observation per engine step
            found["engine_steps"] = int(metric.count)
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            found["accepted_per_position"] = [int(v) for v in metric.values]
    return found


def engine(setup: dict):
    """The vLLM engine for ``setup`` (see the module docstring)."""
    from vllm import LLM

    method, k = setup["method"], int(setup.get("k", 4))
    speculative = None
    if method == "ngram":
        speculative = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                       "prompt_lookup_max": 3}
    elif method == "suffix":
        speculative = {"method": "suffix", "num_speculative_tokens": k, "suffix_decoding_max_cached_requests": 0}
    elif method == "linear":
        # vLLM's engine processes import the proposer by module path: its folder goes on their PYTHONPATH
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROPOSER_FOLDER), os.environ.get("PYTHONPATH")]))
        sys.path.insert(0, str(PROPOSER_FOLDER))
        if setup.get("proposer_log"):
            os.environ["PACKED_SS_PROPOSER_LOG"] = str(setup["proposer_log"])
        speculative = {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    elif method != "ar":
        raise ValueError(f"method must be ar, ngram, suffix or linear, got {method!r}")
    return LLM(model=setup["model"], dtype=setup.get("dtype", "float32"), max_model_len=int(setup["max_model_len"]),
               speculative_config=speculative, disable_log_stats=False, seed=0, enable_prefix_caching=False)


def main() -> int:
    # the answers go to the original stdout; anything else written there (vLLM's and its libraries' own prints, its
    # engine processes') goes to stderr instead
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(answer: dict) -> None:
        answers.write(json.dumps(answer) + "\n")
        answers.flush()

    from vllm import SamplingParams, TokensPrompt

    setup = json.loads(sys.stdin.readline())
    start = time.perf_counter()
    try:
        llm = engine(setup)
        llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(temperature=0, max_tokens=8),
                     use_tqdm=False)
    except Exception as error:  # noqa: BLE001 - one line back to the caller
        say({"error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"})
        return 1
    import vllm

    say({"ready": True, "startup_s": time.perf_counter() - start, "vllm": vllm.__version__})
    for line in sys.stdin:
        if not line.strip():
            break
        ask = json.loads(line)
        before = counters(llm)
        batch = ask.get("prompts") or [ask["prompt"]]
        temperature, seed = float(ask.get("temperature", 0.0)), int(ask.get("seed", 0))
        params = [SamplingParams(temperature=temperature, max_tokens=int(ask["max_new_tokens"]), ignore_eos=False,
                                 seed=seed + i if temperature > 0 else None) for i in range(len(batch))]
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(ids)) for ids in batch], params, use_tqdm=False)
        wall = time.perf_counter() - start
        after = counters(llm)
        produced = [list(out.outputs[0].token_ids) for out in outs]
        answer = {"token_ids": produced if "prompts" in ask else produced[0], "wall_s": wall,
                  **{key: after[key] - before[key] for key in ("drafts", "draft_tokens", "accepted")},
                  "accepted_per_position": [a - b for a, b in zip(after["accepted_per_position"],
                                                                   before["accepted_per_position"]
                                                                   or [0] * len(after["accepted_per_position"]))]}
        # the engine's steps, counted by vLLM (one observation of its tokens-per-step histogram each); where that
        # metric is missing, each step commits one token per request beyond its accepted drafts (batch 1), which
        # overcounts by the drafts a final step accepted past the token limit
        if after["engine_steps"] is not None and before["engine_steps"] is not None:
            answer["steps"] = after["engine_steps"] - before["engine_steps"]
        else:
            answer["steps"] = sum(len(tokens) for tokens in produced) - answer["accepted"]
        say(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
