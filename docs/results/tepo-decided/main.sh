#!/usr/bin/env bash
# The main runs of the tepo-decided study, exactly as PLAN.md registers them (committed with it, before any run).
# Run from the repository root of a git worktree of the plan's commit (never from a checkout that changes):
#   bash docs/results/tepo-decided/main.sh           # finished runs are reused, a stopped one resumes
# Seed by seed (every method of seed s before any of seed s+1), so that a partial study is made of whole pairs;
# the checkpoints of finished runs are deleted after each seed (1.6 GB each; only the small files are kept).
set -euo pipefail
TEPO=${TEPO:-.venv/bin/tepo}  # unquoted below: may be "python -m tepo.cli"
OUT=docs/results/tepo-decided/main
METHODS=grpo,dapo,tepo,tepo_v2_kl_mask
SEEDS=${SEEDS:-10}  # the plan's 10; SEEDS=k stops after seed k-1 (one session's share), rerun to go on
# 8 optimizer updates per rollout (4 mini-batches of 1 prompt x 2 epochs), 20 steps, 128 new tokens;
# one shared held-out draw of 500 problems (eval.seed 0, set by tepo compare), greedy, before, every 5 steps, after.
SETTINGS=(train.steps=20 train.ppo_epochs=2 train.mini_batch_prompts=1 rollout.max_new_tokens=128
  eval.size=500 eval.samples=0 eval.every=5 train.save_every=2 train.keep_last=1 train.save_final=false)
for ((seed = 0; seed < SEEDS; seed++)); do
  # --seeds N runs seeds 0..N-1: the earlier seeds' runs are found finished and reused.
  $TEPO compare --losses $METHODS --seeds $((seed + 1)) --dir $OUT --no-report "${SETTINGS[@]}"
  for summary in "$OUT"/*/seed*/summary.json; do
    rm -rf "$(dirname "$summary")/checkpoints"
  done
done
$TEPO compare --table-only --dir $OUT --losses $METHODS
