"""The trainer's update phase (``update_policy``) gives the same parameter update whatever the micro-batch size:
for the covariance losses (their statistics span the optimizer mini-batch), and with off-policy correction
weights, computed before the update or per micro-batch."""

from __future__ import annotations

import pytest
import torch

from tepo.losses.rollout_correction import rollout_correction_weights
from tepo.training.logprob_pass import batch_logprobs
from tepo.training.plan import RolloutCorrection
from update_runs import GROUPS
from update_runs import logprob_settings as _settings
from update_runs import updated_params as _updated
from update_runs import with_sampler_logp as _with_sampler_logp


@pytest.mark.parametrize(
    ("loss", "options"),
    [
        # Wide bands and 10-30% shares: many selected tokens, so per-micro-batch statistics would show.
        ("clip_cov", {"clip_cov_ratio": 0.3, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}),
        ("kl_cov", {"kl_cov_ratio": 0.1}),
        ("cov_gauss", {}),
    ],
)
@pytest.mark.parametrize("mini_groups", [GROUPS, GROUPS // 2])
def test_covariance_losses_update_the_same_for_every_micro_batch_size(
    model, batch, loss, options, mini_groups
):
    # As the trainer runs these losses: with old log-probs from a pass before the update.
    # The old policy is the current one shifted by +-0.25 nats per token: ratios clearly away from 1, so that
    # kl_cov's |logp - old_logp| has a definite sign (at ratio 1 its gradient would be float-rounding noise).
    old_logp = batch_logprobs(model, batch, _settings(32), entropy=False).logp
    signs = torch.sign(torch.randn(old_logp.shape, generator=torch.Generator().manual_seed(2)))
    old_logp = (old_logp + 0.25 * signs) * batch.response_mask
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    whole = _updated(model, batch, loss, 32, loss_options=options, mini_groups=mini_groups, old_logp=old_logp)
    assert not torch.allclose(whole, start), "the update changed nothing: the comparison would be vacuous"
    for micro in (4, 8):
        got = _updated(
            model, batch, loss, micro, loss_options=options, mini_groups=mini_groups, old_logp=old_logp
        )
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6, msg=f"{loss}: micro-batch {micro}")


@pytest.mark.parametrize("mode", ["tis", "seq_tis"])
def test_correction_in_the_micro_batch_loop_equals_precomputed_weights_for_every_size(model, batch, mode):
    batch = _with_sampler_logp(batch, model)
    old_logp = batch_logprobs(model, batch, _settings(32), entropy=False).logp
    weights, keep, _ = rollout_correction_weights(
        old_logp, batch.rollout_logp, batch.response_mask, mode=mode
    )
    assert bool(keep[batch.response_mask.bool()].all()), "tis modes drop nothing"
    reference = _updated(model, batch, "tepo", 32, is_weights=weights)
    plain = _updated(model, batch, "tepo", 32)
    assert not torch.allclose(reference, plain), (
        "the weights changed nothing: the comparison would be vacuous"
    )
    for micro in (4, 8, 32):
        got = _updated(model, batch, "tepo", micro, correction=RolloutCorrection(mode, {}))
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-6, msg=f"{mode}: micro-batch {micro}")


@pytest.mark.parametrize("loss", ["tepo", "grpo", "dr_grpo"])
def test_dropping_correction_leaves_the_counts_and_is_micro_batch_invariant(model, batch, loss):
    batch = _with_sampler_logp(batch, model)
    old_logp = batch_logprobs(model, batch, _settings(32), entropy=False).logp
    weights, keep, _ = rollout_correction_weights(
        old_logp, batch.rollout_logp, batch.response_mask, mode="mis"
    )
    loss_mask = batch.response_mask * keep
    assert 0 < int(loss_mask.sum()) < int(batch.response_mask.sum()), "mis must drop some tokens here"
    whole = _updated(model, batch, loss, 32, old_logp=old_logp, is_weights=weights, loss_mask=loss_mask)
    for micro in (4, 8):
        got = _updated(model, batch, loss, micro, old_logp=old_logp, is_weights=weights, loss_mask=loss_mask)
        torch.testing.assert_close(got, whole, rtol=1e-5, atol=1e-6)
