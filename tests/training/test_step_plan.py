"""``plan_step``: the one place that decides which passes every step runs (old-policy pass, its
``sum_pi_squared``, the reference model, the rollout correction and where it is computed)."""

from __future__ import annotations

import dataclasses

import pytest

from tepo.config import AlgorithmConfig, load_config
from tepo.losses.rollout_correction import AUTO_ROLLOUT_CORRECTION
from tepo.training.plan import (
    MiniBatchStatsPass,
    RolloutCorrection,
    StepPlan,
    needs_reference_model,
    plan_step,
    resolve_rollout_correction,
)


def _plan(*overrides: str, backend: str = "hf") -> StepPlan:
    return plan_step(load_config("default", list(overrides)), backend=backend)


def test_a_single_on_policy_update_without_correction_runs_no_extra_pass():
    plan = _plan()
    assert not plan.needs_old_pass and not plan.old_pass_entropy and not plan.old_pass_sum_pi_squared
    assert not plan.needs_reference_model
    assert plan.correction is None and plan.step_correction is None and plan.update.correction is None
    assert plan.update.stats is None


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.ppo_epochs=2"],  # the policy changes between updates of one rollout
        ["train.prompts_per_step=4", "train.mini_batch_prompts=2"],  # two updates per step
        ["algorithm.advantage=entropy_adv"],  # the estimator reads the pre-update entropy
        ["algorithm.advantage=erpo"],  # ... and logp
        ["algorithm.advantage=ep_grpo"],  # ... and old_logp
        ["algorithm.loss=clip_cov"],  # mini-batch statistics of the pre-update policy
        ["algorithm.rollout_correction=mis"],  # drops tokens: known before the token counts
        ["algorithm.rollout_correction=seq_k3"],
        [
            "algorithm.rollout_correction=tis",
            "algorithm.rollout_correction_options.normalize=true",
        ],  # batch mean
    ],
)
def test_the_old_pass_runs_where_something_needs_the_pre_update_policy(overrides):
    plan = _plan(*overrides)
    assert plan.needs_old_pass and plan.old_pass_entropy
    assert plan.update.correction is None  # a correction, if any, is computed once by the step
    assert plan.step_correction == plan.correction


def test_sum_pi_squared_comes_with_the_old_pass_for_the_estimators_that_read_it():
    plan = _plan("algorithm.advantage=optimal_token_baseline")
    assert plan.needs_old_pass and plan.old_pass_sum_pi_squared
    assert not _plan("train.ppo_epochs=2").old_pass_sum_pi_squared


@pytest.mark.parametrize("mode", ["tis", "seq_tis"])
def test_a_correction_that_drops_nothing_is_computed_in_the_update_without_an_old_pass(mode):
    plan = _plan(f"algorithm.rollout_correction={mode}", "algorithm.rollout_correction_options.cap=3.0")
    assert not plan.needs_old_pass
    assert plan.correction == RolloutCorrection(mode, {"cap": 3.0})
    assert plan.update.correction == plan.correction and plan.step_correction is None


def test_auto_correction_follows_the_backend():
    assert _plan(backend="hf").correction is None
    assert _plan(backend="vllm").correction == RolloutCorrection(AUTO_ROLLOUT_CORRECTION, {})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], False),
        (["algorithm.kl_coef=0.01"], True),  # the KL penalty
        (["algorithm.advantage=erpo"], True),  # a reference-based estimator
        (
            ["algorithm.advantage=ep_grpo", "algorithm.kl_coef=0"],
            True,
        ),  # its progress term, with no KL penalty
        (["algorithm.advantage=ep_grpo", "model.lora.rank=8"], True),  # LoRA: the adapter-off model
    ],
)
def test_the_reference_model_is_kept_where_something_reads_it(overrides, expected):
    plan = _plan(*overrides)
    assert plan.needs_reference_model is expected
    assert needs_reference_model(load_config("default", overrides).algorithm) is expected


def test_the_plan_is_decided_once_and_cannot_change():
    plan = _plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.needs_old_pass = True  # type: ignore[misc]


