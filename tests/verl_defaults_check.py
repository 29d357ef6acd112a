"""verl 0.9.1 builtins against tepo's losses of the same name: which verl defaults change the reading.

Run inside ``.venv-verl`` by tests/integrations/test_integration_verl_engine.py (no model, synthetic [8, 9] tensors, ratios
spread wide enough to reach verl's dual clip). For each pair, verl's builtin with verl's defaults differs from
ours, and with the documented settings equals ours in value and gradient (docs/integrations.md, "verl defaults
that change tepo's reading"):

- ``vanilla`` vs ``dapo`` (eps 0.2 / 0.2): verl's dual clip (``clip_ratio_c=3.0``) caps ``-A*r`` at ``-3A`` for
  A < 0; ``clip_ratio_c=1e9`` turns it off.
- ``cispo`` vs ``tepo.cispo``: verl clips the IS weight on both sides (``clip_ratio_low=clip_ratio_high=0.2``);
  ours has no lower clip and eps_high 0.28: ``clip_ratio_low=1.0`` (a lower bound of 0), ``clip_ratio_high=0.28``.
- ``gspo`` vs ``tepo.gspo``: verl aggregates with ``actor.loss_agg_mode`` (token-mean) and clips at 0.2; the
  paper (and ours) is seq-mean-token-mean with eps 3e-4 / 4e-4.
- our registered losses also take ``actor.loss_agg_mode``, not the loss's own default: ``loss_mode=grpo`` under
  verl's default is token-mean, not tepo's seq-mean-token-mean, until ``loss_agg_mode`` (or ``policy_loss.agg``)
  is set.

Prints one JSON line.
"""

from __future__ import annotations

import json

import torch
import verl  # noqa: F401  (loads tepo's plugin)
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass

from tepo.losses import compute_policy_loss

N, T = 8, 9
gen = torch.Generator().manual_seed(0)
mask = torch.ones(N, T, dtype=torch.bool)
for i, length in enumerate([9, 5, 3, 7, 1, 4, 8, 6]):
    mask[i, length:] = False
base = -torch.rand(N, T, generator=gen) * 3
old = base + 1.5 * torch.randn(N, T, generator=gen)  # wide: some ratios above 3 (dual clip) and below 0.8
adv = torch.tensor([1.0, -0.8, 0.5, -1.2, 0.9, -0.3, 0.7, -1.0]).unsqueeze(-1).expand(N, T).contiguous()


def actor(agg="token-mean", policy_loss=None, **verl_fields):
    pl = {
        "_target_": "tepo.integrations.verl.TepoPolicyLossConfig",
        "loss_mode": "vanilla",
        **(policy_loss or {}),
    }
    node = {
        "_target_": "verl.workers.config.FSDPActorConfig",
        "strategy": "fsdp",
        "rollout_n": 1,
        "ppo_micro_batch_size_per_gpu": 1,
        "loss_agg_mode": agg,
        "policy_loss": pl,
        **verl_fields,
    }
    return omega_conf_to_dataclass(OmegaConf.create(node))


def verl_call(mode, cfg):
    logp = base.clone().requires_grad_(True)
    loss, _ = get_policy_loss_fn(mode)(
        old_log_prob=old,
        log_prob=logp,
        advantages=adv,
        response_mask=mask,
        loss_agg_mode=cfg.loss_agg_mode,
        config=cfg,
        rollout_is_weights=None,
    )
    loss.backward()
    return loss.detach(), logp.grad


def ours(name, **options):
    logp = base.clone().requires_grad_(True)
    loss, _ = compute_policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, **options)
    loss.backward()
    return loss.detach(), logp.grad


def same(a, b):
    return torch.allclose(a[0], b[0], rtol=1e-6, atol=1e-7) and torch.allclose(
        a[1], b[1], rtol=1e-6, atol=1e-7
    )


ratio = torch.exp(base - old)[mask]
result = {"ratios_above_3_with_negative_adv": int(((torch.exp(base - old) > 3) & (adv < 0) & mask).sum())}
assert result["ratios_above_3_with_negative_adv"] > 0 and (ratio < 0.8).any()

dapo = ours("dapo", eps=0.2, agg="token-mean")
result["vanilla_default_equals_dapo"] = same(verl_call("vanilla", actor()), dapo)
result["vanilla_no_dual_clip_equals_dapo"] = same(verl_call("vanilla", actor(clip_ratio_c=1e9)), dapo)

cispo = ours("cispo", agg="token-mean")
result["cispo_default_equals_ours"] = same(verl_call("cispo", actor()), cispo)
result["cispo_set_equals_ours"] = same(
    verl_call("cispo", actor(clip_ratio_low=1.0, clip_ratio_high=0.28)), cispo
)

gspo = ours("gspo")  # its own defaults: seq-mean-token-mean, eps 3e-4 / 4e-4
result["gspo_default_equals_ours"] = same(verl_call("gspo", actor()), gspo)
result["gspo_set_equals_ours"] = same(
    verl_call("gspo", actor(agg="seq-mean-token-mean", clip_ratio_low=3e-4, clip_ratio_high=4e-4)), gspo
)

# our own registered loss: verl's loss_agg_mode wins over the loss's default aggregation
grpo = ours("grpo")  # tepo's default: seq-mean-token-mean
result["our_grpo_under_verl_default_agg_equals_tepo_grpo"] = same(
    verl_call("grpo", actor(policy_loss={"loss_mode": "grpo"})), grpo
)
result["our_grpo_with_agg_set_equals_tepo_grpo"] = same(
    verl_call("grpo", actor(agg="seq-mean-token-mean", policy_loss={"loss_mode": "grpo"})), grpo
)
print(json.dumps(result))
