"""Questions a run asks of its configuration: the loss's options and the notes worth printing at start. (Which
passes a step runs, the reference model's included, is decided in one place: ``tepo.training.plan``.)"""

from __future__ import annotations

from tepo.config.schema import AlgorithmConfig, RunConfig


def loss_options(algo: AlgorithmConfig) -> dict:
    """Options passed to ``compute_policy_loss``: the loss's own settings plus the active regularizers."""
    options = dict(algo.loss_options)
    if algo.entropy_coef:
        options["entropy_coef"] = algo.entropy_coef
    if algo.kl_coef:
        options["kl_coef"] = algo.kl_coef
        options["kl_estimator"] = algo.kl_estimator
    if algo.tepo_kl_mask_coef:
        options["tepo_kl_mask_coef"] = algo.tepo_kl_mask_coef
        # Only a change from the loss's own default (k3) is passed, so the options of earlier runs read as before.
        if algo.tepo_kl_mask_estimator != "k3":
            options["tepo_kl_mask_estimator"] = algo.tepo_kl_mask_estimator
    return options


def config_warnings(config: RunConfig) -> list[str]:
    """One-line notes on a valid config that runs but may not do at first what its name suggests (the trainer
    logs them at start). Problems are ``validate``'s; an invalid estimator setting gives no note here."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires

    renamed = list(getattr(config, "renamed_key_notes", ())) + _reward_notes(config)
    algo = config.algorithm
    if algo.advantage not in ADVANTAGE_ESTIMATORS:
        return renamed
    try:
        needs = estimator_requires(algo.advantage, algo.advantage_options)
    except ValueError:
        return renamed
    notes = renamed
    if {"logp", "ref_logp"} <= needs:
        notes.append(
            f"algorithm.advantage={algo.advantage!r} measures the policy against the reference model "
            "(logp - ref_logp); the reference is a frozen copy of the initial policy, so that term is exactly 0 "
            "on step 1 and carries signal only once the policy has moved away from it"
        )
    return notes


def _reward_notes(config: RunConfig) -> list[str]:
    from tepo.rewards import parse_reward_functions
    from tepo.rewards.functions import runs_math_verify

    names = [name for name, _ in parse_reward_functions(config.reward.functions)[0]]
    if names and not runs_math_verify(names) and config.eval.size:
        return [
            "reward.functions are your own and exclude correctness, so the task is not taken for math, but "
            "the "
            f"held-out evaluation (eval.size={config.eval.size}) scores math-verify's correctness; set "
            "eval.size=0 and score with `tepo eval --reward-function PATH:NAME` (docs/rewards.md)"
        ]
    return []
