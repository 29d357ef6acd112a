"""Policy-gradient losses without a ratio clip, as verl 0.9.1 registers them: gpg and dro.

verl's third name of this kind, ``bypass_mode``, is not a loss but a way to feed one: the trainer sets the old
policy to the sampler's log-probs (no recomputation pass) and the loss is ``vanilla`` (PPO clip on
``pi / pi_rollout``) or REINFORCE with rollout IS weights. tepo's equivalent is a setting, not a name; see
`BYPASS_MODE` and docs/parity.md.
"""

from __future__ import annotations

import torch

from tepo.losses._common import clip_metrics, masked_mean_value, token_log_ratio
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import register_policy_loss

BYPASS_MODE = (
    "verl's bypass_mode sets old_log_prob = rollout_log_prob (no old-policy recomputation) and then runs either "
    "vanilla PPO-clip on pi/pi_rollout (loss_type=ppo_clip, no IS weights) or REINFORCE with truncated IS weights "
    "pi/pi_rollout (loss_type=reinforce), with optional rejection masks. tepo keeps the recomputed old policy and "
    "corrects the sampler gap separately: algorithm.rollout_correction (tis/seq_tis/mis, the rejections seq_k3, "
    "seq_max_k2, ...) multiplies the loss by the IS weights of pi_old/pi_rollout. ppo_clip bypass equals tepo's "
    "grpo/dapo when the recomputed old policy equals the sampler's (same numerics, on-policy), and the reinforce "
    "form equals tepo's gpg loss times rollout-correction weights with old = rollout; tepo has no switch that "
    "skips the recomputation and clips against the sampler's log-probs"
)


@register_policy_loss("gpg", default_agg="token-mean", paper="GPG 2504.02546; verl policy_loss=gpg")
def gpg(inputs: LossInputs):
    """GPG (Chu et al. 2504.02546): the plain policy gradient, l = -A * logp, no ratio and no clip.

    Gradient -A * grad(logp) per token; pair it with the ``gpg`` advantage estimator (group-centred rewards
    scaled by the share of non-zero rewards) for the paper's method. Equal to verl's
    ``compute_policy_loss_gpg`` (value and gradient, token-mean). The value depends on logp itself (not a
    ratio), so it is not 0 at r = 1; only its gradient is the policy gradient. clip_frac_* are 0.
    """
    loss_mat = -inputs.advantages * inputs.logp
    none = torch.zeros_like(inputs.mask)
    return loss_mat, clip_metrics(none, none, inputs.mask)


@register_policy_loss(
    "dro", default_agg="token-mean", paper="DRO, Richemond et al. 2405.19107; verl policy_loss=dro"
)
def dro(inputs: LossInputs, *, beta: float = 0.1):
    r"""DRO-style policy gradient with a quadratic log-ratio penalty: l = -(A * logp - (beta/2) (logp - old)^2).

    .. math:: \ell_{i,t} = -\Big(A_{i,t} \log\pi_\theta - \tfrac{\beta}{2} (\log\pi_\theta - \log\pi_{old})^2\Big)

    Direct Reward Optimisation (Richemond et al. 2405.19107) regularises the policy towards the old one with a
    squared log-ratio; verl 0.9.1's ``compute_policy_loss_dro`` uses it per token as written above, with
    ``policy_loss.dro_beta``, which verl leaves unset (null) and refuses unless > 0. The default ``beta = 0.1``
    is ours, not a source's: set it for a real run. ``beta <= 0`` is refused, as verl does. Gradient:
    -(A - beta * (logp - old)) * grad(logp).
    Metric ``dro_log_ratio_mean``: the mean of logp - old over valid tokens.
    """
    if not beta > 0:
        raise ValueError(f"dro needs beta > 0 (verl's policy_loss.dro_beta), got {beta!r}")
    log_ratio = token_log_ratio(inputs)
    loss_mat = -(inputs.logp * inputs.advantages - 0.5 * beta * log_ratio.square())
    none = torch.zeros_like(inputs.mask)
    metrics = clip_metrics(none, none, inputs.mask)
    metrics["dro_log_ratio_mean"] = masked_mean_value(log_ratio.detach(), inputs.mask)
    return loss_mat, metrics
