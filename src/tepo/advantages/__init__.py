"""Advantage estimators (a registry by name, like the policy losses) and group filtering for dynamic sampling.

Every estimator maps the verifier rewards of a rollout batch to advantages. ``rewards`` is ``[N]`` with
``N = num_groups * group_size`` and the ``group_size`` (``G``) responses of one prompt in contiguous rows:
rows ``g*G .. g*G+G-1`` belong to prompt ``g``. Sequence-level estimators return ``A`` of shape ``[N]``
(the trainer broadcasts it over tokens); token-level estimators return ``A`` of shape ``[N, T]`` with
exact zeros at masked positions::

    needs = estimator_requires(name, options)        # e.g. {"entropy", "mask", "logp", "ref_logp"} for erpo
    adv = compute_advantages(name, rewards, group_size, logp=..., old_logp=..., ref_logp=..., entropy=...,
                             mask=..., **options)     # each estimator receives only what it declared

Advantages are targets, not functions of the parameters: every input is detached and no output carries a
gradient. Extend the registry with ``@register_advantage_estimator("name", requires=..., group_relative=...)``.

Reference: docs/algorithms.md, sections "Advantage estimators" and "Group filtering".
"""

# isort: off
# Importing these modules registers the built-in estimators, in the order of docs/algorithms.md.
from tepo.advantages import group, token_level  # noqa: F401
from tepo.advantages import ep_grpo  # noqa: F401  (after ERPO, the papers' order)
from tepo.advantages import group_baselines  # noqa: F401  (after the TEPO papers' estimators)
from tepo.advantages import frameworks  # noqa: F401  (verl's other estimators)
from tepo.advantages import codapo  # noqa: F401  (an open verl pull request, docs/parity.md)

# isort: on
from tepo.advantages.compute import compute_advantages
from tepo.advantages.ep_grpo import ep_grpo_advantages
from tepo.advantages.filtering import GroupFilterResult, filter_groups, select_rows
from tepo.advantages.group import dr_grpo_advantages, grpo_advantages, rloo_advantages
from tepo.advantages.group_baselines import grpo_batch_std_advantages, maxrl_advantages, opo_advantages
from tepo.advantages.registry import (
    ADVANTAGE_ESTIMATORS,
    TENSOR_INPUTS,
    AdvantageEstimator,
    describe,
    describe_table,
    estimator_requires,
    get_advantage_estimator,
    list_advantage_estimators,
    register_advantage_estimator,
    zero_log_ratio_problem,
)
from tepo.advantages.token_level import entropy_advantages, erpo_advantages

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "TENSOR_INPUTS",
    "AdvantageEstimator",
    "GroupFilterResult",
    "compute_advantages",
    "describe",
    "describe_table",
    "dr_grpo_advantages",
    "entropy_advantages",
    "ep_grpo_advantages",
    "erpo_advantages",
    "estimator_requires",
    "filter_groups",
    "get_advantage_estimator",
    "grpo_advantages",
    "grpo_batch_std_advantages",
    "list_advantage_estimators",
    "maxrl_advantages",
    "opo_advantages",
    "register_advantage_estimator",
    "rloo_advantages",
    "select_rows",
    "zero_log_ratio_problem",
]
