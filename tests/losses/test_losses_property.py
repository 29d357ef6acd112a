"""Property test: for every loss, on random shapes, masks and values, the loss is finite and the gradient is
exactly zero wherever the mask is zero (padding holds NaN), whatever the aggregation mode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tepo.losses import AGG_MODES, compute_policy_loss, list_policy_losses


@st.composite
def batches(draw):
    n = draw(st.integers(1, 4))
    width = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    mask = torch.from_numpy(rng.random((n, width)) < draw(st.floats(0.0, 1.0)))
    old = torch.from_numpy(-rng.random((n, width)) * 6)
    logp = old + torch.from_numpy(rng.normal(0, draw(st.sampled_from([0.01, 0.3, 2.0])), (n, width)))
    adv_shape = (n, width) if draw(st.booleans()) else (n,)
    adv = torch.from_numpy(rng.normal(0, 1.5, adv_shape))
    entropy = torch.from_numpy(rng.random((n, width)) * 3)
    old_entropy = torch.from_numpy(rng.random((n, width)) * 3)
    ref = old + torch.from_numpy(rng.normal(0, 0.5, (n, width)))
    for tensor in (logp, old, entropy, old_entropy, ref):
        tensor[~mask] = float("nan")
    return {
        "logp": logp,
        "old_logp": old,
        "ref_logp": ref,
        "entropy": entropy,
        "old_entropy": old_entropy,
        "advantages": adv,
        "mask": mask,
    }


@pytest.mark.parametrize("name", list_policy_losses())
@settings(max_examples=40, deadline=None)
@given(batch=batches(), agg=st.sampled_from(AGG_MODES), regularize=st.booleans())
def test_loss_finite_and_no_gradient_through_padding(name, batch, agg, regularize):
    logp = batch.pop("logp").requires_grad_(True)
    options = {"agg": agg}
    if regularize:
        options.update(entropy_coef=0.01, kl_coef=0.1, tepo_kl_mask_coef=0.5)
    if name == "clip_cov":
        options.update(seed=0, clip_cov_lb=-1.0, clip_cov_ub=1.0, clip_cov_ratio=0.5)
    loss, metrics = compute_policy_loss(name, logp=logp, **batch, **options)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    mask = batch["mask"]
    assert torch.all(logp.grad[~mask] == 0)
    assert torch.all(torch.isfinite(logp.grad[mask]))
    assert all(np.isfinite(v) for v in metrics.values())
