"""Which passes a run's steps need, decided once at start: :func:`plan_step` is the one place that decides.

A step can run up to three forward passes over its batch before the update: the old policy's (``pi_old``, with
its entropy and, for some estimators, ``sum_pi_squared``), the reference policy's, and, without an old pass, the
update's own first forward pass serves as ``pi_old``. Which of them a run needs depends on the loss, the advantage
estimator, the schedule of updates and the rollout correction; the answer does not change between steps, so the
trainer asks once and hands the :class:`StepPlan` to every ``train_step``. The rollout correction's config reading
(``auto`` -> a mode) lives here too: ``tepo.losses.rollout_correction`` keeps only the tensor functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires
from tepo.config import AlgorithmConfig, RunConfig
from tepo.losses import POLICY_LOSSES, get_policy_loss
from tepo.losses.rollout_correction import AUTO, AUTO_ROLLOUT_CORRECTION, DROPPING_CORRECTIONS, NORMALIZE
from tepo.training.schedule import updates_per_step
from tepo.training.update import RolloutCorrection

# What the old-policy pass provides; an estimator that reads any of these needs that pass before the update.
_OLD_PASS_TENSORS = frozenset({"logp", "old_logp", "entropy", "sum_pi_squared"})


@dataclass(frozen=True)
class StepPlan:
    """The passes of every step of a run (decided by :func:`plan_step`).

    ``needs_old_pass``: a separate no-grad pass computes ``pi_old`` (and its entropy) before the update; without
    it the single update's own forward pass is ``pi_old`` (its ratio is exactly 1 in value, verl's on-policy
    shortcut). ``old_pass_sum_pi_squared``: that pass also returns ``sum_pi_squared`` (estimators that read it).
    ``needs_reference_model``: the run keeps a reference policy and scores every batch with it.
    ``correction``: the resolved rollout correction (mode and options), None for ``none``.
    """

    needs_old_pass: bool
    needs_reference_model: bool
    old_pass_sum_pi_squared: bool
    correction: RolloutCorrection | None

    @property
    def update_correction(self) -> RolloutCorrection | None:
        """The correction the update computes per micro-batch from its own forward pass (no old pass), else None:
        with an old pass the step computes it once on the whole batch and hands the weights in."""
        return None if self.needs_old_pass else self.correction


def plan_step(config: RunConfig, *, backend: str) -> StepPlan:
    """The :class:`StepPlan` of ``config``'s run; ``backend``: the rollout backend the run uses, resolved
    (``tepo.rollout.registry.choose_rollout_backend``), which the correction's ``auto`` depends on."""
    algo = config.algorithm
    mode = resolve_rollout_correction(config, backend=backend)
    correction = RolloutCorrection(mode, dict(algo.rollout_correction_options)) if mode != "none" else None
    needs = estimator_requires(algo.advantage, algo.advantage_options)
    # A separate pre-update pass is needed when the policy changes between updates of one rollout, or when the
    # estimator reads the pre-update policy; a correction that drops tokens must know them before the token
    # counts are taken (one that normalises its weights needs the whole batch's), and a loss with mini-batch
    # statistics needs the pre-update log-probs of the whole mini-batch.
    needs_old_pass = (
        updates_per_step(config) > 1
        or bool(needs & _OLD_PASS_TENSORS)
        or (correction is not None and _correction_needs_old_pass(correction))
        or get_policy_loss(algo.loss).needs_batch_stats
    )
    return StepPlan(
        needs_old_pass=needs_old_pass,
        needs_reference_model=needs_reference_model(algo),
        old_pass_sum_pi_squared=needs_old_pass and "sum_pi_squared" in needs,
        correction=correction,
    )


def _correction_needs_old_pass(correction: RolloutCorrection) -> bool:
    """True when the correction must be computed from a pass before the update over the whole batch: it drops
    tokens (they leave the token counts) or normalises over the batch (a per-micro-batch mean would depend on the
    split)."""
    options = correction.options
    return correction.mode in DROPPING_CORRECTIONS or bool(
        isinstance(options, dict) and options.get(NORMALIZE)
    )


def needs_reference_model(algo: AlgorithmConfig) -> bool:
    """True when the KL penalty, the loss or the advantage estimator (as declared in its registry) reads
    ``ref_logp``. Unknown estimator options raise ValueError (``validate`` reports them first)."""
    spec = POLICY_LOSSES.get(algo.loss)
    needs = bool(algo.kl_coef) or (spec is not None and "ref_logp" in getattr(spec, "requires", ()))
    if algo.advantage in ADVANTAGE_ESTIMATORS:
        needs = needs or "ref_logp" in estimator_requires(algo.advantage, algo.advantage_options)
    return needs


def resolve_rollout_correction(config: Any, *, backend: str) -> str:
    """The mode to run for ``config`` (a `tepo.config.RunConfig`): ``algorithm.rollout_correction`` itself, except
    ``auto``, which is `AUTO_ROLLOUT_CORRECTION` when another engine samples (the vllm backend, bf16 by default)
    and ``none`` when the trainer's own model object samples (hf) or when ``rollout.top_p < 1``: the trainer
    scores without the nucleus, so its ratio to the sampler would hold log(nucleus mass) <= 0 on every token, not
    only the engine mismatch (docs/offpolicy.md); set a mode explicitly to correct anyway. ``backend``: the
    rollout backend the trainer resolved (``auto`` already turned into a name; this function does not look for one).
    """
    name = config.algorithm.rollout_correction
    if name != AUTO:
        return name
    if config.rollout.top_p < 1:
        return "none"
    return AUTO_ROLLOUT_CORRECTION if backend == "vllm" else "none"
