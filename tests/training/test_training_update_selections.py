"""The trainer's update phase with the 2026 options: the batch-wide token selections (top_entropy_quantile,
m2po_threshold) give the same parameter update whatever the micro-batch size, and the sampler's log-probs
(``batch.rollout_logp``) reach the loss as its behaviour policy."""

from __future__ import annotations

import pytest
import torch

from tepo.training.logprob_pass import batch_logprobs
from update_runs import GROUPS
from update_runs import logprob_settings as _settings
from update_runs import updated_params as _updated
from update_runs import with_sampler_logp as _with_sampler_logp


@pytest.mark.parametrize(
    ("loss", "options", "with_old"),
    [
        # Without old log-probs the mini-batch statistics come from a no-grad pass (entropy included).
        ("tepo", {"top_entropy_quantile": 0.3}, False),
        pytest.param("tepo", {"top_entropy_quantile": 0.3}, True, marks=pytest.mark.slow),
        pytest.param("dapo", {"m2po_threshold": 0.05}, False, marks=pytest.mark.slow),
        ("kl_cov", {"kl_cov_ratio": 0.1, "top_entropy_quantile": 0.5, "m2po_threshold": 0.1}, True),
        pytest.param(
            "grpo", {"off_policy_mask": -0.5, "dual_clip": 1.5, "eps": 0.05}, True, marks=pytest.mark.slow
        ),
    ],
)
def test_token_selections_update_the_same_for_every_micro_batch_size(model, batch, loss, options, with_old):
    batch = _with_sampler_logp(batch, model)
    old_logp = None
    if with_old:  # as after a pre-update pass: the old policy shifted off ratio 1
        old_logp = batch_logprobs(model, batch, _settings(32), entropy=False).logp
        signs = torch.sign(torch.randn(old_logp.shape, generator=torch.Generator().manual_seed(3)))
        old_logp = (old_logp + 0.2 * signs) * batch.response_mask
    plain = {k: v for k, v in options.items() if k in ("kl_cov_ratio", "eps")}
    kwargs = {"mini_groups": GROUPS // 2, "old_logp": old_logp}
    whole = _updated(model, batch, loss, 32, loss_options=options, **kwargs)
    assert not torch.allclose(whole, _updated(model, batch, loss, 32, loss_options=plain, **kwargs)), (
        "the options changed nothing: the comparison would be vacuous"
    )
    for micro in (4, 12):
        got = _updated(model, batch, loss, micro, loss_options=options, **kwargs)
        torch.testing.assert_close(
            got, whole, rtol=1e-5, atol=1e-6, msg=f"{loss} {options}: micro-batch {micro}"
        )


def test_rollout_logp_reaches_the_loss_as_behaviour(model, batch):
    # dppo_tv's mask reads the sampler's probabilities: a sampler far from the trainer masks tokens, so the
    # update differs from the one without rollout_logp (where behaviour = old = the current policy: nothing masked).
    # _with_sampler_logp shifts the sampler up on the later (positive-advantage) rows, where q > p keeps every
    # token: mirror the shift so both masks have tokens to catch.
    sampled = _with_sampler_logp(batch, model)
    trainer_logp = batch_logprobs(model, batch, _settings(32), entropy=False).logp
    sampled.rollout_logp = (2 * trainer_logp - sampled.rollout_logp) * batch.response_mask
    # The tiny model's token probabilities are ~1/97, so the sampler's shift of up to 1 nat moves p - q by ~0.01.
    options = {"delta_low": 1e-4, "delta_high": 1e-4}
    with_sampler = _updated(model, sampled, "dppo_tv", 8, loss_options=options)
    without = _updated(model, batch, "dppo_tv", 8, loss_options=options)
    unmasked = _updated(model, batch, "grpo", 8, loss_options={"agg": "token-mean", "eps": 10.0})
    torch.testing.assert_close(without, unmasked, rtol=1e-6, atol=1e-8)
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert (with_sampler - without).abs().max() > 1e-2 * (without - start).abs().max()
