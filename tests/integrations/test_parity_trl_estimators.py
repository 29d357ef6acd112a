"""Parity with TRL 1.16's own code for the KL estimators and the batch-std advantage (issue #25 item 2).

The same float64 tensors go to TRL's ``GRPOTrainer._compute_loss`` and to ``compute_policy_loss``; TRL's
advantage comes from its own ``_generate_and_score_completions`` on a real generation. The trainers are real
``GRPOTrainer`` objects (a small random Llama and the embedded model's tokenizer, built with the GRPOConfig each
test names); only their log-prob pass is replaced, by a function returning the test's tensors, so that TRL's loss
code runs unchanged on exactly the inputs ours gets. Each test states the TRL settings that make the two equal,
or asserts the documented difference where they are not. docs/parity.md lists these cases (tests/parity_rows.py).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOConfig, GRPOTrainer

from tepo.advantages import compute_advantages
from tepo.losses import compute_policy_loss
from trl_runner import F64, T, float64_batch, run_loss, tiny_trainer

BETA = 0.04


SCORED: list[list[float]] = []  # every batch of rewards _reward returned, in order


def _reward(completions, **kwargs):
    """Deterministic, varied rewards from the completion text (a stand-in: parity needs values, not verification)."""
    values = [(len(c) % 7) / 3.0 for c in completions]
    SCORED.append(values)
    return values


def _trainer(tiny_model_dir, tmp_path, **config) -> GRPOTrainer:
    return tiny_trainer(tiny_model_dir, tmp_path, T, trainer_cls=GRPOTrainer, reward=_reward, config=config)


def _batch(seed=0):
    return float64_batch(seed, logp_noise=0.25, sampling=False, entropy_scale=1.0)


def _trl_loss(trainer, b):
    """TRL's own ``_compute_loss`` on the batch: value, gradient w.r.t. logp, and TRL's logged ``kl``."""
    loss, grad, _, logged = run_loss(trainer, GRPOTrainer._compute_loss, b)
    return loss, grad, logged["kl"]


def _our_loss(name, b, **options):
    logp = b["logp"].clone().requires_grad_(True)
    tensors = dict(old_logp=b["old"], ref_logp=b["ref"], advantages=b["adv"], mask=b["mask"])
    loss, metrics = compute_policy_loss(name, logp=logp, **tensors, kl_coef=BETA, **options)
    loss.backward()
    return loss.detach(), logp.grad, metrics


@pytest.fixture(scope="module")
def token_trainers(tiny_model_dir, tmp_path_factory, one_torch_thread):
    """TRL's token-level-ratio, token-mean loss (``loss_type="bnpo"``), with and without the bias-corrected KL."""
    common = dict(
        loss_type="bnpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28, beta=BETA
    )
    return {
        flag: _trainer(tiny_model_dir, tmp_path_factory.mktemp("trl"), use_bias_correction_kl=flag, **common)
        for flag in (True, False)
    }


def test_trl_defaults_are_the_bias_corrected_kl_and_group_scaling():
    # What a TRL user gets without setting anything: the reason k3_unbiased exists.
    config = GRPOConfig(output_dir="unused", use_cpu=True, report_to="none")
    assert config.use_bias_correction_kl is True and config.scale_rewards == "group"


