"""`TepoGRPOTrainer` honours what a TRL user sets in ``GRPOConfig`` (issue #25 item 3): each mapping equals TRL
1.16's builtin ``GRPOTrainer._compute_loss`` on the same batch, TRL's metrics are logged under TRL's names with
TRL's values, and what has no equal is refused with a message naming it.

The trainers are real ``TepoGRPOTrainer`` objects (a small random Llama and the embedded model's tokenizer, built
with the GRPOConfig each case names, ``loss_name=None``: the loss is the one GRPOConfig describes). Only their
log-prob pass is replaced, by a function returning the test's float64 tensors, so that TRL's loss code and the
adapter's run unchanged on exactly the same inputs; value, gradient (w.r.t. the log-probs and the entropies)
and TRL's logged metrics are compared at float64.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOConfig, GRPOTrainer

from helpers import one_window_grpo_config
from tepo.advantages import compute_advantages
from tepo.integrations.trl import TepoGRPOTrainer
from tepo.integrations.trl_config import TEPO_LENGTH_WEIGHTING, check_advantage_settings, plan_loss
from trl_runner import N, T, float64_batch, run_loss, tiny_trainer


def _config(tmp_path, **overrides) -> GRPOConfig:
    return one_window_grpo_config(tmp_path, T, **overrides)


def _assert_equal_to_trl(trainer, b, sampling=False):
    trl_loss, trl_grad, trl_grad_h, trl_logged = run_loss(trainer, GRPOTrainer._compute_loss, b, sampling)
    ours, grad, grad_h, logged = run_loss(trainer, TepoGRPOTrainer._compute_loss, b, sampling)
    assert trl_loss.item() != 0.0
    torch.testing.assert_close(ours, trl_loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad_h, trl_grad_h, rtol=1e-12, atol=1e-15)
    # TRL's own metrics, under TRL's names, with TRL's values (TRL averages its clip indicators in float32).
    assert trl_logged, "TRL logged nothing"
    for key, value in trl_logged.items():
        assert key in logged, f"TRL logs {key!r}, the adapter does not"
        if math.isnan(value):
            assert math.isnan(logged[key]), key
        else:
            assert logged[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    assert "tepo/loss" in logged
    return trl_loss, trl_logged


# (GRPOConfig overrides, the registry loss it must map to, a check that the case is not vacuous)
CASES = {
    # TRL's default config with a KL term: use_bias_correction_kl is on by default -> k3_unbiased.
    "defaults+beta": (dict(beta=0.04), "dapo"),
    "grpo": (dict(loss_type="grpo", epsilon=0.2, epsilon_high=0.28), "grpo"),
    "bnpo": (dict(loss_type="bnpo"), "dapo"),
    "dr_grpo": (dict(loss_type="dr_grpo", beta=0.04, use_bias_correction_kl=False), "dr_grpo"),
    "luspo/token": (dict(loss_type="luspo"), "grpo"),
    "luspo/sequence": (dict(loss_type="luspo", importance_sampling_level="sequence"), "luspo"),
    "cispo": (dict(loss_type="cispo", epsilon_high=1.2), "cispo"),
    # TRL's ceiling is epsilon_high itself: unset it is epsilon (0.2), below 1 (issue #36 item 7)
    "cispo/cap<1": (dict(loss_type="cispo"), "cispo"),
    "cispo/sequence": (
        dict(loss_type="cispo", importance_sampling_level="sequence", epsilon_high=1.025),
        "cispo_seq",
    ),
    "cispo/sequence/cap<1": (dict(loss_type="cispo", importance_sampling_level="sequence"), "cispo_seq"),
    # 1.25 is exact in float32 (TRL's temperatures are float32: see the test of the default 1.05 below)
    "sapo": (dict(loss_type="sapo", sapo_temperature_neg=1.25, beta=0.04), "sapo"),
    "sapo/temps": (dict(loss_type="sapo", sapo_temperature_pos=2.0, sapo_temperature_neg=0.5), "sapo"),
    "vespo": (dict(loss_type="vespo"), "vespo"),
    "vespo/params": (dict(loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_neg=4.0), "vespo"),
    "grpo/sequence": (dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05), "gspo"),
    "dapo/sequence": (dict(importance_sampling_level="sequence"), "tepo"),
    "dr_grpo/sequence": (dict(loss_type="dr_grpo", importance_sampling_level="sequence"), "tepo"),
    "delta": (dict(loss_type="grpo", epsilon_high=0.28, delta=1.35), "grpo"),
    # drops row 3 (A < 0, mean drift -0.0016 > -0.01), keeps row 1 (-0.031)
    "off_policy_mask": (dict(off_policy_mask_threshold=-0.01), "dapo"),
    "top_entropy_quantile": (dict(loss_type="grpo", top_entropy_quantile=0.5), "grpo"),
    "entropy_coef": (dict(loss_type="dr_grpo", entropy_coef=0.05), "dr_grpo"),
    "entropy_coef+quantile": (dict(entropy_coef=0.05, top_entropy_quantile=0.3, beta=0.04), "dapo"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trl_config_maps_to_a_registry_loss_equal_to_trls(build_trl_trainer, case):
    config, name = CASES[case]
    trainer = build_trl_trainer(**config)
    assert trainer.loss_name == name
    _assert_equal_to_trl(trainer, float64_batch())


def test_trl_defaults_with_beta_are_dapo_with_the_unbiased_kl(build_trl_trainer):
    trainer = build_trl_trainer(beta=0.04)
    options = trainer.loss_options
    assert (options["eps_low"], options["eps_high"], options["kl_estimator"]) == (0.2, 0.2, "k3_unbiased")
    assert options["kl_coef"] == 0.04
    # loss_name keeps its meaning with TRL's default config: tepo, with TRL's default KL estimator.
    assert build_trl_trainer(loss_name="tepo", beta=0.04).loss_options["kl_estimator"] == "k3_unbiased"


def test_each_trl_option_changes_the_loss(build_trl_trainer):
    """The equality cases above are not vacuous: on that batch delta, the off-policy mask, the entropy
    selection and the sampler's log-probs each change TRL's loss (so the adapter had to reproduce them)."""
    b = float64_batch()

    def trl_value(sampling=False, **config):
        return run_loss(build_trl_trainer(**config), GRPOTrainer._compute_loss, b, sampling)[0].item()

    plain = trl_value(loss_type="grpo", epsilon_high=0.28)
    assert trl_value(loss_type="grpo", epsilon_high=0.28, delta=1.35) != pytest.approx(plain, rel=1e-6)
    assert trl_value(loss_type="grpo", top_entropy_quantile=0.5) != pytest.approx(
        trl_value(loss_type="grpo"), rel=1e-6
    )
    assert trl_value(off_policy_mask_threshold=-0.01) != pytest.approx(trl_value(), rel=1e-6)
    # at 0.02 no row drifts that far from pi_old, but rows 1 and 3 do from the sampler's log-probs
    assert trl_value(off_policy_mask_threshold=0.02) == trl_value()
    assert trl_value(sampling=True, off_policy_mask_threshold=0.02) != pytest.approx(trl_value(), rel=1e-6)


def test_off_policy_mask_reads_trls_sampling_logps(build_trl_trainer):
    # With use_vllm TRL keeps vLLM's log-probs; OPSM reads them, and so does the adapter (as rollout_logp).
    trainer = build_trl_trainer(off_policy_mask_threshold=0.02)
    _assert_equal_to_trl(trainer, float64_batch(), sampling=True)
    # A token vLLM could not score (NaN): TRL counts zero drift for it, the adapter pi_old's drift (its
    # rollout_logp falls back to pi_old, as for dppo/m2po): equal to TRL given pi_old at that token.
    b = float64_batch()
    unscored = b["sampling"].clone()
    unscored[1, 0] = float("nan")
    ours, grad, _, _ = run_loss(
        trainer, TepoGRPOTrainer._compute_loss, {**b, "sampling": unscored}, sampling=True
    )
    filled = torch.where(torch.isnan(unscored), b["old"], unscored)
    want, want_grad, _, _ = run_loss(
        trainer, GRPOTrainer._compute_loss, {**b, "sampling": filled}, sampling=True
    )
    torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-15)


def test_sapo_default_differs_only_by_trls_float32_temperature(build_trl_trainer):
    """TRL builds SAPO's temperatures with ``torch.where(A > 0, tau_pos, tau_neg)`` from python floats, i.e. in
    float32: its default tau_neg 1.05 is float32(1.05) = 1.0499999523. The adapter passes 1.05 (the paper's);
    with float32(1.05) it equals TRL at float64, with 1.05 it differs by that rounding only."""
    trainer = build_trl_trainer(loss_type="sapo")
    assert trainer.loss_options["tau_neg"] == 1.05
    b = float64_batch()
    trl_loss, trl_grad, _, _ = run_loss(trainer, GRPOTrainer._compute_loss, b)
    ours, grad, _, _ = run_loss(trainer, TepoGRPOTrainer._compute_loss, b)
    torch.testing.assert_close(ours, trl_loss, rtol=1e-6, atol=0.0)
    assert abs(ours.item() - trl_loss.item()) > 1e-12
    trainer.loss_options["tau_neg"] = float(torch.tensor(1.05, dtype=torch.float32))
    ours, grad, _, _ = run_loss(trainer, TepoGRPOTrainer._compute_loss, b)
    torch.testing.assert_close(ours, trl_loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-12, atol=1e-15)


def test_trl_entropy_coef_is_a_token_mean_not_the_losss_aggregation(build_trl_trainer):
    """GRPOConfig.entropy_coef is TRL's bonus, ``coef * sum(m*H) / sum(m)`` (per micro-batch, / GA), whatever
    the loss type; loss_options entropy_coef follows the loss's aggregation, for dr_grpo
    ``coef * sum(m*H) / (N * max_completion_length)``. On a batch with 10 of N*L = 20 tokens that is 0.5x."""
    b = float64_batch(lengths=(T, 3, 1, 1))
    assert int(b["mask"].sum()) * 2 == N * T
    with_trl = build_trl_trainer(loss_type="dr_grpo", entropy_coef=0.05)
    with_tepo = build_trl_trainer(loss_type="dr_grpo", loss_options={"entropy_coef": 0.05})
    _, _, grad_trl, logged_trl = run_loss(with_trl, TepoGRPOTrainer._compute_loss, b)
    _, _, grad_tepo, logged_tepo = run_loss(with_tepo, TepoGRPOTrainer._compute_loss, b)
    h, m = b["entropy"], b["mask"].bool()
    want_trl = -0.05 * h[m].sum() / m.sum()
    assert logged_trl["tepo/trl_entropy_bonus"] == pytest.approx(float(want_trl), rel=1e-12)
    assert logged_tepo["tepo/entropy_bonus"] == pytest.approx(0.5 * float(want_trl), rel=1e-12)
    torch.testing.assert_close(grad_tepo, 0.5 * grad_trl, rtol=1e-12, atol=1e-15)
    # TRL logs its coefficient and the loss without the bonus; the adapter too.
    assert logged_trl["entropy_coef"] == 0.05
    assert logged_trl["policy_loss"] == pytest.approx(logged_trl["tepo/loss"] - float(want_trl), rel=1e-9)


@pytest.mark.parametrize("target", [0.5, 2.0])
def test_trl_adaptive_entropy_controller_equals_trls(build_trl_trainer, target):
    """use_adaptive_entropy: the first step applies no bonus (no entropy measured yet), then the coefficient moves
    by entropy_coef_delta towards entropy_target, as TRL's controller on TRL's own state: three steps of the
    adapter equal three steps of TRL's builtin loss (value, gradient, coefficient, metrics). The batch's mean
    entropy is about 1, so target 0.5 lowers the coefficient and gates the bonus off, 2.0 raises it and applies
    it."""
    config = dict(
        use_adaptive_entropy=True, entropy_coef=0.1, entropy_coef_delta=0.03, entropy_target=target, beta=0.04
    )
    trainer = build_trl_trainer(**config)
    state = (trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats)
    trl_steps = []
    for seed in range(3):
        trl_steps.append(
            (*run_loss(trainer, GRPOTrainer._compute_loss, float64_batch(seed)), trainer.entropy_coef)
        )
    trl_coef = trainer.entropy_coef
    trainer.entropy_coef, trainer._last_world_entropy, trainer._entropy_window_stats = state
    for seed, (want, want_grad, want_grad_h, want_logged, want_coef) in enumerate(trl_steps):
        ours, grad, grad_h, logged = run_loss(trainer, TepoGRPOTrainer._compute_loss, float64_batch(seed))
        torch.testing.assert_close(ours, want, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(grad, want_grad, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(grad_h, want_grad_h, rtol=1e-12, atol=1e-15)
        assert trainer.entropy_coef == want_coef
        assert logged["entropy_coef"] == want_logged["entropy_coef"] == want_coef
        assert logged["policy_loss"] == pytest.approx(want_logged["policy_loss"], rel=1e-9)
        # TRL's gate: a bonus only once an entropy was measured, and only while it is at or below the target
        applied = seed > 0 and target > 1
        assert bool(grad_h.abs().gt(0).any()) == applied
    moved = trl_coef - 0.1
    assert moved == pytest.approx(-0.09 if target < 1 else 0.09)


def test_opo_reads_the_completion_mask_trl_has(build_trl_trainer, tiny_model_dir, tmp_path):
    """advantage_estimator='opo' needs each response's length at advantage time: TRL has the completion mask
    there, so the adapter passes it (gathered over processes); OPO's baseline is length-weighted."""
    trainer = tiny_trainer(tiny_model_dir, tmp_path, T, advantage_estimator="opo")
    rewards = torch.tensor([1.0, 0.0, 0.5, 2.0])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    trainer._tepo_rewards_per_func = rewards.unsqueeze(1)
    output = {"advantages": torch.zeros(4), "completion_mask": mask}
    trainer._apply_estimator_and_filter(output)
    lengths = mask.sum(-1).float()
    want = torch.cat(
        [
            rewards[g : g + 2] - (lengths[g : g + 2] * rewards[g : g + 2]).sum() / lengths[g : g + 2].sum()
            for g in (0, 2)
        ]
    )
    torch.testing.assert_close(output["advantages"], want)
    torch.testing.assert_close(output["advantages"], compute_advantages("opo", rewards, 2, mask=mask.bool()))


def test_tepo_explains_trls_length_weighting_warning(build_trl_trainer, caplog):
    """TRL warns on importance_sampling_level='sequence' with a token-sum loss (PR #6042); that is TEPO's own
    configuration, and the adapter says why right after."""
    with caplog.at_level(logging.WARNING):
        trainer = build_trl_trainer(importance_sampling_level="sequence")
    assert trainer.loss_name == "tepo"
    text = caplog.text
    assert "weights each sequence by its completion length" in text  # TRL's warning
    assert TEPO_LENGTH_WEIGHTING in text


# --------------------------------------------------------------------------------------------------------------
# Refusals: what has no equal, or is set twice, is refused with one message that names it (GRPOConfig only:
# plan_loss is what the trainer calls before TRL loads anything).
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loss_name", "options", "config", "message"),
    [
        (
            None,
            {},
            dict(loss_type="sapo", importance_sampling_level="sequence"),
            "no registry loss computes it",
        ),
        (None, {}, dict(loss_type="grpo", epsilon_high=0.28, delta=1.2), r"delta=1.2 <= 1 \+ eps_high"),
        (None, {}, dict(loss_type="sapo", delta=2.0), "TRL ignores delta for loss_type='sapo'"),
        (None, {}, dict(importance_sampling_level="sequence", delta=2.0), "does not take"),
        ("tepo", {}, dict(delta=2.0), "does not take"),
        ("dapo", {"entropy_coef": 0.1}, dict(use_adaptive_entropy=True), "entropy_coef in both GRPOConfig"),
        (
            None,
            {},
            dict(importance_sampling_level="sequence", beta=0.04),
            "TRL weights k3 by the sequence ratio",
        ),
        ("dapo", {"kl_estimator": "k1"}, dict(beta=0.04), "both set it"),
        ("dapo", {"off_policy_mask": 0.1}, dict(off_policy_mask_threshold=0.2), "both set it"),
        ("dapo", {"top_entropy_quantile": 0.1}, dict(top_entropy_quantile=0.2), "both set it"),
        ("dapo", {"entropy_coef": 0.1}, dict(entropy_coef=0.2), "entropy_coef in both GRPOConfig"),
        (None, {"eps_low": 0.1}, dict(), "conflicts with GRPOConfig's loss"),
        ("tepo", {}, dict(loss_type="sapo"), "pass loss_name=None to train TRL's loss"),
        ("tepo", {}, dict(epsilon=0.3), r"GRPOConfig sets epsilon=0.3"),
        ("gspo", {}, dict(importance_sampling_level="sequence"), "is not loss_name='gspo'"),
        ("tepo", {"kl_coef": 0.1}, dict(), r"kl_coef in loss_options: set GRPOConfig\(beta"),
        ("tepo", {"bogus": 1}, dict(), "unknown loss_options bogus"),
        ("tepo", {}, dict(use_liger_kernel=True), "use_liger_kernel"),
    ],
)
def test_refuses_what_has_no_equal(tmp_path, loss_name, options, config, message):
    args = _config(tmp_path, **config)
    with pytest.raises(ValueError, match=message):
        plan_loss(args, loss_name, options)