def test_needs_reference_model_reads_the_loss_declaration_too():
    assert not needs_reference_model(AlgorithmConfig(loss="grpo", advantage="grpo"))
    assert needs_reference_model(AlgorithmConfig(loss="grpo", advantage="grpo", kl_coef=0.01))


# --------------------------------------------------------------------------------------------------------------
# How ``algorithm.rollout_correction: auto`` resolves (moved here from tests/losses: the tensor layer does not
# read the run config)
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "backend", "expected"),
    [
        ("auto", "vllm", AUTO_ROLLOUT_CORRECTION),
        ("auto", "hf", "none"),
        ("mis", "hf", "mis"),
        ("none", "vllm", "none"),
    ],
)
def test_resolve_with_the_trainers_backend(setting, backend, expected):
    config = load_config(None, [f"algorithm.rollout_correction={setting}"])
    assert resolve_rollout_correction(config, backend=backend) == expected


def test_auto_stays_off_under_top_p_but_an_explicit_mode_does_not():
    config = load_config(None, ["rollout.top_p=0.9"])
    assert resolve_rollout_correction(config, backend="vllm") == "none"
    config = load_config(None, ["rollout.top_p=0.9", "algorithm.rollout_correction=tis"])
    assert resolve_rollout_correction(config, backend="vllm") == "tis"


def test_resolve_takes_the_backend_the_trainer_resolved():
    config = load_config(None, ["rollout.backend=hf"])
    assert resolve_rollout_correction(config, backend="hf") == "none"
    assert AUTO_ROLLOUT_CORRECTION == "tis"


@pytest.mark.parametrize(
    "overrides, stats, old_pass",
    [
        ([], None, False),
        (["algorithm.loss=clip_cov"], MiniBatchStatsPass(entropy=False, loss_statistics=True), True),
        # A batch-wide selection alone: the update's own no-grad pass gives its statistics, no old pass.
        (
            ["algorithm.loss_options.top_entropy_quantile=0.3"],
            MiniBatchStatsPass(entropy=True, loss_statistics=False),
            False,
        ),
        (
            ["algorithm.loss=dapo", "algorithm.loss_options.m2po_threshold=0.05"],
            MiniBatchStatsPass(entropy=False, loss_statistics=False),
            False,
        ),
    ],
)
def test_the_plan_decides_the_mini_batch_statistics_pass(overrides, stats, old_pass):
    """One decision: the update plan the step plan holds names the pass, and the same settings name it again."""
    from tepo.config import loss_options
    from tepo.training.plan import UpdatePlan, UpdateSettings
    from update_runs import logprob_settings

    config = load_config("default", overrides)
    plan = plan_step(config, backend="hf")
    assert plan.update.stats == stats
    assert plan.needs_old_pass is old_pass
    settings = UpdateSettings(config.algorithm.loss, loss_options(config.algorithm), 1, 1, 2, 1.0, 8.0)
    assert UpdatePlan(settings, logprob_settings(2)).stats == stats


def test_only_the_first_update_reads_the_old_pass_and_only_what_it_gave():
    need = MiniBatchStatsPass(entropy=True, loss_statistics=False)
    assert need.reads_old_pass(first_update=True, old_logp=True, old_entropy=True)
    assert not need.reads_old_pass(first_update=False, old_logp=True, old_entropy=True)
    assert not need.reads_old_pass(first_update=True, old_logp=True, old_entropy=False)  # entropy is needed
    assert MiniBatchStatsPass(entropy=False, loss_statistics=True).reads_old_pass(
        first_update=True, old_logp=True, old_entropy=False
    )


def test_the_loss_options_are_checked_once_when_the_update_is_planned():
    from tepo.training.plan import UpdatePlan, UpdateSettings
    from update_runs import logprob_settings

    settings = UpdateSettings("tepo", {"dual_clip": 3.0}, 1, 1, 2, 1.0, 8.0)
    with pytest.raises(ValueError, match="dual_clip applies only to policy losses"):
        UpdatePlan(settings, logprob_settings(2))
    plan = UpdatePlan(dataclasses.replace(settings, loss_options={}), logprob_settings(2))
    assert plan.loss.spec.name == "tepo" and plan.loss.common["max_len"] == 8.0
