"""A dual-mode checkpoint written in a form vLLM loads, for Linear-SS inside vLLM (:mod:`packed_ss.vllm_side`).

vLLM 0.32.0 has no ``NemotronLabsDiffusionModel`` architecture and runs no remote code for it, but an NLD checkpoint
is a Ministral3 decoder under other names (:mod:`packed_ss.models.nemotron`), and vLLM has ``Ministral3ForCausalLM``.
This loads the checkpoint as the engine does (any family it knows) and writes the transformers network it gets:
``config.json`` (with the checkpoint's ``mask_token_id``, which the proposer drafts with), safetensors in the
network's own names and the tokenizer. A drafter LoRA needs no rewriting: the proposer reads peft's keys by layer
index and module name, whatever the prefix (``PACKED_SS_DRAFTER_LORA=<checkpoint>/linear_spec_lora``).

Command line: ``python -m packed_ss.vllm_export SOURCE OUT [--dtype float32]``, then
``bash scripts/serve_vllm_linear.sh OUT``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from packed_ss.models.errors import ModelLoadError


def export_for_vllm(source: str | Path, out: str | Path, dtype: str = "float32") -> Path:
    """Write ``source`` (a dual-mode checkpoint folder or hub id the engine loads) to the folder ``out`` as a plain
    transformers causal LM vLLM loads, ``mask_token_id`` kept in its config. Returns ``out``.

    Raises: ModelLoadError when the engine cannot load ``source``; FileExistsError when ``out`` holds a config.json.
    """
    from packed_ss.models import DualModeModel

    out = Path(out)
    if (out / "config.json").exists():
        raise FileExistsError(f"{out} already holds a checkpoint (config.json): choose an empty folder")
    model = DualModeModel.from_pretrained(str(source), device="cpu", dtype=dtype, path="transformers")
    from huggingface_hub import save_torch_state_dict

    network = model.model
    out.mkdir(parents=True, exist_ok=True)
    # the network's own names (transformers' save_pretrained would write the checkpoint's original ones back)
    save_torch_state_dict(network.state_dict(), out)
    network.config.save_pretrained(out)
    model.tokenizer.save_pretrained(out)
    config = json.loads((out / "config.json").read_text())
    config["architectures"] = [type(network).__name__]  # what vLLM's model registry goes by
    config["mask_token_id"] = int(model.mask_token_id)
    rope = config.get("rope_parameters") or {}
    if "llama_4_scaling_beta" in rope:  # vLLM's Mistral attention reads the Llama-4 query scaling from here
        config["llama_4_scaling"] = {"original_max_position_embeddings": rope["original_max_position_embeddings"],
                                     "beta": rope["llama_4_scaling_beta"]}
    if model.eos_token_id is not None:
        config["eos_token_id"] = int(model.eos_token_id)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packed_ss.vllm_export", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a dual-mode checkpoint folder or hub id")
    parser.add_argument("out", help="an empty folder to write")
    parser.add_argument("--dtype", default="float32", help="weights' dtype (default float32)")
    args = parser.parse_args(argv)
    try:
        folder = export_for_vllm(args.source, args.out, args.dtype)
    except (ModelLoadError, FileExistsError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {folder}: serve it with bash scripts/serve_vllm_linear.sh {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
