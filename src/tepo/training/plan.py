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

from dataclasses import dataclass, field
from typing import Any

from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires
from tepo.config import AlgorithmConfig, RunConfig, loss_options
from tepo.losses import POLICY_LOSSES, get_policy_loss, needs_mini_batch_stats
from tepo.losses.compute import BoundPolicyLoss, bind_policy_loss
from tepo.losses.rollout_correction import AUTO, AUTO_ROLLOUT_CORRECTION, DROPPING_CORRECTIONS, NORMALIZE
from tepo.training.logprob_pass import LogprobSettings
from tepo.training.micro_batches import MicroBatchLayout, resolve_micro_batch_tokens
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
    """How a run's updates are made, decided once: the loss and its schedule (``settings``), how every log-prob
    pass is computed (``passes``, which holds the micro-batch layout), and ``correction``: a rollout correction
    to compute per micro-batch from the update's own forward pass (a mode that drops nothing, when there is no
    old-policy pass; with one, the step computes the weights once and hands them in
    ``tepo.training.update.RowTensors``).

    Made with the plan, and never again: ``loss``, the loss bound to its options (checked here, not at every
    micro-batch), and ``stats``, the mini-batch statistics pass the loss and its options call for."""

    settings: UpdateSettings
    passes: LogprobSettings
    correction: RolloutCorrection | None = None
    loss: BoundPolicyLoss = field(init=False, repr=False, compare=False)
    stats: MiniBatchStatsPass | None = field(init=False)

    def __post_init__(self):
        options = {**self.settings.loss_options, "max_len": self.settings.max_len}
        object.__setattr__(self, "loss", bind_policy_loss(self.settings.loss, **options))
        object.__setattr__(
            self, "stats", mini_batch_stats_pass(self.settings.loss, self.settings.loss_options)
        )

    @property
    def layout(self) -> MicroBatchLayout:
        return self.passes.layout


@dataclass(frozen=True)
class StepPlan:
    """The passes of every step of a run and where each thing is computed (decided by :func:`plan_step`); the
    step reads this and nothing else to know what to run.

    ``needs_old_pass``: a separate no-grad pass computes ``pi_old`` before the update; without it the single
    update's own forward pass is ``pi_old`` (its ratio is exactly 1 in value, verl's on-policy shortcut).
    ``old_pass_entropy``: that pass returns the per-token entropy too (read by entropy-based estimators,
    TEPO's KL mask as ``old_entropy``, the first mini-batch's entropy selection and the token view's record of
    the pre-update policy, so it comes with every old pass). ``old_pass_sum_pi_squared``: that pass also returns
    ``sum_pi_squared`` (estimators that read it). ``needs_reference_model``: the run keeps a reference policy
    and scores every batch with it (the reference pass). ``correction``: the resolved rollout correction (mode
    and options), None for ``none``; ``step_correction``: the same when the step computes it once from the old
    pass, else None (then ``update.correction`` has it, computed per micro-batch). ``update``: how the update
    runs (:class:`UpdatePlan`, with its mini-batch statistics pass).
    """

    needs_old_pass: bool
    old_pass_entropy: bool
    old_pass_sum_pi_squared: bool
    needs_reference_model: bool
    correction: RolloutCorrection | None
    step_correction: RolloutCorrection | None
    update: UpdatePlan


def plan_step(config: RunConfig, *, backend: str) -> StepPlan:
    """The :class:`StepPlan` of ``config``'s run; ``backend``: the rollout backend the run uses, resolved
    (``tepo.rollout.registry.choose_rollout_backend``), which the correction's ``auto`` depends on. Raises
    ValueError on loss options the loss does not take (``validate`` reports them first)."""
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
    # With an old pass the step computes the correction once over the whole batch; without one, a correction
    # (one that drops nothing) is computed per micro-batch from the update's own forward pass.
    step_correction = correction if needs_old_pass else None
    update_correction = None if needs_old_pass else correction
    return StepPlan(
        needs_old_pass=needs_old_pass,
        old_pass_entropy=needs_old_pass,
        old_pass_sum_pi_squared=needs_old_pass and "sum_pi_squared" in needs,
        needs_reference_model=needs_reference_model(algo),
        correction=correction,
        step_correction=step_correction,
        update=UpdatePlan(update_settings(config), logprob_settings(config), update_correction),
    )


def logprob_settings(c: RunConfig) -> LogprobSettings:
    """How every log-prob pass of ``c``'s run is computed (old, reference and the update's)."""
    return LogprobSettings(
        micro_batch_size=c.train.micro_batch_size,
        temperature=c.rollout.temperature,
        autocast_bf16=c.model.autocast_bf16,
        share_prompt_prefix=c.model.share_prompt_prefix,
        train_attention=c.model.train_attention,
        micro_batch_tokens=resolve_micro_batch_tokens(c.train.micro_batch_tokens, c.rollout.max_new_tokens),
    )


def update_settings(c: RunConfig) -> UpdateSettings:
    """The loss and the schedule of ``c``'s updates."""
    return UpdateSettings(
        loss=c.algorithm.loss,
        loss_options=loss_options(c.algorithm),
        epochs=c.train.ppo_epochs,
        mini_batch_groups=c.train.mini_batch_prompts or c.train.prompts_per_step,
        group_size=c.rollout.group_size,
        max_grad_norm=c.optim.max_grad_norm,
        max_len=float(c.rollout.max_new_tokens),
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
