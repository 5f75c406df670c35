"""SetDLM's native lane beside SetDLM's own ``generate``, case by case.

Writes tiny random SetDLM checkpoints (the test fixture's format, ``tests/helpers.py``), decodes every case with
the engine's ``diffusion`` schedule (SetDLM's native decoding, :mod:`packed_ss.any_order.setdlm_native`) and with
``SetDLM.generate`` from a checkout of kuleshov-group/setdlms, run by an interpreter that has that project's own
dependencies (transformers 4.52, hydra-core, einops), and prints how many runs give the same tokens and the same
number of steps.

A case: fixture sharpness (the final norm's scale; sharper checkpoints give float32 confidences that round to
exactly 1.0), prompt, speculative width W (SetDLM's ``max_window_size``), ``first_hitting``, confidence
threshold. SetDLM's settings are those of its ``configs/generation/set_diffusion_generation_config.yaml``
(predict_and_noise, confidence-based noising, greedy, T = N steps as its harness passes) with the window
and threshold of the case; its stopping criterion is "an EOS among the generated tokens before the window's end",
as the engine's stop rule for this lane. SetDLM's backbone calls include one for the prompt alone, so its step
count is its calls minus one.

Run from the repository root, with SetDLM's checkout and interpreter set up beside it:

    python scripts/compare_setdlm.py --setdlm-src /path/to/setdlms --setdlm-python /path/to/venv/bin/python

The second interpreter runs this file again with ``--reference JOBS`` (it imports nothing of packed_ss).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHARPNESS = (10.0, 40.0)
PROMPTS = ([5, 6, 7, 8], [9, 4, 11], [12, 13, 14, 15, 16], [20, 8, 13, 8])
WINDOWS = (2, 4, 8)
FIRST_HITTING = (True, False)
NEW_TOKENS = 24


def reference(jobs_path: str, source: str) -> None:
    """Decode every job with SetDLM's own classes; print one JSON list of {tokens, steps}."""
    import torch
    from transformers import PreTrainedTokenizerFast, StoppingCriteria, StoppingCriteriaList

    sys.path.insert(0, source)
    from src.denoiser.bd3lm import BD3LMConfig
    from src.denoiser.diffusion_config import SetDiffusionGenerationConfig
    from src.denoiser.setdlm import SetDLM

    class EOSBeforeWindowEnd(StoppingCriteria):
        def __init__(self, prompt_length: int, eos: int):
            self.prompt_length, self.eos = prompt_length, eos

        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([bool((input_ids[0, self.prompt_length:] == self.eos).any())])

    models, answers = {}, []
    for job in json.loads(Path(jobs_path).read_text()):
        folder = job["folder"]
        if folder not in models:
            stored = json.loads(Path(folder, "config.json").read_text())
            backbone = {"_target_": "src.backbone.automodel.AutoModelFromPreTrained",
                        "automodel_cls": "AutoModelForCausalLM", "pretrained_model_name_or_path": f"{folder}/base",
                        "num_layers": stored["backbone_config"]["keep_bottom_n_layers"], "reinit_model": True}
            noise = {**stored["noise_config"], "_target_": "src.noise_schedule.noise_schedules.StaggeredNoise"}
            config = BD3LMConfig(length=stored["length"], backbone_config=backbone, noise_config=noise,
                                 tokenization_config=stored["tokenization_config"], attn_backend="sdpa",
                                 block_size=stored["block_size"], eval_block_size=stored["eval_block_size"],
                                 shift_logits=stored["shift_logits"], time_conditioned_backbone=False,
                                 keep_clean_bos=None, backbone_is_decoder_only=False)
            tokenizer = PreTrainedTokenizerFast(tokenizer_file=f"{folder}/tokenizer.json")
            model = SetDLM(config, tokenizer=tokenizer).eval()
            model.load_state_dict(torch.load(f"{folder}/pytorch_model.bin"), strict=True)
            calls = []
            model.backbone.register_forward_hook(lambda module, args, output, calls=calls: calls.append(1))
            models[folder] = model, calls
        model, calls = models[folder]
        config = model.config
        generation = SetDiffusionGenerationConfig(
            num_steps=job["new_tokens"], min_t=1e-5, block_size=config.length, first_hitting=job["first_hitting"],
            sampling_strategy="predict_and_noise", noise_removal=False, confidence_based_noising=True,
            confidence_threshold=job["threshold"], align_inputs_to_blocks=False, nucleus_p=1.0,
            pad_token_id=config.mask_token_id, do_sample=False, use_cache=True, max_window_size=job["window"],
            cache_full_infill_context=False, use_first_hitting_order_in_decode=False,
            eos_token_id=config.eos_token_id)
        calls.clear()
        prompt = job["prompt"]
        with torch.no_grad():
            out = model.generate(inputs=torch.tensor([prompt]), generation_config=generation,
                                 max_new_tokens=job["new_tokens"], return_dict_in_generate=True, device="cpu",
                                 stopping_criteria=StoppingCriteriaList([EOSBeforeWindowEnd(len(prompt),
                                                                                            config.eos_token_id)]),
                                 tokenizer=model.tokenizer)
        answers.append({"tokens": out.sequences[0, len(prompt):].tolist(), "steps": len(calls) - 1})
    print(json.dumps(answers))