@pytest.mark.parametrize(
    ("scale", "hint"), [("batch", "grpo_batch_std"), ("none", "dr_grpo"), (False, "dr_grpo")]
)
def test_scale_rewards_is_refused_where_an_estimator_replaces_it(tmp_path, scale, hint):
    args = _config(tmp_path, scale_rewards=scale)
    check_advantage_settings(args, None)  # TRL's advantages: TRL applies its scaling
    with pytest.raises(ValueError, match=f"TRL's '.*' is advantage_estimator='{hint}'"):
        check_advantage_settings(args, "rloo")
    check_advantage_settings(_config(tmp_path), "rloo")  # the default: nothing set, nothing ignored


def test_vespo_with_vllms_correction_is_refused(tmp_path):
    args = _config(tmp_path, loss_type="vespo")
    args.use_vllm = True  # set after construction: GRPOConfig would look for vLLM itself
    with pytest.raises(ValueError, match="TRL folds the sampler ratio into VESPO's sequence weight"):
        plan_loss(args, None, {})
    args.vllm_importance_sampling_correction = False
    assert plan_loss(args, None, {}).name == "vespo"


def test_loss_name_accepts_trl_fields_that_describe_the_same_loss(tmp_path):
    # TRL's sequence + dapo with symmetric eps 0.2 is TEPO: no conflict; TRL's defaults are not used (noted).
    same = plan_loss(_config(tmp_path, importance_sampling_level="sequence"), "tepo", {})
    assert same.name == "tepo" and same.source == "loss_name"
    assert TEPO_LENGTH_WEIGHTING in same.notes
    unused = plan_loss(_config(tmp_path), "gspo", {"eps": 0.1})
    assert any("not used" in note for note in unused.notes)
    dual = plan_loss(_config(tmp_path, delta=3.0), "dapo", {})
    assert dual.options["dual_clip"] == 3.0


