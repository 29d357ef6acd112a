"""One training step, top to bottom: sample -> score -> old/ref log-probs -> advantages -> off-policy correction
-> update -> mismatch metrics -> record.

Each phase is a plain function of its parts (``collect_rollouts``, ``batch_logprobs``, ``compute_advantages``,
``update_policy``, ``record_rollout_tokens``); this module only puts them in order and times them, one short
function per phase. A step is handed the run's parts (:class:`tepo.training.parts.StepParts`) and the passes it
runs (:class:`tepo.training.plan.StepPlan`, decided once at start), never the trainer: the trainer
(``tepo.training.trainer``) owns everything around a step: set-up, evaluation, checkpoints, the metrics log.
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from tepo.advantages import compute_advantages
from tepo.advantages.filtering import all_equal_group_stats
from tepo.logprobs import TokenLogprobs
from tepo.lora import scoring
from tepo.losses.rollout_correction import rollout_correction_weights, rollout_mismatch_metrics
from tepo.metrics.catalogue import in_group
from tepo.metrics.tokens import record_step_samples
from tepo.rewards.shaping import mask_truncated
from tepo.rollout.base import RolloutBatch
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
    s = parts.settings
    return collect_rollouts(
        parts.rollout,
        parts.tokenizer,
        parts.stream,
        pool,
        parts.sampler,
        prompts=s.prompts_per_step,
        seed=step_seed(s.seed, step),
        dynamic_sampling=s.dynamic_sampling,
        max_resample_rounds=s.max_resample_rounds,
        overlong=parts.overlong,
        reward_functions=s.reward_functions,
        step=step + 1,
    )


def train_step(parts: StepParts, plan: StepPlan, pool, step: int, collected: Collected | None = None) -> dict:
    """Run step ``step + 1`` (``step`` steps are done) on ``collected`` (sampled now when None) and return its
    metrics row, every metric named in its group (``reward/mean``, ``update/grad_norm``: tepo.metrics.names).
    Reads ``parts`` and ``plan`` only; the caller counts the step and measures its seconds."""
    # 1-2. Sample and score (unless an overlapped rollout already did, one policy version behind).
    if collected is None:
        collected = collect_step(parts, pool, step)
    row = {
        "step": step + 1,
        "rollout/policy_lag": 0,
        **collected.metrics,
    }  # 1: sampled during the last update
    if collected.batch is None:
        # No update this step; the LR schedule still follows steps, applied or not.
        advance_schedule(parts.scheduler, parts.updates_per_step)
        return row | {"update/skipped_update": 1, "update/skip_reason": "dynamic sampling kept no group"}
    # Sampled on the host; from here on everything runs on the trainer's device (tepo.device; no copy on the CPU).
    batch, rewards = collected.batch.to(parts.device), collected.rewards.to(parts.device)
    row.update(_batch_metrics(batch, rewards))
    # 3. Old-policy and reference log-probs, as the plan says.
    passes = _pre_update_passes(parts, plan, batch, row)
    # 4. Advantages: the estimator is handed every tensor there is and takes what it declared it needs.
    advantages = _advantages(parts, collected, batch, rewards, passes)
    # Whether the estimator gives all-equal groups a gradient (EP-GRPO's fallback; 0 for GRPO).
    stats = all_equal_group_stats(rewards, advantages, batch.response_mask, parts.settings.group_size)
    row.update(in_group("reward", stats))
    # 5. The loss mask, and the off-policy correction once per step from the old pass (where the plan has both).
    tensors, correction_metrics = _row_tensors(parts, plan, batch, advantages, passes)
    # 6. Update: ppo_epochs x mini-batches of gradient-accumulated micro-batches.
    start = time.perf_counter()
    update = update_policy(
        parts.model,
        parts.optimizer,
        parts.scheduler,
        batch,
        tensors,
        plan.update,
        generator=torch.Generator().manual_seed(parts.settings.seed * 7919 + step),
        after_optimizer_step=parts.rollout.weights_updated,
    )
    update_seconds = time.perf_counter() - start
    if plan.update.correction is not None:  # computed inside the update
        correction_metrics = update.correction_metrics
    # 7. How far the sampler was from the trainer's policy (pi_old: the old pass's, else the update's first pass).
    pre_update_logp = passes.old.logp if plan.needs_old_pass else update.token_logp
    row.update(_mismatch_metrics(batch, pre_update_logp, correction_metrics))
    # 8. Record a sample of tokens with their pre-update entropy and advantage (the report's token view).
    pre_update_entropy = passes.old.entropy if plan.old_pass_entropy else update.token_entropy
    _record_samples(parts, step, batch, rewards, pre_update_entropy, advantages)
    # 9. Metrics: the update's, throughput, memory.
    row.update(update.metrics)
    row.update(_throughput(parts, batch, row, update_seconds))
    row.update(_engine_and_memory(parts))
    return row  # step_seconds: measured by the caller (Trainer.run), waiting for an overlapped batch included


def _batch_metrics(batch: RolloutBatch, rewards: Tensor) -> dict:
    lengths = batch.response_mask.sum(1)
    return {
        "rollout/num_sequences": rewards.shape[0],
        "rollout/response_length_mean": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/frac_truncated": float(batch.truncated.float().mean()),
    }


@dataclass(frozen=True)
class _PreUpdatePasses:
    """The no-grad passes before the update: the old policy's (log-probs, entropy, and ``sum_pi_squared`` where
    the plan asks), None when the update's own forward pass is the old policy; the reference's log-probs, None
    without a reference model."""

    old: TokenLogprobs | None
    ref_logp: Tensor | None


def _pre_update_passes(parts: StepParts, plan: StepPlan, batch: RolloutBatch, row: dict) -> _PreUpdatePasses:
    """Run the plan's old-policy pass and the reference pass, and add their time to ``row``."""
    start = time.perf_counter()
    old = ref_logp = None
    settings = plan.update.passes
    if plan.needs_old_pass:
        old = batch_logprobs(
            parts.model,
            batch,
            settings,
            entropy=plan.old_pass_entropy,
            sum_pi_squared=plan.old_pass_sum_pi_squared,
        )
    if plan.needs_reference_model:
        with scoring(parts.ref_model) as reference:  # a frozen copy, or the LoRA policy with its adapters off
            ref_logp = batch_logprobs(reference, batch, settings, entropy=False).logp
    seconds = time.perf_counter() - start
    row["time/logprob_seconds"] = seconds
    row["time/logprob_tokens_per_s"] = float(batch.response_mask.sum()) / seconds if seconds > 0.01 else None
    return _PreUpdatePasses(old, ref_logp)