def cases(folders: dict[float, str], threshold: float) -> list[dict]:
    return [{"folder": folders[s], "sharpness": s, "prompt": p, "window": w, "first_hitting": f,
             "threshold": threshold, "new_tokens": NEW_TOKENS}
            for s, p, w, f in itertools.product(SHARPNESS, PROMPTS, WINDOWS, FIRST_HITTING)]


def ours(job: dict, models: dict) -> dict:
    from packed_ss import DecodeConfig
    from packed_ss.any_order.session import OrderSession
    from packed_ss.any_order.setdlm_native import SetDLMDecoding, SetDLMDiffusion, setdlm_sequence
    from packed_ss.models import DualModeModel
    from packed_ss.records import summarize

    if job["folder"] not in models:
        # transformers' forward, as measured (docs/checkpoints.md): SetDLM's own code runs transformers' Qwen3; the native
        # forward sums in another order, which can flip a saturated confidence at threshold 1.0
        models[job["folder"]] = DualModeModel.from_pretrained(job["folder"], device="cpu", path="transformers")
    config = DecodeConfig(block_size=job["window"] + 1, max_new_tokens=job["new_tokens"],
                          confidence_threshold=job["threshold"])
    session = OrderSession(models[job["folder"]], job["prompt"], config, "diffusion")
    lane = SetDLMDiffusion(SetDLMDecoding(first_hitting=job["first_hitting"]))
    run = summarize(list(lane.iterate(session)), "diffusion", config.block_size, 0.0, len(job["prompt"]))
    return {"tokens": list(setdlm_sequence(run)), "steps": run.nfe}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setdlm-src", required=True, help="a checkout of kuleshov-group/setdlms")
    parser.add_argument("--setdlm-python", required=True, help="an interpreter with SetDLM's dependencies")
    parser.add_argument("--thresholds", default="1.0,0.9", help="confidence thresholds, comma-separated")
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.reference:
        reference(args.reference, args.setdlm_src)
        return
    sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
    from helpers import write_setdlm_checkpoint

    with tempfile.TemporaryDirectory(prefix="compare-setdlm-") as scratch:
        folders = {}
        for sharpness in SHARPNESS:
            folders[sharpness] = str(Path(scratch, f"sharp{sharpness:g}"))
            write_setdlm_checkpoint(folders[sharpness], sharpness=sharpness)
        for threshold in (float(t) for t in args.thresholds.split(",")):
            jobs = cases(folders, threshold)
            jobs_path = Path(scratch, "jobs.json")
            jobs_path.write_text(json.dumps(jobs))
            answer = subprocess.run([args.setdlm_python, __file__, "--setdlm-src", args.setdlm_src,
                                     "--setdlm-python", args.setdlm_python, "--reference", str(jobs_path)],
                                    capture_output=True, text=True, check=True)
            theirs = json.loads(answer.stdout.strip().splitlines()[-1])
            models: dict = {}
            mine = [ours(job, models) for job in jobs]
            same_tokens = sum(a["tokens"] == b["tokens"] for a, b in zip(mine, theirs))
            same_steps = sum(a["steps"] == b["steps"] for a, b in zip(mine, theirs))
            fewer = sum(len(b["tokens"]) > b["steps"] for b in theirs)
            print(f"threshold {threshold:g}: {len(jobs)} runs ({len(SHARPNESS)} checkpoints x {len(PROMPTS)} prompts"
                  f" x W {','.join(map(str, WINDOWS))} x first_hitting on/off, {NEW_TOKENS} new tokens); same tokens "
                  f"as SetDLM's generate {same_tokens}/{len(jobs)}, same steps {same_steps}/{len(jobs)}; runs in which "
                  f"SetDLM committed more tokens than it took steps: {fewer}")
            for job, a, b in zip(jobs, mine, theirs):
                if a["tokens"] != b["tokens"] or a["steps"] != b["steps"]:
                    print(f"  differs: sharpness {job['sharpness']:g} prompt {job['prompt']} W {job['window']} "
                          f"first_hitting {job['first_hitting']}: ours {a['steps']} steps {a['tokens']}, "
                          f"SetDLM {b['steps']} steps {b['tokens']}")


if __name__ == "__main__":
    main()
