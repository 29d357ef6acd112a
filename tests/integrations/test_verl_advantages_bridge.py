"""The verl-free part of `tepo.integrations.verl_advantages`, in the default suite (tepo's own environment).

verl itself is not installed here: the registered function is called as verl 0.9.1's ``compute_advantage`` calls
it (``token_level_rewards``, ``response_mask``, ``index``, ``config``), with the per-token fields handed over by
`advantage_fields` (what `TepoPPOTrainerSync` does). The same path inside verl's real ``compute_advantage`` is
tests/integrations/test_integration_verl_advantages.py (slow: it needs ``.venv-verl``).
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import compute_advantages
from tepo.integrations.verl_advantages import (
    advantage_fields,
    estimator_options,
    group_rows,
    make_verl_estimator,
    tepo_estimator_name,
)

ALGORITHM = {"norm_adv_by_std_in_grpo": True, "gamma": 1.0}


def test_group_rows_puts_each_uid_together_in_batch_order():
    order, size = group_rows(["b", "a", "b", "a", "c", "c"], 6)
    assert order.tolist() == [0, 2, 1, 3, 4, 5] and size == 2
    assert group_rows(None, 3)[0].tolist() == [0, 1, 2] and group_rows(None, 3)[1] == 1
    with pytest.raises(ValueError, match=r"same number of responses, got group sizes \[1, 2\]"):
        group_rows(["a", "a", "b"], 3)


def test_entropy_adv_on_shuffled_rows_by_hand():
    """G = 2, rewards (1, 0) in each group: grpo gives A = +-0.5 / (std + 1e-6) with the unbiased std 1/sqrt(2);
    entropy_adv adds min(alpha H, |A| / kappa) (alpha 0.1, kappa 2): 0.1 at H = 1, |A|/2 at H = 10."""
    index = ["q", "p", "q", "p"]  # rows of a prompt not contiguous, as after verl's balance_batch
    token_rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 1], [1, 0]])
    entropy = torch.tensor([[1.0, 10.0], [1.0, 10.0], [1.0, 10.0], [1.0, 99.0]])
    fn = make_verl_estimator("entropy_adv")
    config = {**ALGORITHM, "tepo_advantage": {"alpha": 0.1, "kappa": 2.0}}
    with advantage_fields({"entropys": entropy}):
        adv, returns = fn(token_level_rewards=token_rewards, response_mask=mask, index=index, config=config)
    a = 0.5 / (1 / math.sqrt(2) + 1e-6)
    want = torch.tensor(
        [[a + 0.1, a + a / 2], [-a + 0.1, -a + a / 2], [-a + 0.1, -a + a / 2], [a + 0.1, 0.0]]
    )
    torch.testing.assert_close(adv, want)
    assert returns is adv


def test_erpo_through_the_bridge_equals_compute_advantages_in_tepos_layout():
    gen = torch.Generator().manual_seed(1)
    n, t, g = 6, 5, 3
    mask = torch.tensor([[1] * k + [0] * (t - k) for k in (5, 2, 4, 1, 5, 3)], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0])
    old = -torch.rand(n, t, generator=gen)
    ref = old + 0.3 * torch.randn(n, t, generator=gen)
    entropy = torch.rand(n, t, generator=gen) * 3
    want = compute_advantages(
        "erpo", rewards, g, logp=old, old_logp=old, ref_logp=ref, entropy=entropy, mask=mask
    )
    assert float((want - compute_advantages("grpo", rewards, g).unsqueeze(-1) * mask).abs().max()) > 1e-3

    perm = torch.tensor([4, 1, 0, 5, 3, 2])
    token_rewards = torch.zeros(n, t)
    token_rewards[torch.arange(n), mask.sum(-1) - 1] = rewards
    fields = {"old_log_probs": old[perm], "ref_log_prob": ref[perm], "entropy": entropy[perm]}
    with advantage_fields(fields):
        adv, _ = make_verl_estimator("erpo")(
            token_level_rewards=token_rewards[perm],
            response_mask=mask[perm].long(),
            index=[f"u{int(r) // g}" for r in perm],
            config=ALGORITHM,
        )
    got = torch.empty_like(adv)
    got[perm] = adv
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_missing_inputs_and_verl_settings_are_refused_with_what_to_set():
    fn = make_verl_estimator("erpo")
    rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    only_logp = advantage_fields({"old_log_probs": torch.zeros(2, 3)})
    with only_logp, pytest.raises(ValueError, match="entropy, ref_logp") as err:
        fn(token_level_rewards=rewards, response_mask=mask, index=["a", "a"], config=ALGORITHM)
    assert "use_kl_loss=true" in str(err.value) and "trainer_mode=tepo_sync" in str(err.value)
    with pytest.raises(ValueError, match="norm_adv_by_std_in_grpo=False is verl's setting"):
        estimator_options({"norm_adv_by_std_in_grpo": False}, "grpo")
    with pytest.raises(ValueError, match="exactly 0"):
        estimator_options({"tepo_advantage": {"progress_baseline": "old"}}, "erpo")
    assert tepo_estimator_name("tepo.erpo") == "erpo" and tepo_estimator_name("grpo") is None