def _advantages(
    parts: StepParts, collected: Collected, batch: RolloutBatch, rewards: Tensor, passes: _PreUpdatePasses
) -> Tensor:
    """The estimator's advantages, ``[N]`` or ``[N, T]``, from every tensor the step has."""
    s, old = parts.settings, passes.old
    components = collected.reward_components
    return compute_advantages(
        s.advantage,
        rewards,
        s.group_size,
        logp=None if old is None else old.logp,
        old_logp=None if old is None else old.logp,
        ref_logp=passes.ref_logp,
        entropy=None if old is None else old.entropy,
        mask=batch.response_mask,
        sum_pi_squared=None if old is None else old.sum_pi_squared,
        reward_components=components.to(parts.device) if components is not None else None,
        reward_weights=torch.tensor(s.reward_weights, device=parts.device),
        **s.advantage_options,
    )


def _row_tensors(
    parts: StepParts, plan: StepPlan, batch: RolloutBatch, advantages: Tensor, passes: _PreUpdatePasses
) -> tuple[RowTensors, dict | None]:
    """What the update reads per row, and the metrics of a correction computed here.

    The loss mask: DAPO's overlong filtering leaves truncated responses out of the loss (after their group
    statistics). The off-policy correction of the sampler/trainer gap is computed once per step: importance
    weights (and dropped tokens, which leave the mask) from the old-policy pass (``plan.step_correction``), or
    per micro-batch from the update's own forward pass (``plan.update.correction``), which returns its
    metrics."""
    mask, old = batch.response_mask, passes.old
    loss_mask = mask_truncated(mask, batch.truncated) if parts.settings.overlong_filter else mask
    is_weights, correction_metrics = None, None
    if (correction := plan.step_correction) is not None:
        is_weights, keep, correction_metrics = rollout_correction_weights(
            old.logp, batch.rollout_logp, mask, mode=correction.mode, **correction.options
        )
        loss_mask = loss_mask * keep
    tensors = RowTensors(
        advantages=advantages,
        mask=loss_mask,
        old_logp=None if old is None else old.logp,
        old_entropy=None if old is None else old.entropy,
        ref_logp=passes.ref_logp,
        is_weights=is_weights,
        rollout_logp=batch.rollout_logp,
    )
    return tensors, correction_metrics


def _mismatch_metrics(batch: RolloutBatch, pre_update_logp: Tensor, correction_metrics: dict | None) -> dict:
    """How far the sampler was from the trainer's pre-update policy on this batch, and what the correction did
    (nothing without the sampler's log-probs)."""
    if batch.rollout_logp is None:
        return {}
    gap = rollout_mismatch_metrics(pre_update_logp, batch.rollout_logp, batch.response_mask)
    out = in_group("mismatch", gap, drop_prefix="mismatch_")
    if correction_metrics is not None:
        out.update(in_group("mismatch", correction_metrics))
    return out


def _record_samples(
    parts: StepParts, step: int, batch: RolloutBatch, rewards: Tensor, entropy: Tensor, advantages: Tensor
) -> None:
    """The token view's record of this step, on the steps ``log.samples_every`` names."""
    s = parts.settings
    if not s.samples_every or (step + 1) % s.samples_every:
        return
    record_step_samples(  # decodes only the samples_rows rows the file keeps
        parts.run_dir,
        step + 1,
        parts.tokenizer,
        batch.response_ids,
        entropy,
        advantages,
        batch.response_mask,
        rewards,
        max_rows=s.samples_rows,
    )


def _throughput(parts: StepParts, batch: RolloutBatch, row: dict, update_seconds: float) -> dict:
    tokens = float(batch.response_mask.sum())
    return {
        "time/update_seconds": update_seconds,
        "time/update_tokens_per_s": tokens * parts.settings.ppo_epochs / max(update_seconds, 1e-9),
        "time/gen_tokens_per_s": row["rollout/gen_tokens"] / max(row["time/gen_seconds"], 1e-9),
    }


def _engine_and_memory(parts: StepParts) -> dict:
    """The weight sync's time and check, the learning rate, peak memory."""
    out = {}
    if parts.rollout.last_sync_seconds is not None:
        out["time/rollout_sync_seconds"] = parts.rollout.last_sync_seconds  # included in gen_seconds
    guard = parts.rollout.parity_guard
    if guard is not None and (parity := guard.unlogged_metrics()) is not None:
        # This step's sync checked the engine (tepo.rollout.parity): the gap, and the share of the last update.
        out.update(in_group("parity", parity, drop_prefix="parity_"))
    out["update/lr"] = parts.scheduler.get_last_lr()[0]
    out["memory/peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
    if parts.device.type == "cuda":  # the GPU's own peak since the run started (allocated by torch)
        out["memory/gpu_peak_mb"] = torch.cuda.max_memory_allocated(parts.device) / 2**20
    return out
