"""Parity with verl 0.9.1's own functions for the estimators and losses of issue #39, in verl's real package.

`CHECK_SCRIPT` runs in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py;
slow-marked like it) and feeds the same float64 tensors to verl's functions and to ours. Settings that make them
equal, per name:

- ``reinforce_plus_plus``: verl ``AlgoConfig(gamma=1.0)`` and ``gamma=0.9`` vs ours with the same ``gamma``; the
  outcome reward sits on each response's last valid token (verl's ``token_level_rewards``).
- ``gpg`` (estimator): verl computes its scale ``alpha`` in float32 (an int over an int64 tensor); ours is
  float64, so ours is compared after rescaling by ``float32(alpha) / alpha`` (a relative 1.5e-8 here).
- ``reinforce_plus_plus_baseline``, ``gpg`` (estimator): the responses of a prompt in contiguous rows (verl groups
  by ``index``), G >= 2 (at G = 1 verl uses baseline 0, tepo refuses G = 1 for group-relative estimators).
- ``grpo_passk``: verl ``AlgoConfig(norm_adv_by_std_in_grpo=True/False)`` vs ``norm_by_std``.
- ``optimal_token_baseline`` / ``tir_optimal_token_baseline``: ``rollout_is_weights=None`` (tepo's trainer passes
  none), ``handle_zero_tail`` both ways; tir also on a mask with observation gaps.
- losses ``gpg`` and ``dro``: verl's ``compute_policy_loss_gpg/dro`` with ``loss_agg_mode="token-mean"``, its
  ``global_batch_info`` set to the batch's own token count (dp 1), ``dro_beta`` = our ``beta``: value and gradient.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

CHECK_SCRIPT = textwrap.dedent(
    r"""
    from verl.trainer.config import AlgoConfig
    from verl.trainer.ppo import core_algos
    from tepo.advantages import compute_advantages
    from tepo.losses import compute_policy_loss

    gen = torch.Generator().manual_seed(0)
    N, T, G = 8, 6, 4
    mask = lengths_mask([6, 3, 1, 4, 2, 6, 5, 5], T)
    mf = mask.to(F64)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0, 0.25], dtype=F64)
    index = np.array([0] * G + [1] * G)
    token_rewards = torch.zeros(N, T, dtype=F64)
    token_rewards[torch.arange(N), mask.sum(-1) - 1] = rewards
    report = {}

    for gamma in (1.0, 0.9):
        verl_adv, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(
            token_rewards.clone(), mf, config=AlgoConfig(gamma=gamma))
        ours = compute_advantages("reinforce_plus_plus", rewards, G, mask=mask, gamma=gamma)
        report[f"reinforce_plus_plus gamma={gamma}"] = close(ours, verl_adv)

    verl_adv, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        token_rewards.clone(), mf, index, config=AlgoConfig())
    ours = compute_advantages("reinforce_plus_plus_baseline", rewards, G, mask=mask).unsqueeze(-1) * mf
    report["reinforce_plus_plus_baseline"] = close(ours, verl_adv)

    verl_adv, _ = core_algos.compute_gpg_outcome_advantage(token_rewards.clone(), mf, index)
    ours = compute_advantages("gpg", rewards, G).unsqueeze(-1) * mf
    # verl's alpha = bsz / count_nonzero(...) divides an int by an int64 tensor: float32 (torch's default dtype),
    # ours is float64. Rescaling ours by float32(alpha)/alpha makes them equal: that rounding is the whole gap.
    alpha = N / int(torch.count_nonzero(rewards))
    alpha32 = float(torch.tensor(N) / torch.count_nonzero(rewards))
    assert abs(alpha32 - alpha) > 0  # the rounding this line accounts for is real at these rewards
    report["gpg estimator"] = close(ours * (alpha32 / alpha), verl_adv)

    for norm in (True, False):
        verl_adv, _ = core_algos.compute_grpo_passk_outcome_advantage(
            token_rewards.clone(), mf, index, config=AlgoConfig(norm_adv_by_std_in_grpo=norm))
        ours = compute_advantages("grpo_passk", rewards, G, norm_by_std=norm).unsqueeze(-1) * mf
        report[f"grpo_passk norm={norm}"] = close(ours, verl_adv)
        assert int((ours.abs().sum(-1) > 0).sum()) == 1  # group 0 has one learner; group 1 ties at 1: margin 0

    old = -torch.rand(N, T, generator=gen, dtype=F64) * 2
    s2 = torch.rand(N, T, generator=gen, dtype=F64) * 0.5 + 0.1
    gap_mask = mask.clone()
    gap_mask[0, 2] = False  # an observation span inside a response (multi-turn)
    gap_mask[5, 1:3] = False
    for zero_tail in (True, False):
        verl_adv, _ = core_algos.compute_optimal_token_baseline_advantage(
            token_rewards.clone(), mf, index, old, s2, handle_zero_tail=zero_tail)
        ours = compute_advantages("optimal_token_baseline", rewards, G, old_logp=old, sum_pi_squared=s2,
                                  mask=mask, handle_zero_tail=zero_tail)
        report[f"optimal_token_baseline zero_tail={zero_tail}"] = close(ours, verl_adv)
        for name, m in (("prefix", mask), ("gaps", gap_mask)):
            tr = torch.zeros(N, T, dtype=F64)
            last = T - 1 - m.flip(1).to(torch.int8).argmax(1)
            tr[torch.arange(N), last] = rewards
            verl_adv, _ = core_algos.compute_multi_turn_optimal_token_baseline_advantage(
                tr, m.to(F64), index, old, s2, handle_zero_tail=zero_tail)
            ours = compute_advantages("tir_optimal_token_baseline", rewards, G, old_logp=old, sum_pi_squared=s2,
                                      mask=m, handle_zero_tail=zero_tail)
            report[f"tir_optimal_token_baseline {name} zero_tail={zero_tail}"] = close(ours, verl_adv)

    # ---- losses: verl compute_policy_loss_gpg / _dro vs ours, value and gradient ----
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig

    logp0 = old + 0.3 * torch.randn(N, T, generator=gen, dtype=F64)
    adv = torch.randn(N, generator=gen, dtype=F64).unsqueeze(-1).expand(N, T).contiguous()
    for name, beta in (("gpg", None), ("dro", 0.3)):
        from verl.workers.config import PolicyLossConfig
        pl = PolicyLossConfig(loss_mode=name, **({"dro_beta": beta} if beta else {}))
        actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                            loss_agg_mode="token-mean", policy_loss=pl)
        actor.global_batch_info.clear()
        actor.global_batch_info.update({"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": N})
        a = logp0.clone().requires_grad_(True)
        b = logp0.clone().requires_grad_(True)
        fn = core_algos.get_policy_loss_fn(name)
        verl_loss, _ = fn(old, a, adv, mf, loss_agg_mode="token-mean", config=actor)
        ours, _ = compute_policy_loss(name, logp=b, old_logp=old, advantages=adv, mask=mask,
                                      **({"beta": beta} if beta else {}))
        verl_loss.backward(); ours.backward()
        report[f"loss {name}"] = [close(ours, verl_loss), close(b.grad, a.grad)]
    print(json.dumps(report))
    """
)


def test_verl_estimators_and_losses_of_issue_39_equal_ours(verl_python, tmp_path):
    report = run_verl_script(verl_python, tmp_path, SCRIPT_PRELUDE + CHECK_SCRIPT)
    assert len(report) == 14, sorted(report)
    assert report["grpo_passk norm=True"] < 1e-12 and report["loss dro"][1] < 1e-12
