#!/usr/bin/env bash
# TEPO (arXiv 2510.09369, Section 4.1) on verl: Qwen2.5-7B, DAPO-Math-17k, one node with 8 GPUs.
#
# Needs an environment with verl 0.9.x (and vLLM) where tepo is installed, e.g.
#   pip install verl==0.9.1 && pip install -e /path/to/tepo --no-deps
# Installing tepo there registers its losses in every verl process through the `verl.plugins` entry point;
# VERL_USE_EXTERNAL_MODULES below does the same explicitly (and fails loudly if tepo is not importable).
#
# Data (verl's DAPO recipe files): TEPO_TRAIN_FILES (default ~/data/dapo-math-17k.parquet) and
# TEPO_VAL_FILES (default ~/data/aime-2024.parquet); model: TEPO_MODEL (default Qwen/Qwen2.5-7B).
# Extra arguments are passed to verl as Hydra overrides, e.g. trainer.n_gpus_per_node=4.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:-tepo.integrations.verl_plugin}"
python - <<'PY'
import verl  # noqa: F401  (loads tepo's plugin)
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
assert "tepo" in POLICY_LOSS_REGISTRY, "tepo's verl plugin did not load: is tepo installed in this environment?"
PY

exec python -m verl.trainer.main_ppo \
    --config-path="$here" \
    --config-name=tepo_qwen2.5_7b_dapo_math \
    "$@"
