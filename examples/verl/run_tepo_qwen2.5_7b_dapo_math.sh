#!/usr/bin/env bash
# TEPO v2 (arXiv 2604.12736) in TEPO's Section 4.1 setting (arXiv 2510.09369) on verl: Qwen2.5-7B, DAPO-Math-17k,
# one node with 8 GPUs.
#
# Needs an environment with verl 0.9.1 (and vLLM) where tepo is installed, e.g.
#   pip install verl==0.9.1 "TransferQueue>=0.1.10" cachetools && pip install -e /path/to/tepo --no-deps
# (verl 0.9.1's default v1 driver imports TransferQueue and cachetools without installing them.)
# Installing tepo there registers its losses in every verl process through the `verl.plugins` entry point;
# VERL_USE_EXTERNAL_MODULES below does the same explicitly (and fails loudly if tepo is not importable) and also
# loads tepo.integrations.verl_workers, which registers the `tepo_sync` trainer the config selects.
#
# Data (verl's DAPO recipe files): TEPO_TRAIN_FILES (default ~/data/dapo-math-17k.parquet) and
# TEPO_VAL_FILES (default ~/data/aime-2024.parquet); model: TEPO_MODEL (default Qwen/Qwen2.5-7B).
# Extra arguments are passed to verl as Hydra overrides, e.g. trainer.n_gpus_per_node=4.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

export VERL_USE_EXTERNAL_MODULES="${VERL_USE_EXTERNAL_MODULES:-tepo.integrations.verl_plugin,tepo.integrations.verl_workers}"
python - <<'PY'
import verl  # noqa: F401  (loads tepo's plugin and trainer)
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY
from verl.trainer.ppo.v1 import get_trainer_cls
assert "tepo" in POLICY_LOSS_REGISTRY, "tepo's verl plugin did not load: is tepo installed in this environment?"
get_trainer_cls("tepo_sync")  # raises if tepo.integrations.verl_workers did not load
PY

exec python -m verl.trainer.main_ppo \
    --config-path="$here" \
    --config-name=tepo_qwen2.5_7b_dapo_math \
    "$@"