def test_trls_cispo_cases_are_not_vacuous(build_trl_trainer):
    """The cispo cases above bite: on that batch TRL's own loss clips some but not all positive-advantage
    tokens (cap 1.2, token ratio) or rows (cap 1.025, sequence ratio), the cap below 1 clips (nearly) everything,
    and the sequence ratio gives another loss than the token ratio at the same cap (so cispo_seq had to be the
    sequence one)."""
    b = float64_batch()
    logged = {}
    values = {}
    for case in ("cispo", "cispo/cap<1", "cispo/sequence", "cispo/sequence/cap<1"):
        trainer = build_trl_trainer(**CASES[case][0])
        values[case], _, _, trl_logged = run_loss(trainer, GRPOTrainer._compute_loss, b)
        logged[case] = trl_logged["cispo_clip_ratio"]
    positive = float(((b["adv"] > 0).unsqueeze(1) & b["mask"].bool()).sum() / b["mask"].sum())
    assert 0 < logged["cispo"] < positive
    # one value per sequence: rows 0 and 2 have A > 0, s_0 = 1.0202 and s_2 = 1.0277: row 2 is above 1.025
    assert logged["cispo/sequence"] == 0.25
    assert logged["cispo/cap<1"] == pytest.approx(positive) and logged["cispo/sequence/cap<1"] == 0.5
    token_at_cap = run_loss(
        build_trl_trainer(loss_type="cispo", epsilon_high=1.025), GRPOTrainer._compute_loss, b
    )[0]
    assert abs(float(token_at_cap - values["cispo/sequence"])) > 1e-6


def test_vespo_lambda_below_trls_floor_is_where_the_two_differ(build_trl_trainer):
    """TRL clamps vespo's lambda to at least 1e-4 (the parity page's row); tepo takes it as given and refuses 0."""
    b = float64_batch()

    def gap(lam):
        trainer = build_trl_trainer(loss_type="vespo", vespo_lambda_pos=lam, vespo_lambda_neg=lam)
        trl = run_loss(trainer, GRPOTrainer._compute_loss, b)[1]
        ours = run_loss(trainer, TepoGRPOTrainer._compute_loss, b)[1]
        return float((ours - trl).abs().max() / trl.abs().max())

    at_floor, below = gap(1e-4), gap(1e-9)
    print(f"relative gradient gap at lambda 1e-4: {at_floor:.3e}, at 1e-9: {below:.3e}")
    assert below > 100 * max(at_floor, 1e-12)  # TRL computed the second with 1e-4
    _assert_equal_to_trl(
        build_trl_trainer(loss_type="vespo", vespo_lambda_pos=1e-4, vespo_lambda_neg=1e-4), b
    )
