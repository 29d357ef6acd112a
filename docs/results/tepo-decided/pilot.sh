#!/usr/bin/env bash
# The pilot of the tepo-decided study (PILOT.md): short runs that measure whether the mechanisms the papers
# describe can act here, before any main run is planned. Run from the repository root of the study's worktree:
#   bash docs/results/tepo-decided/pilot.sh            # every setting; finished runs are reused, stopped ones resume
# Each setting is one `tepo compare` directory under docs/results/tepo-decided/pilot/; the table of mechanisms is
#   python scripts/pilot_mechanisms.py docs/results/tepo-decided/pilot
set -euo pipefail
TEPO=${TEPO:-.venv/bin/tepo}  # unquoted below: may be "python -m tepo.cli"
OUT=docs/results/tepo-decided/pilot
# Short runs on the shared held-out draw: 6 steps, 100 held-out problems, greedy only; no checkpoints kept at the end.
COMMON=(train.steps=6 eval.size=100 eval.samples=0 train.save_every=2 train.keep_last=1 train.save_final=false)
METHODS=grpo,tepo,tepo_v2_kl_mask
# Updates per rollout: 4 prompts a step; mini-batches of 1 prompt give 4 updates, two epochs of them 8 (the
# settings where a clip can act run first).
$TEPO compare --losses $METHODS --seeds 1 --dir $OUT/u4 --no-report "${COMMON[@]}" train.ppo_epochs=1 train.mini_batch_prompts=1
$TEPO compare --losses $METHODS --seeds 1 --dir $OUT/u8 --no-report "${COMMON[@]}" train.ppo_epochs=2 train.mini_batch_prompts=1
# The response limit: GRPO at 128 and 256 new tokens, 4 updates per rollout (64 is u4's grpo run).
for tokens in 128 256; do
  $TEPO compare --losses grpo --seeds 1 --dir $OUT/len$tokens --no-report "${COMMON[@]}" train.ppo_epochs=1 \
    train.mini_batch_prompts=1 rollout.max_new_tokens=$tokens
done
# One update per rollout last: every ratio is 1 there by construction (the old policy is the current one).
$TEPO compare --losses $METHODS --seeds 1 --dir $OUT/u1 --no-report "${COMMON[@]}" train.ppo_epochs=1
