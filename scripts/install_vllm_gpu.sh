#!/usr/bin/env bash
# Creates .venv-vllm with vLLM's GPU (CUDA) build as tepo's rollout server, on a machine with an NVIDIA GPU
# (scripts/install.sh runs it when choose_device says cuda; the CPU build is scripts/install_vllm_cpu.sh).
#
# Why a venv of its own: vLLM pins its own torch (and transformers), which need not be the trainer's torch==2.13.0;
# the trainer starts `.venv-vllm/bin/python src/tepo/rollout/vllm_server.py` and talks to it over a pipe, so the two
# environments never import each other's packages. So no -c constraints.txt here: vLLM's torch is vLLM's choice.
#
# Use:   bash scripts/install_vllm_gpu.sh && .venv/bin/tepo train train.device=cuda rollout.backend=vllm
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VLLM_VENV:-.venv-vllm}
# tepo's backend uses this venv only once the marker at the end exists: a half-finished install is never picked up.
rm -f "$VENV/tepo-vllm-ready"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet "vllm==0.32.0"
"$VENV/bin/python" -c "import torch; assert torch.cuda.is_available(), 'vLLM GPU build without a usable CUDA torch'"
"$VENV/bin/python" -c "import vllm; print('installed: vllm', vllm.__version__, '(GPU build)')"
touch "$VENV/tepo-vllm-ready"