@pytest.mark.parametrize(("flag", "estimator"), [(True, "k3_unbiased"), (False, "k3")])
def test_kl_estimator_equals_trls_kl(token_trainers, flag, estimator):
    """TRL ``beta=0.04, loss_type="bnpo", importance_sampling_level="token", epsilon=0.2, epsilon_high=0.28``,
    ``use_bias_correction_kl=True`` is ours ``dapo`` (token-mean, eps 0.2/0.28) with ``kl_coef=0.04,
    kl_estimator="k3_unbiased"``; ``use_bias_correction_kl=False`` is ``kl_estimator="k3"``. Value, gradient and
    TRL's logged ``kl`` (our ``kl_ref``) are equal at float64."""
    b = _batch()
    trl_loss, trl_grad, trl_kl = _trl_loss(token_trainers[flag], b)
    ours, our_grad, metrics = _our_loss("dapo", b, eps_low=0.2, eps_high=0.28, kl_estimator=estimator)
    assert trl_loss.item() != 0.0
    torch.testing.assert_close(ours, trl_loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(our_grad, trl_grad, rtol=1e-12, atol=1e-15)
    assert metrics["kl_ref"] == pytest.approx(trl_kl, rel=1e-12)


def test_the_two_trl_kl_settings_differ(token_trainers):
    # The comparison above can tell them apart: the bias correction changes value and gradient off-policy.
    b = _batch()
    with_correction, grad_with, _ = _trl_loss(token_trainers[True], b)
    without, grad_without, _ = _trl_loss(token_trainers[False], b)
    assert abs(with_correction.item() - without.item()) > 1e-4
    assert not torch.allclose(grad_with, grad_without)


def test_sequence_level_trl_weights_its_kl_by_the_sequence_ratio(tiny_model_dir, tmp_path):
    """TRL ``importance_sampling_level="sequence"`` multiplies the KL by ``coef_1``, which is then the sequence
    ratio ``s_i = exp(mean_t (logp - old))``; our ``k3_unbiased`` always uses the token ratio ``r_t``. With
    ``loss_type="bnpo"``, eps 0.2/0.2, the policy terms are both ``tepo``'s, and the losses differ by exactly
    ``beta * sum_{i,t} m * k3 * (s_i - r_t) / T_tot`` (value and gradient)."""
    trainer = _trainer(
        tiny_model_dir,
        tmp_path,
        loss_type="bnpo",
        importance_sampling_level="sequence",
        epsilon=0.2,
        epsilon_high=0.2,
        beta=BETA,
        use_bias_correction_kl=True,
    )
    b = _batch(seed=1)
    trl_loss, trl_grad, _ = _trl_loss(trainer, b)
    ours, our_grad, _ = _our_loss("tepo", b, eps=0.2, kl_estimator="k3_unbiased")

    logp = b["logp"].clone().requires_grad_(True)
    m = b["mask"].bool()
    zero = torch.zeros((), dtype=F64)
    log_r = torch.where(m, logp - b["old"], zero)
    s = torch.exp(log_r.sum(-1, keepdim=True) / m.sum(-1, keepdim=True))
    d = torch.where(m, b["ref"] - logp, zero)
    k3 = torch.exp(d) - d - 1
    gap = BETA * torch.where(m, k3 * (s - torch.exp(log_r)), zero).sum() / m.sum()
    gap.backward()
    assert abs(gap.item()) > 1e-5
    torch.testing.assert_close(trl_loss - ours, gap.detach(), rtol=1e-10, atol=1e-15)
    torch.testing.assert_close(trl_grad - our_grad, logp.grad, rtol=1e-10, atol=1e-14)


def test_grpo_batch_std_equals_trls_batch_scaled_advantage(tiny_model_dir, tmp_path):
    """TRL ``scale_rewards="batch"`` (group mean, std of the whole batch, ``+ 1e-4``) is ``grpo_batch_std`` with
    ``eps=1e-4``, on TRL's own generation and rewards, at float64: TRL's reward code builds its rewards in float32
    (``torch.zeros``), so the test hands TRL's scaling (``_generate_and_score_completions``, unmodified) those
    rewards cast to float64 (exact) and compares at rtol 1e-12 once TRL's float32 Bessel factor is accounted for
    (its ``nanstd`` divides two integer counts in the default float32: relative < 4e-8 on the std). Our default
    ``eps=1e-6`` differs only in that constant."""
    trainer = _trainer(tiny_model_dir, tmp_path, scale_rewards="batch", beta=0.0)
    seen: list[torch.Tensor] = []

    def rewards_in_float64(*args):
        rewards = GRPOTrainer._calculate_rewards(trainer, *args).double()  # TRL's own reward code
        seen.append(rewards)
        return rewards

    trainer._calculate_rewards = rewards_in_float64
    prompts = [{"prompt": "2 + 3 ="}] * 2 + [{"prompt": "Name a prime:"}] * 2
    for _ in range(5):  # sample until the batch's rewards are not all equal (it almost always is at once)
        seen.clear()
        out = trainer._generate_and_score_completions(prompts)
        assert len(seen) == 1
        rewards = seen[0][:, 0]
        if rewards.std() > 0:
            break
    assert rewards.std() > 0, "five generations gave equal rewards: cannot compare the scaling"
    trl_adv = out["advantages"]
    assert trl_adv.dtype == torch.float64
    ours = compute_advantages("grpo_batch_std", rewards, 2, eps=1e-4)
    # TRL's nanstd computes Bessel's factor n / (n - 1) as int / int, i.e. in float32 even for float64 rewards:
    # its std is ours * sqrt(float32(c) / c). That is the only difference (relative < 4e-8).
    n = rewards.numel()
    bessel = n / (n - 1)
    std = float(rewards.std())
    trl_std = std * math.sqrt(float(torch.tensor(bessel, dtype=torch.float32)) / bessel)
    assert 0 < abs(trl_std / std - 1) < 4e-8
    torch.testing.assert_close(ours * (std + 1e-4) / (trl_std + 1e-4), trl_adv, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(ours, trl_adv, rtol=4e-8, atol=0)
    default = compute_advantages("grpo_batch_std", rewards, 2)
    torch.testing.assert_close(default, ours * (std + 1e-4) / (std + 1e-6), rtol=1e-12, atol=1e-15)
    assert not torch.allclose(default, ours, rtol=1e-6, atol=0)
