"""Questions a run asks of its configuration: the loss's options, whether a reference model is needed, and the
notes worth printing at start."""

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
    return options


def needs_reference_model(algo: AlgorithmConfig) -> bool:
    """True when the KL penalty, the loss or the advantage estimator (as declared in its registry) reads
    ``ref_logp``. Unknown estimator options raise ValueError (``validate`` reports them first)."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires
    from tepo.losses import POLICY_LOSSES

    spec = POLICY_LOSSES.get(algo.loss)
    needs = bool(algo.kl_coef) or (spec is not None and "ref_logp" in getattr(spec, "requires", ()))
    if algo.advantage in ADVANTAGE_ESTIMATORS:
        needs = needs or "ref_logp" in estimator_requires(algo.advantage, algo.advantage_options)
    return needs


def config_warnings(config: RunConfig) -> list[str]:
    """One-line notes on a valid config that runs but may not do at first what its name suggests (the trainer
    logs them at start). Problems are ``validate``'s; an invalid estimator setting gives no note here."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires

    renamed = list(getattr(config, "renamed_key_notes", ()))
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
