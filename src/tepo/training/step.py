"""One training step, top to bottom: sample -> score -> old/ref log-probs -> advantages -> off-policy correction
-> update -> mismatch metrics -> record.

Each phase is a plain function of its parts (``collect_rollouts``, ``batch_logprobs``, ``compute_advantages``,
``update_policy``, ``record_rollout_tokens``); this module only puts them in order and times them. A step is
handed the run's parts (:class:`tepo.training.parts.StepParts`) and the passes it runs
(:class:`tepo.training.plan.StepPlan`, decided once at start), never the trainer: the trainer
(``tepo.training.trainer``) owns everything around a step: set-up, evaluation, checkpoints, the metrics log.
"""

from __future__ import annotations

import resource
import time

import torch

from tepo.advantages import compute_advantages
from tepo.advantages.filtering import all_equal_group_stats
from tepo.lora import scoring
from tepo.losses.rollout_correction import rollout_correction_weights, rollout_mismatch_metrics
from tepo.metrics.tokens import record_step_samples
from tepo.rewards.functions import parse_reward_functions
from tepo.rewards.shaping import mask_truncated
from tepo.training.collect import Collected, collect_rollouts
from tepo.training.logprob_pass import batch_logprobs
from tepo.training.parts import StepParts
from tepo.training.plan import StepPlan
from tepo.training.schedule import advance_schedule
from tepo.training.update import RowTensors, update_policy


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of round 0 of ``step`` (round r uses this + r): a resumed run samples what it would have."""
    return seed * 1_000_003 + step * 101


def collect_step(parts: StepParts, pool, step: int) -> Collected:
    """Phases 1-2 of step ``step + 1``: sample G responses per prompt from the rollout backend as it is now, and
    verify them; dynamic sampling drops all-equal groups and refills. Runs in a background thread when rollouts
    overlap the update (``tepo.training.overlap``)."""
    c = parts.config
    return collect_rollouts(
        parts.rollout,
        parts.tokenizer,
        parts.stream,
        pool,
        parts.sampler,
        prompts=c.train.prompts_per_step,
        seed=step_seed(c.train.seed, step),
        dynamic_sampling=c.algorithm.dynamic_sampling,
        max_resample_rounds=c.algorithm.max_resample_rounds,
        overlong=parts.overlong,
        reward_functions=parse_reward_functions(c.reward.functions)[0],
    )


def train_step(parts: StepParts, plan: StepPlan, pool, step: int, collected: Collected | None = None) -> dict:
    """Run step ``step + 1`` (``step`` steps are done) on ``collected`` (sampled now when None) and return its
    metrics row. Reads ``parts`` and ``plan`` only; the caller counts the step and measures its seconds."""
    c = parts.config

    # 1-2. Sample and score (unless an overlapped rollout already did, one policy version behind).
    if collected is None:
        collected = collect_step(parts, pool, step)
    row = {
        "step": step + 1,
        "policy_lag": 0,
        **collected.metrics,
    }  # lag 1: sampled during the last update
    if collected.batch is None:
        # No update this step; the LR schedule still follows steps, applied or not.
        advance_schedule(parts.scheduler, parts.updates_per_step)
        return row | {"skipped_update": 1, "skip_reason": "dynamic sampling kept no group"}
    # Sampled on the host; from here on everything runs on the trainer's device (tepo.device; no copy on the CPU).
    batch, rewards = collected.batch.to(parts.device), collected.rewards.to(parts.device)
    mask = batch.response_mask
    lengths = mask.sum(1)
    row.update(
        num_sequences=rewards.shape[0],
        response_length_mean=float(lengths.mean()),
        response_length_max=float(lengths.max()),
        frac_truncated=float(batch.truncated.float().mean()),
    )

    # 3. Old-policy log-probs and entropy (skipped when the single update's own forward pass is the old policy)
    #    and the reference policy's log-probs (KL penalty, reference-based estimators).
    start = time.perf_counter()
    old_logp = old_entropy = ref_logp = sum_pi_squared = None
    if plan.needs_old_pass:
        if plan.old_pass_sum_pi_squared:
            old_logp, old_entropy, sum_pi_squared = batch_logprobs(
                parts.model, batch, parts.logprob_settings, entropy=True, sum_pi_squared=True
            )
        else:
            old_logp, old_entropy = batch_logprobs(parts.model, batch, parts.logprob_settings, entropy=True)
    if parts.ref_model is not None:
        with scoring(parts.ref_model) as reference:  # a frozen copy, or the LoRA policy with its adapters off
            ref_logp, _ = batch_logprobs(reference, batch, parts.logprob_settings, entropy=False)
    logprob_seconds = time.perf_counter() - start
    row["logprob_seconds"] = logprob_seconds
    row["logprob_tokens_per_s"] = float(mask.sum()) / logprob_seconds if logprob_seconds > 0.01 else None

    # 4. Advantages: the estimator is handed every tensor there is and takes what it declared it needs.
    weights = [w for _, w in parse_reward_functions(c.reward.functions)[0]]
    components = collected.reward_components
    advantages = compute_advantages(
        c.algorithm.advantage,
        rewards,
        c.rollout.group_size,
        logp=old_logp,
        old_logp=old_logp,
        ref_logp=ref_logp,
        entropy=old_entropy,
        mask=mask,
        sum_pi_squared=sum_pi_squared,
        reward_components=components.to(parts.device) if components is not None else None,
        reward_weights=torch.tensor(weights, device=parts.device),
        **c.algorithm.advantage_options,
    )
    # Whether the estimator gives a gradient to groups whose rewards are all equal (EP-GRPO's fallback; 0 for GRPO).
    row.update(all_equal_group_stats(rewards, advantages, mask, c.rollout.group_size))

    # 5. The loss mask, and the off-policy correction of the sampler/trainer gap, computed once per step: importance
    #    weights (and dropped tokens) from the old-policy pass, or, when there is none, per micro-batch from the
    #    update's own forward pass (plan.update_correction), which also returns their whole-batch metrics.
    #    DAPO's overlong filtering leaves truncated responses out of the loss (after their group statistics).
    loss_mask = mask_truncated(mask, batch.truncated) if c.reward.overlong_filter else mask
    is_weights, correction_metrics = None, None
    if plan.correction is not None and old_logp is not None:
        is_weights, keep, correction_metrics = rollout_correction_weights(
            old_logp, batch.rollout_logp, mask, mode=plan.correction.mode, **plan.correction.options
        )
        loss_mask = loss_mask * keep

    # 6. Update: ppo_epochs x mini-batches of gradient-accumulated micro-batches.
    start = time.perf_counter()
    update = update_policy(
        parts.model,
        parts.optimizer,
        parts.scheduler,
        batch,
        RowTensors(
            advantages=advantages,
            mask=loss_mask,
            old_logp=old_logp,
            old_entropy=old_entropy,
            ref_logp=ref_logp,
            is_weights=is_weights,
            rollout_logp=batch.rollout_logp,
        ),
        parts.update_plan,
        generator=torch.Generator().manual_seed(c.train.seed * 7919 + step),
        after_optimizer_step=parts.rollout.weights_updated,
    )
    update_seconds = time.perf_counter() - start
    token_entropy, token_logp = update.pop("token_entropy"), update.pop("token_logp")
    correction_metrics = update.pop("correction_metrics", correction_metrics)  # from the in-loop correction
    trainer_logp = old_logp if old_logp is not None else token_logp  # the pre-update policy, pi_old

    # 7. How far the sampler was from the trainer's policy on this batch, and what the correction did.
    if batch.rollout_logp is not None:
        row.update(rollout_mismatch_metrics(trainer_logp, batch.rollout_logp, mask))
        if correction_metrics is not None:
            row.update(correction_metrics)

    # 8. Record a sample of tokens with their pre-update entropy and advantage (the report's token view).
    if c.log.samples_every and (step + 1) % c.log.samples_every == 0:
        record_step_samples(  # decodes only the samples_rows rows the file keeps
            parts.run_dir,
            step + 1,
            parts.tokenizer,
            batch.response_ids,
            old_entropy if old_entropy is not None else token_entropy,
            advantages,
            mask,
            rewards,
            max_rows=c.log.samples_rows,
        )

    # 9. Metrics: the update's, throughput, memory.
    row.update(update)
    row["update_seconds"] = update_seconds
    row["update_tokens_per_s"] = float(mask.sum()) * c.train.ppo_epochs / max(update_seconds, 1e-9)
    row["gen_tokens_per_s"] = row["gen_tokens"] / max(row["gen_seconds"], 1e-9)
    if getattr(parts.rollout, "last_sync_seconds", None) is not None:
        row["rollout_sync_seconds"] = parts.rollout.last_sync_seconds  # included in gen_seconds
    guard = getattr(parts.rollout, "parity_guard", None)
    if guard is not None and (parity := guard.unlogged_metrics()) is not None:
        # This step's sync checked the engine (tepo.rollout.parity): the gap, and the share of the last update.
        row.update(parity)
    row["lr"] = parts.scheduler.get_last_lr()[0]
    row["peak_memory_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if parts.device.type == "cuda":  # the GPU's own peak since the run started (allocated by torch)
        row["gpu_peak_memory_mb"] = torch.cuda.max_memory_allocated(parts.device) / 2**20
    return row  # step_seconds: measured by the caller (Trainer.run), waiting for an overlapped batch included
