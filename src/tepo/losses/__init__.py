"""Policy losses and regularizers as pure tensor functions, a registry by name, and aggregation modes.

What each name computes is specified in docs/algorithms.md and in each loss's docstring::

    loss, metrics = compute_policy_loss("tepo", logp=logp, old_logp=old, advantages=adv, mask=mask,
                                        num_tokens=global_token_count)

Rollout correction (sampler != trainer): ``w, keep, m = rollout_correction_weights(old, rollout_logp, mask,
mode="tis")`` then ``compute_policy_loss(..., mask=mask & keep, is_weights=w)``. Losses with
``spec.needs_batch_stats`` take ``batch_stats=mini_batch_stats(...).rows(rows, cols)`` per micro-batch.

Token selections for any loss (``off_policy_mask``, ``top_entropy_quantile``, ``m2po_threshold``) are options;
the two batch-wide ones also travel through ``mini_batch_stats`` (``needs_mini_batch_stats(name, options)``).

Extend the registry with ``@register_policy_loss("my_loss")`` on ``fn(inputs: LossInputs, *, option=default)``
returning ``(per-token loss [N, T], metrics)``.
"""

# isort: off
# Importing these modules registers the built-in losses, in the order of docs/algorithms.md.
from tepo.losses import token_ratio, sequence_ratio, covariance  # noqa: F401
from tepo.losses import soft_weight, divergence_mask  # noqa: F401
from tepo.losses import plain_gradient  # noqa: F401  (verl's gpg and dro)

# Objectives of open TRL / verl pull requests (docs/parity.md names each head commit).
from tepo.losses import unbounded_positive, trust_budget, tapered  # noqa: F401
from tepo.losses import surprisal_weight, future_kl, zero_variance  # noqa: F401

# isort: on
from tepo.losses.aggregation import AGG_MODES, aggregate
from tepo.losses.batch_stats import mini_batch_stats, needs_mini_batch_stats
from tepo.losses.compute import compute_policy_loss, valid_options
from tepo.losses.covariance import CovStats
from tepo.losses.inputs import LossInputs
from tepo.losses.registry import (
    POLICY_LOSSES,
    PolicyLossSpec,
    describe,
    describe_table,
    get_policy_loss,
    list_policy_losses,
    register_policy_loss,
)
from tepo.losses.regularizers import KL_ESTIMATORS, kl_estimate
from tepo.losses.rollout_correction import (
    ROLLOUT_CORRECTIONS,
    rollout_correction_weights,
    rollout_mismatch_metrics,
)
from tepo.losses.surprisal_weight import StareStats
from tepo.losses.token_count import TokenCount

__all__ = [
    "AGG_MODES",
    "KL_ESTIMATORS",
    "POLICY_LOSSES",
    "ROLLOUT_CORRECTIONS",
    "CovStats",
    "LossInputs",
    "PolicyLossSpec",
    "StareStats",
    "TokenCount",
    "aggregate",
    "compute_policy_loss",
    "describe",
    "describe_table",
    "get_policy_loss",
    "kl_estimate",
    "list_policy_losses",
    "mini_batch_stats",
    "needs_mini_batch_stats",
    "register_policy_loss",
    "rollout_correction_weights",
    "rollout_mismatch_metrics",
    "valid_options",
]
