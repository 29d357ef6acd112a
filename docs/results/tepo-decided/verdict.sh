#!/usr/bin/env bash
# The tepo-decided study's verdicts, from the committed files alone, once PLAN.md's 40 main runs are in:
#   bash docs/results/tepo-decided/verdict.sh      # from the repository root of a checkout with .venv
# Writes main/table.md (the table), main/verdicts.md and main/verdicts.json (H1-H4 decided by hypotheses.yaml's
# rules: tepo.compare.hypotheses) and main/mechanisms.md (clip fire rates, ratio quantiles, TEPO v2's mask and KL
# term, collapses, seeds pooled per method). Committed before the main runs were finished, so that the analysis is
# fixed before its data: it refuses to decide on fewer runs than the plan's, so no interim verdict is made.
set -euo pipefail
TEPO=${TEPO:-.venv/bin/tepo}  # unquoted below: may be "python -m tepo.cli"
PYTHON=${PYTHON:-.venv/bin/python}
DIR=docs/results/tepo-decided
METHODS=grpo,dapo,tepo,tepo_v2_kl_mask
PLANNED_RUNS=40  # PLAN.md: 4 methods x 10 seeds
finished=$(find "$DIR/main" -path '*/seed*/summary.json' | wc -l)
if [ "$finished" -lt "$PLANNED_RUNS" ]; then
  echo "verdict.sh: $finished of the plan's $PLANNED_RUNS main runs are in $DIR/main; PLAN.md decides only on all" \
    "of them (no interim verdict). Export the finished runs first (README: Running the main study)." >&2
  exit 1
fi
$TEPO compare --table-only --dir "$DIR/main" --losses $METHODS --seeds 10 --hypotheses "$DIR/hypotheses.yaml"
$PYTHON scripts/pilot_mechanisms.py --per-method "$DIR/main" > "$DIR/main/mechanisms.md"
echo "verdicts: $DIR/main/verdicts.md; mechanisms: $DIR/main/mechanisms.md"
