"""What `TepoGRPOTrainer` computes as TRL computes it, on TRL's own state: TRL's entropy bonus and its adaptive
coefficient, TRL's entropy selection threshold, TRL's vLLM importance-sampling weights, and the metrics under
TRL's own names (`tepo.integrations.trl_metrics`). Each function is handed the trainer and reads TRL's fields
of it; the loss itself is `tepo.losses.compute_policy_loss`'s."""

from __future__ import annotations

import math
from typing import Any

import torch
from trl import GRPOTrainer

from tepo.integrations.trl_metrics import TrlMetrics
from tepo.integrations.trl_metrics import column as adv_column
from tepo.losses import aggregate, get_policy_loss


def entropy_threshold(trainer, entropies: torch.Tensor, mask: torch.Tensor, rho: float) -> float:
    """A threshold selecting exactly the tokens TRL's own ``get_high_entropy_mask`` keeps (called unmodified:
    the float32 (1 - rho) quantile of every process's loss tokens' entropies in this micro-batch): the smallest
    kept entropy, as ``H >= it`` keeps the same set; +inf (nothing kept) when TRL keeps none."""
    kept = GRPOTrainer.get_high_entropy_mask(trainer, entropies.detach(), mask, 1.0 - rho)
    if not bool(kept.any()):
        return math.inf
    return float(entropies.detach()[kept].min())


def entropy_coef_now(trainer) -> float:
    """TRL's coefficient for this micro-batch: ``entropy_coef``, or with ``use_adaptive_entropy`` the value set
    at the end of the previous optimizer step, gated off while the last measured entropy is above target."""
    if trainer.use_adaptive_entropy and not trainer._last_world_entropy <= trainer.args.entropy_target:
        return 0.0
    return trainer.entropy_coef


def adapt_entropy_coef(trainer, entropies: torch.Tensor, selected: torch.Tensor) -> None:
    """TRL's adaptive entropy controller, step for step (TRL 1.16 ``_compute_loss``), on TRL's own state
    (``entropy_coef``, ``_last_world_entropy``, ``_entropy_window_stats``; TRL checkpoints them): accumulate
    the window's entropy sum and token count; at the optimizer-step boundary raise the coefficient by
    ``entropy_coef_delta`` if the window's entropy is at or below ``entropy_target``, else lower it, within
    ``[entropy_coef_min, entropy_coef_max]``."""
    weights = selected.to(entropies.dtype)
    stats = torch.stack([(entropies * weights).sum(), weights.sum()]).detach()
    window = trainer._entropy_window_stats
    trainer._entropy_window_stats = stats if window is None else window + stats
    if not trainer.accelerator.sync_gradients:
        return
    totals = trainer.accelerator.reduce(trainer._entropy_window_stats, reduction="sum")
    world_entropy = (totals[0] / totals[1].clamp(min=1.0)).item()
    args = trainer.args
    if world_entropy <= args.entropy_target:
        trainer.entropy_coef = min(trainer.entropy_coef + args.entropy_coef_delta, args.entropy_coef_max)
    else:
        trainer.entropy_coef = max(trainer.entropy_coef - args.entropy_coef_delta, args.entropy_coef_min)
    trainer._last_world_entropy = world_entropy
    trainer._entropy_window_stats = None


def entropy_mean(entropies: torch.Tensor, mask: torch.Tensor, accumulation: float) -> torch.Tensor:
    """TRL's entropy bonus: the token mean of H over this micro-batch's (selected) loss tokens, divided by
    gradient accumulation, whatever the loss's aggregation (tepo's ``entropy_coef`` follows the loss's)."""
    return aggregate(entropies, mask, "token-mean") / accumulation


def log_trl_metrics(trainer, mode, tensors, inputs, entropies, without_entropy, accumulation) -> None:
    """TRL's own metric names with TRL's meaning (`tepo.integrations.trl_metrics`), beside ``tepo/*``."""
    plan = trainer._tepo_plan
    out = TrlMetrics(
        tensors["mask"],
        reduce_sum=lambda x: trainer.accelerator.reduce(x, reduction="sum"),
        gather=trainer.accelerator.gather,
    )
    logged = trainer._metrics[mode]
    ref = inputs.get("ref_per_token_logps")
    if trainer.beta != 0.0 and ref is not None:
        estimator = trainer.loss_options.get("kl_estimator", "k3")
        logged["kl"].append(out.kl(tensors["logp"], ref, tensors["old_logp"], estimator))
    logged["entropy"].append(out.global_mean(entropies))
    for key, value in out.clip_ratios(
        plan, tensors["logp"], tensors["old_logp"], tensors["advantages"]
    ).items():
        logged[key].append(value)
    if trainer.loss_name == "vespo":
        weights = {**get_policy_loss("vespo").defaults, **trainer.loss_options}
        phi = GRPOTrainer.get_gamma_weights(
            advantages=adv_column(tensors["advantages"]),
            log_ratio_per_token=tensors["logp"].detach() - tensors["old_logp"],
            mask=tensors["mask"],
            importance_sampling_ratio=None,
            k_pos=weights["k_pos"],
            lambda_pos=weights["lam_pos"],
            k_neg=weights["k_neg"],
            lambda_neg=weights["lam_neg"],
        )
        logged["vespo/phi_seq_mean"].append(out.global_mean(phi))
    scale = accumulation if plan.policy_loss_per_micro_batch else 1.0
    policy = torch.tensor(
        float(without_entropy) * scale, dtype=torch.float64, device=trainer.accelerator.device
    )
    logged["policy_loss"].append(trainer.accelerator.gather(policy).nanmean().item())
    if trainer._entropy_bonus_enabled and mode == "train" and trainer.accelerator.sync_gradients:
        logged["entropy_coef"].append(trainer.entropy_coef)


def sampler_is_weights(inputs: dict[str, Any], logps: torch.Tensor) -> torch.Tensor | None:
    """TRL's vLLM importance-sampling weights as [N, T] ``is_weights``, or None when TRL computed none.

    TRL stores them only when ``use_vllm`` and ``vllm_importance_sampling_correction`` are both on; a
    sequence-level ratio ([N, 1]) is broadcast over the tokens. Masked-out weights (0) stay 0 and their
    tokens stay in the mask, as in TRL (see the module docstring).
    """
    ratio = inputs.get("importance_sampling_ratio")
    if ratio is None:
        return None
    return ratio.detach().to(logps.dtype).expand_as(logps)
