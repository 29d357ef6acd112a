"""Parity of tepo's ``gdpo`` with verl 0.9.1's own ``compute_gdpo_outcome_advantage``, in verl's real package.

`CHECK_SCRIPT` runs in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py; slow,
like it). Settings that make them equal:

- one reward (verl's fallback when no ``config``/``non_tensor_batch`` is given: ``token_level_rewards`` is the
  only column, weight 1): float64 tensors on both sides, equal to 1e-12, ``norm_adv_by_std_in_grpo`` both ways
  (our ``norm_by_std``), G = 4 and G = 1 (verl: mean 0, std 1; ours the same when called directly);
- two rewards (verl's real multi-reward path: ``config = {gdpo_reward_keys, gdpo_reward_weights}``, the
  columns in ``non_tensor_batch``, ``batch`` holding ``prompts`` and ``attention_mask`` to place each score on
  the last valid token): verl casts every column and its weights to float32 (``np.asarray(comp,
  dtype=np.float32)``, ``torch.tensor(weights, dtype=torch.float32)``) and computes in float32, so the rewards
  and weights are chosen exact in float32 and the comparison is at float32 precision (max gap printed, about
  1e-7); it also checks that this tolerance tells GDPO from GRPO on the summed reward (they differ by > 0.1
  with the std division; without it the centring is linear and the two are the same, which is checked too);
- ``batch_norm="token"`` (our default) is verl's ``masked_whiten``; an all-equal group of one column gives 0
  on both sides at these rewards (exact group means).

TRL 1.16's ``multi_objective_aggregation="normalize_then_sum"`` is written inline in
``GRPOTrainer._generate_and_score_completions`` (no callable piece to feed tensors to); its formula is matched by
``eps=1e-4, batch_norm="sequence"`` and checked by value in tests/training/test_gdpo.py.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

CHECK_SCRIPT = textwrap.dedent(
    r"""
    from verl.trainer.ppo import core_algos
    from tepo.advantages import compute_advantages

    N, T, G, P = 8, 6, 4, 3
    mask = lengths_mask([6, 3, 1, 4, 2, 6, 5, 5], T)
    mf = mask.to(F64)
    index = np.array([0] * G + [1] * G)
    report = {}

    def on_last_token(values, dtype=F64):
        out = torch.zeros(N, T, dtype=dtype)
        out[torch.arange(N), mask.sum(-1) - 1] = values.to(dtype)
        return out

    # ---- one reward: verl's fallback path, float64 end to end ----
    r1 = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.3, 0.7, 0.1, 0.25], dtype=F64)
    for norm in (True, False):
        verl_adv, _ = core_algos.compute_gdpo_outcome_advantage(
            on_last_token(r1), mf, index, norm_adv_by_std_in_grpo=norm)
        ours = compute_advantages("gdpo", r1, G, mask=mask, reward_components=r1.unsqueeze(-1),
                                  reward_weights=torch.ones(1, dtype=F64), norm_by_std=norm)
        report[f"one reward norm={norm}"] = close(ours.unsqueeze(-1) * mf, verl_adv)
    verl_adv, _ = core_algos.compute_gdpo_outcome_advantage(on_last_token(r1), mf, np.arange(N))
    ours = compute_advantages("gdpo", r1, 1, mask=mask, reward_components=r1.unsqueeze(-1),
                              reward_weights=torch.ones(1, dtype=F64))
    report["one reward G=1"] = close(ours.unsqueeze(-1) * mf, verl_adv)

    # ---- two rewards: verl's multi-reward path (float32 inside verl) ----
    acc = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0], dtype=F64)  # group 1 all equal
    fmt = torch.tensor([1.0, 1.0, 0.0, 0.5, 0.0, 1.0, 0.25, 1.0], dtype=F64)
    weights = [1.0, 0.5]
    attention = torch.cat([torch.ones(N, P, dtype=torch.long), mask.long()], dim=1)
    batch = {"prompts": torch.zeros(N, P, dtype=torch.long), "attention_mask": attention}
    config = {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": weights}
    non_tensor = {"acc": acc.numpy().astype(object), "fmt": fmt.numpy().astype(object), "uid": index}
    total = acc * weights[0] + fmt * weights[1]
    components = torch.stack([acc, fmt], dim=1)
    for norm in (True, False):
        verl_adv, _ = core_algos.compute_gdpo_outcome_advantage(
            on_last_token(total, torch.float32), mask.float(), index, norm_adv_by_std_in_grpo=norm,
            config=config, non_tensor_batch=non_tensor, batch=batch)
        assert verl_adv.dtype == torch.float32
        ours = compute_advantages("gdpo", total, G, mask=mask, reward_components=components,
                                  reward_weights=torch.tensor(weights, dtype=F64), norm_by_std=norm)
        ours_tok = ours.unsqueeze(-1) * mf
        report[f"two rewards norm={norm}"] = close(ours_tok, verl_adv.to(F64), rtol=1e-6, atol=1e-6)
        # Non-vacuity: GRPO on the summed reward, then the same whitening, is far from both.
        grpo_sum, _ = core_algos.compute_gdpo_outcome_advantage(
            on_last_token(total), mf, index, norm_adv_by_std_in_grpo=norm)
        report[f"two rewards norm={norm} gap to sum-then-normalise"] = float((grpo_sum - ours_tok).abs().max())
    print(json.dumps(report))
    """
)


def test_verl_gdpo_equals_ours(verl_python, tmp_path):
    report = run_verl_script(verl_python, tmp_path, SCRIPT_PRELUDE + CHECK_SCRIPT)
    assert len(report) == 7, sorted(report)
    for norm in (True, False):
        assert report[f"one reward norm={norm}"] < 1e-12
        assert report[f"two rewards norm={norm}"] < 1e-6
    # With the std division GDPO differs from GRPO on the summed reward by far more than the tolerance; without it
    # the group centring is linear, so both are the same (sum_k w_k (r_k - mean r_k) = total - mean total).
    assert report["two rewards norm=True gap to sum-then-normalise"] > 0.1
    assert report["two rewards norm=False gap to sum-then-normalise"] < 1e-6
