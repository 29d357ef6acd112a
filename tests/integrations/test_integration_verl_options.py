"""The verl plugin with the 2026 losses and options, and verl's ``rollout_log_probs`` as our ``rollout_logp``
(issue #25 item 1), in verl 0.9.1's real package.

`CHECK_SCRIPT` runs in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py;
slow-marked like it), at float64:

1. Options: each new option set in verl's policy-loss config (through verl's own Hydra conversion to
   `TepoPolicyLossConfig`) reaches the registry: the registered loss equals ``compute_policy_loss(name,
   **options)`` and differs from the loss's defaults on the same tensors (so a dropped option fails). An option
   where it does not apply (``dual_clip`` on ``tepo``) is refused when the config is built.
2. ``rollout_log_probs``: verl's actor loss path (``left_right_2_no_padding``, then `tepo_ppo_loss` around verl's
   ``ppo_loss``, whose registered-loss call does not pass them) hands the batch's ``rollout_log_probs`` to our loss
   as ``rollout_logp``: equal value and gradient to ``compute_policy_loss(..., rollout_logp=mu)`` for
   ``dppo_tv``'s mask, ``off_policy_mask`` and ``m2po_threshold``, and different from a call without them. A
   direct ``rollout_log_probs=`` keyword (a caller that passes them) is used too. verl's plain ``ppo_loss``
   cannot pass them: there the loss is the one without ``rollout_logp`` (asserted, so a verl that starts passing
   them makes this test say so).
3. ``top_entropy_quantile`` through `tepo_ppo_loss` takes the forward's entropies; through verl's plain
   ``ppo_loss`` it is refused with a message naming `tepo_ppo_loss`.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

CHECK_SCRIPT = textwrap.dedent(
    r"""
    import verl  # noqa: F401  (loads tepo's plugin)
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding
    from tepo.integrations.verl import tepo_ppo_loss
    from tepo.losses import compute_policy_loss

    gen = torch.Generator().manual_seed(0)
    B, P, R = 5, 3, 6
    prompt_lens, resp_lens = [3, 2, 1, 3, 2], [6, 4, 2, 5, 3]
    attn = torch.zeros(B, P + R, dtype=torch.long)
    for i in range(B):
        attn[i, P - prompt_lens[i]:P + resp_lens[i]] = 1
    input_ids = torch.randint(1, 100, (B, P + R), generator=gen) * attn
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    mask = attn[:, P:].clone()
    maskb = mask.bool()
    base = (-torch.rand(B, R, generator=gen, dtype=F64) * 1.5) * mask
    old = (base + 0.5 * torch.randn(B, R, generator=gen, dtype=F64)).clamp(max=-0.01) * mask
    mu = (old + 0.6 * torch.randn(B, R, generator=gen, dtype=F64)).clamp(max=-0.01) * mask  # the sampler
    ent = (torch.rand(B, R, generator=gen, dtype=F64) * 2) * mask
    adv = torch.tensor([1.0, -0.8, 0.6, -1.2, 0.4], dtype=F64).unsqueeze(-1).expand(B, R) * mask

    def actor_config(policy_loss, agg="token-mean"):
        pl = {"_target_": "tepo.integrations.verl.TepoPolicyLossConfig", **policy_loss}
        return omega_conf_to_dataclass(OmegaConf.create({"_target_": "verl.workers.config.FSDPActorConfig",
            "strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": B, "loss_agg_mode": agg,
            "policy_loss": pl}))

    def ours(name, options, rollout_logp=None, entropy=None, agg="token-mean"):
        logp = base.clone().requires_grad_(True)
        loss, _ = compute_policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=maskb,
                                      rollout_logp=rollout_logp, entropy=entropy, **{"agg": agg, **options})
        loss.backward()
        return loss.detach(), logp.grad

    def registered(mode, options, **kw):
        cfg = actor_config({"loss_mode": mode, **options})
        cfg.global_batch_info.update({"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": B})
        logp = base.clone().requires_grad_(True)
        loss, _ = get_policy_loss_fn(mode)(old_log_prob=old, log_prob=logp, advantages=adv, response_mask=maskb,
                                           loss_agg_mode="token-mean", config=cfg, rollout_is_weights=None, **kw)
        loss.backward()
        return loss.detach(), logp.grad

    def close(a, b):  # value and gradient
        torch.testing.assert_close(a[0], b[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(a[1], b[1], rtol=1e-12, atol=1e-14)

    def differs(a, b):
        return not (torch.allclose(a[0], b[0]) and torch.allclose(a[1], b[1]))

    report = {"options": {}, "rollout_logp": {}, "errors": {}}
    # ---- 1. options reach the registry ----
    OPTION_CASES = [
        ("tepo.sapo", {"tau_pos": 2.0, "tau_neg": 3.0}),
        ("vespo", {"k_pos": 1.0, "lam_pos": 1.5, "k_neg": 2.0, "lam_neg": 1.0}),
        ("tepo.dppo_tv", {"delta_low": 0.02, "delta_high": 0.03}),  # bare dppo_tv / dppo_kl are verl's builtins
        ("tepo.dppo_kl", {"delta": 0.005}),
        ("grpo", {"dual_clip": 1.5}),
        ("tepo.cispo", {"eps_low": 0.1}),
        ("luspo", {"eps": 0.05}),
        ("tepo_token", {"eps": 0.05}),
        ("gspo_token", {"eps": 0.05}),
        ("tepo", {"off_policy_mask": 0.05}),
        ("dapo", {"m2po_threshold": 0.05}),
    ]
    for mode, options in OPTION_CASES:
        name = mode.removeprefix("tepo.")
        got = registered(mode, options)
        want = ours(name, options)
        close(got, want)
        assert differs(want, ours(name, {})), f"{mode}: {options} changed nothing"
        report["options"][mode] = float(got[0])

    # ---- 2. rollout_log_probs through verl's actor loss path ----
    def batch(**extra):
        td = TensorDict({"prompts": input_ids[:, :P], "responses": input_ids[:, P:],
                         "input_ids": input_ids.clone(), "attention_mask": attn, "position_ids": position_ids,
                         "response_mask": mask, "old_log_probs": old, "advantages": adv, **extra}, batch_size=[B])
        td = left_right_2_no_padding(td)  # verl's driver-side conversion before update_actor
        tu.assign_non_tensor(td, global_batch_size=B, batch_num_tokens=int(mask.sum()), dp_size=1)
        return td

    def nested(resp):
        # the actor forward's layout: one value per kept position, response token k of row i at P - 1 + k
        full = torch.cat([torch.zeros(B, P - 1, dtype=F64), resp, torch.zeros(B, 1, dtype=F64)], 1)
        keep = attn.bool()
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), attn.sum(1).cumsum(0)])
        return torch.nested.nested_tensor_from_jagged(full[keep], offsets=offsets)

    def through_actor(loss_fn, policy_loss, td):
        logp = base.clone().requires_grad_(True)
        loss, _ = loss_fn(actor_config(policy_loss), {"log_probs": nested(logp), "entropy": nested(ent)}, td)
        loss.backward()
        return loss.detach(), logp.grad

    ROLLOUT_CASES = [
        ("tepo.dppo_tv", {}),
        ("tepo.dppo_kl", {"delta": 0.01}),
        ("tepo", {"off_policy_mask": 0.05}),
        ("dapo", {"m2po_threshold": 0.05}),
    ]
    for mode, options in ROLLOUT_CASES:
        name = mode.removeprefix("tepo.")
        with_mu, without = ours(name, options, rollout_logp=mu), ours(name, options)
        assert differs(with_mu, without), f"{mode}: rollout_logp changed nothing"
        close(through_actor(tepo_ppo_loss, {"loss_mode": mode, **options}, batch(rollout_log_probs=mu)), with_mu)
        close(registered(mode, options, rollout_log_probs=mu), with_mu)
        # verl's own ppo_loss drops them on the way to a registered loss (the field is in the batch)
        close(through_actor(ppo_loss, {"loss_mode": mode, **options}, batch(rollout_log_probs=mu)), without)
        # no rollout_log_probs in the batch (rollout.calculate_log_probs=False): pi_old is the behaviour policy
        close(through_actor(tepo_ppo_loss, {"loss_mode": mode, **options}, batch()), without)
        report["rollout_logp"][name] = [float(with_mu[0]), float(without[0])]

    # ---- 3. top_entropy_quantile needs the forward's entropies ----
    q = {"loss_mode": "tepo", "top_entropy_quantile": 0.5}
    want = ours("tepo", {"top_entropy_quantile": 0.5}, entropy=ent)
    close(through_actor(tepo_ppo_loss, q, batch()), want)
    assert differs(want, ours("tepo", {}))
    report["options"]["tepo+top_entropy_quantile"] = float(want[0])
    try:
        through_actor(ppo_loss, q, batch())
    except ValueError as exc:
        report["errors"]["top_entropy_quantile"] = str(exc)
    else:
        raise AssertionError("top_entropy_quantile ran without entropies")
    try:
        actor_config({"loss_mode": "tepo", "dual_clip": 3.0})
    except Exception as exc:  # hydra wraps the ValueError of __post_init__
        report["errors"]["dual_clip"] = str(exc)
    else:
        raise AssertionError("dual_clip accepted on tepo")
    print(json.dumps(report))
    """
)


def test_verl_plugin_new_options_and_rollout_log_probs(verl_python, tmp_path):
    script = SCRIPT_PRELUDE + CHECK_SCRIPT
    report = run_verl_script(verl_python, tmp_path, script, name="check_verl_options.py")
    assert len(report["options"]) == 12
    assert set(report["rollout_logp"]) == {"dppo_tv", "dppo_kl", "tepo", "dapo"}
    assert "tepo_ppo_loss" in report["errors"]["top_entropy_quantile"]
    assert "calculate_entropy" in report["errors"]["top_entropy_quantile"]
    assert "not an option of loss 'tepo'" in report["errors"]["dual_clip"]
