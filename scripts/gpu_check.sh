#!/usr/bin/env bash
# The device check: tepo's built-in trainer on one CUDA GPU, on a machine with PyTorch (CUDA build) and transformers
# installed and no network (no hub, no pip install).
#
#   here (tepo installed):   bash scripts/gpu_check.sh --prepare KIT     the embedded model's config and tokenizer (MBs)
#   on the GPU machine:      bash scripts/gpu_check.sh KIT [OUT]         OUT defaults to gpu_check_output/
#   dry run of the logic:    bash scripts/gpu_check.sh --cpu KIT [OUT]   the same steps on the CPU, 2-layer model
#
# tepo runs from this checkout (src/ on PYTHONPATH). A machine with only torch and transformers is enough: --prepare
# puts into KIT/wheels math-verify with its two dependencies and pytest with its three (pure-Python wheels, about
# 5 MB, built from this environment's installed copies), and they go on PYTHONPATH as they are (a pure-Python wheel
# is importable as a zip); more may be given in $TEPO_WHEELS. matplotlib is optional (no closing plot without it).
# Keep KIT out of git (gpu_check_kit/ is in .gitignore). vLLM is used where $TEPO_VLLM_PYTHON or
# .venv-vllm/bin/python has it.
#
# Steps: the -m gpu tests (tests/test_gpu.py), then scripts/gpu_check.py run: a random-weight model with the
# embedded model's architecture, a 3-step `tepo train train.device=cuda rollout.backend=hf` (finite metrics, changed
# weights, phase times, peak GPU memory), the same run SIGKILLed after its step-2 checkpoint and resumed (the same
# metrics and weights as the uninterrupted run), then the vLLM backend on the same GPU. The report is OUT/report.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then  # the checkout's .venv where there is one, else the machine's python3
  PYTHON=python3
  [ -x "$ROOT/.venv/bin/python" ] && PYTHON="$ROOT/.venv/bin/python"
fi
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
add_wheels() {  # pure-Python wheels are zips Python imports from as they are
  for wheel in "$1"/*.whl; do
    [ -e "$wheel" ] && PYTHONPATH="$PYTHONPATH:$wheel"
  done
  return 0
}
[ -n "${TEPO_WHEELS:-}" ] && add_wheels "$TEPO_WHEELS"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

MODE=cuda
case "${1:-}" in
  --prepare)
    exec "$PYTHON" "$ROOT/scripts/gpu_check.py" prepare-kit "${2:?usage: gpu_check.sh --prepare KIT}"
    ;;
  --cpu)
    MODE=cpu
    shift
    ;;
esac
KIT="${1:?usage: gpu_check.sh [--cpu] KIT [OUT]  (make KIT with --prepare where tepo is installed)}"
OUT="${2:-$ROOT/gpu_check_output}"
mkdir -p "$OUT"
KIT="$(cd "$KIT" && pwd)"
OUT="$(cd "$OUT" && pwd)"
add_wheels "$KIT/wheels"  # made by --prepare: math-verify, pytest and their dependencies
cd "$OUT"  # runs, logs and the report stay in OUT

"$PYTHON" - <<'PY'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "yaml", "safetensors", "numpy", "tqdm", "math_verify", "pytest")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_check: missing Python modules: {', '.join(missing)} (see the top of scripts/gpu_check.sh)")
PY

echo "== -m gpu tests (without CUDA they skip, saying why)"
# Their tiny model takes the kit's tokenizer (the embedded model need not be on this machine).
TESTS_OK=1
TEPO_MODEL_KIT="$KIT" "$PYTHON" -m pytest "$ROOT/tests/test_gpu.py" -m gpu -q -rs -p no:cacheprovider \
  -c "$ROOT/pyproject.toml" --rootdir "$ROOT" >"$OUT/gpu_tests.txt" 2>&1 || TESTS_OK=0
tail -5 "$OUT/gpu_tests.txt"

echo "== training checks"
CHECKS_OK=1
CPU_FLAG=""
[ "$MODE" = cpu ] && CPU_FLAG=--cpu
"$PYTHON" "$ROOT/scripts/gpu_check.py" run "$KIT" "$OUT" $CPU_FLAG || CHECKS_OK=0
[ "$TESTS_OK" = 1 ] || echo "FAIL: the -m gpu tests (see $OUT/gpu_tests.txt)" | tee -a "$OUT/report.txt"
[ "$TESTS_OK" = 1 ] && [ "$CHECKS_OK" = 1 ]
