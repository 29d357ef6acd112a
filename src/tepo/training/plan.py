"""Which passes a run's steps need, decided once at start: this module is the one place that decides.

A step can run up to three forward passes over its batch before the update: the old policy's (``pi_old``, with
its entropy and, for some estimators, ``sum_pi_squared``), the reference policy's, and, without an old pass, the
update's own first forward pass serves as ``pi_old``. Inside the update, a loss with mini-batch statistics (or a
batch-wide token selection) adds a no-grad pass over each mini-batch before its micro-batches
(:class:`MiniBatchStatsPass`). Which of them a run needs depends on the loss, the advantage estimator, the
schedule of updates and the rollout correction; the answer does not change between steps, so the trainer asks
once (:func:`plan_step`) and hands the :class:`StepPlan` to every ``train_step``, and the update is handed an
:class:`UpdatePlan` that it executes (``tepo.training.update``). The rollout correction's config reading
(``auto`` -> a mode) lives here too: ``tepo.losses.rollout_correction`` keeps only the tensor functions.

To add a pass: decide it here (a field of the plan and the one function that sets it), and run it where the
plan says (``tepo.training.step`` before the update, ``tepo.training.update`` inside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires
from tepo.config import AlgorithmConfig, RunConfig, loss_options
from tepo.losses import POLICY_LOSSES, get_policy_loss, needs_mini_batch_stats
from tepo.losses.rollout_correction import AUTO, AUTO_ROLLOUT_CORRECTION, DROPPING_CORRECTIONS, NORMALIZE
from tepo.training.logprob_pass import LogprobSettings
from tepo.training.micro_batches import MicroBatchLayout
from tepo.training.schedule import updates_per_step

# What the old-policy pass provides; an estimator that reads any of these needs that pass before the update.
_OLD_PASS_TENSORS = frozenset({"logp", "old_logp", "entropy", "sum_pi_squared"})


@dataclass(frozen=True)
class RolloutCorrection:
    """A rollout-correction mode and its thresholds (``tepo.losses.rollout_correction``)."""

    mode: str
    options: dict


@dataclass(frozen=True)
class MiniBatchStatsPass:
    """The inputs of the statistics that span a mini-batch (``tepo.losses.mini_batch_stats``): the current
    policy's log-probs (with ``entropy``, its per-token entropy too) of the whole mini-batch, before its
    micro-batches run. ``loss_statistics``: the loss's own statistics (the covariance losses,
    ``spec.needs_batch_stats``), besides or instead of the batch-wide selections (``top_entropy_quantile``,
    ``m2po_threshold``)."""

    entropy: bool
    loss_statistics: bool

    def reads_old_pass(self, *, first_update: bool, old_logp: bool, old_entropy: bool) -> bool:
        """True when a mini-batch takes the values from the old-policy pass instead of a no-grad pass of its own:
        only the step's first update (the weights the old pass saw), and only when that pass gave what is
        needed (``old_logp``, ``old_entropy``: whether the update was handed them)."""
        return first_update and old_logp and (old_entropy or not self.entropy)


def mini_batch_stats_pass(loss: str, options: dict) -> MiniBatchStatsPass | None:
    """The :class:`MiniBatchStatsPass` of loss ``loss`` with ``options`` (its ``compute_policy_loss`` options),
    None when it needs no mini-batch statistics."""
    if not needs_mini_batch_stats(loss, options):
        return None
    return MiniBatchStatsPass(
        entropy=options.get("top_entropy_quantile") is not None
        or "entropy" in get_policy_loss(loss).requires,
        loss_statistics=get_policy_loss(loss).needs_batch_stats,
    )


@dataclass(frozen=True)
class UpdateSettings:
    loss: str
    loss_options: dict
    epochs: int
    mini_batch_groups: int  # prompts (groups of G rows) per optimizer update
    group_size: int
    max_grad_norm: float
    max_len: float  # rollout.max_new_tokens, for length-normalised aggregation modes


@dataclass(frozen=True)
class UpdatePlan:
    """How a run's updates are made, decided once by the trainer: the loss and its schedule (``settings``), how
    every log-prob pass is computed (``passes``, which holds the micro-batch layout), and ``correction``: a
    rollout correction to compute per micro-batch from the update's own forward pass (a mode that drops
    nothing, when there is no old-policy pass; with one, the step computes the weights once and hands them in
    ``tepo.training.update.RowTensors``). The mini-batch statistics pass (:attr:`stats`) follows from the loss
    and its options."""

    settings: UpdateSettings
    passes: LogprobSettings
    correction: RolloutCorrection | None = None

    @property
    def layout(self) -> MicroBatchLayout:
        return self.passes.layout

    @property
    def stats(self) -> MiniBatchStatsPass | None:
        return mini_batch_stats_pass(self.settings.loss, self.settings.loss_options)


@dataclass(frozen=True)
class StepPlan:
    """The passes of every step of a run (decided by :func:`plan_step`).

    ``needs_old_pass``: a separate no-grad pass computes ``pi_old`` (and its entropy) before the update; without
    it the single update's own forward pass is ``pi_old`` (its ratio is exactly 1 in value, verl's on-policy
    shortcut). ``old_pass_sum_pi_squared``: that pass also returns ``sum_pi_squared`` (estimators that read it).
    ``needs_reference_model``: the run keeps a reference policy and scores every batch with it.
    ``correction``: the resolved rollout correction (mode and options), None for ``none``.
    ``mini_batch_stats``: the no-grad pass over each mini-batch inside the update (:class:`MiniBatchStatsPass`),
    None when the loss needs no mini-batch statistics; the update's :attr:`UpdatePlan.stats` is the same.
    """

    needs_old_pass: bool
    needs_reference_model: bool
    old_pass_sum_pi_squared: bool
    correction: RolloutCorrection | None
    mini_batch_stats: MiniBatchStatsPass | None = None

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
    stats = mini_batch_stats_pass(algo.loss, loss_options(algo))
    # A separate pre-update pass is needed when the policy changes between updates of one rollout, or when the
    # estimator reads the pre-update policy; a correction that drops tokens must know them before the token
    # counts are taken (one that normalises its weights needs the whole batch's), and a loss with mini-batch
    # statistics needs the pre-update log-probs of the whole mini-batch (a batch-wide selection alone does not:
    # the update's statistics pass gives it the current policy's).
    needs_old_pass = (
        updates_per_step(config) > 1
        or bool(needs & _OLD_PASS_TENSORS)
        or (correction is not None and _correction_needs_old_pass(correction))
        or (stats is not None and stats.loss_statistics)
    )
    return StepPlan(
        needs_old_pass=needs_old_pass,
        needs_reference_model=needs_reference_model(algo),
        old_pass_sum_pi_squared=needs_old_pass and "sum_pi_squared" in needs,
        correction=correction,
        mini_batch_stats=stats,
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
