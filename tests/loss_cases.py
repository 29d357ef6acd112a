"""The loss tests' shared inputs (tests/losses/): a hand-checkable batch and a random mini-batch.

The hand batch (float64): N=3 responses, T=3, row 1 padded by one token and row 2 a one-token response; padded
positions hold NaN. Token log-ratios d = logp - old and advantages A were chosen so that, with eps 0.2/0.2, each
case of the PPO clip appears:

    row 0, A=+1:  d =  0.1 (r=1.105, inside)   d = -0.3 (r=0.741, below but A>0: unclipped)   d = 0.3 (r=1.350: clipped)
    row 1, A=-2:  d = -0.5 (r=0.607: clipped)  d = 0.25 (r=1.284, above but A<0: unclipped)
    row 2, A=+0.5: d = 0.5 (r=1.649: clipped)
"""

from __future__ import annotations

import math

import torch

from tepo.losses import POLICY_LOSSES, compute_policy_loss, mini_batch_stats

E = math.exp
NAN = float("nan")
OLD = [[-1.0, -2.0, -0.5], [-1.5, -0.7], [-0.3]]
D = [[0.1, -0.3, 0.3], [-0.5, 0.25], [0.5]]
ADV = [1.0, -2.0, 0.5]
LOGP = [[o + d for o, d in zip(orow, drow)] for orow, drow in zip(OLD, D)]
LENS = [3, 2, 1]
T_TOT = 6
N = 3


def pad(rows, fill=NAN):
    """Ragged rows of at most 3 values as a float64 [len(rows), 3] tensor, ``fill`` after each row's end."""
    return torch.tensor([row + [fill] * (3 - len(row)) for row in rows], dtype=torch.float64)


def batch():
    """The hand batch as ``compute_policy_loss`` keywords; ``logp`` requires grad."""
    logp = pad(LOGP).requires_grad_(True)
    return {
        "logp": logp,
        "old_logp": pad(OLD),
        "advantages": torch.tensor(ADV, dtype=torch.float64),
        "mask": torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]]),
    }


def run(name, **options):
    """Loss ``name`` on the hand batch: value, gradient w.r.t. logp, metrics."""
    inputs = batch()
    loss, metrics = compute_policy_loss(name, **inputs, **options)
    loss.backward()
    return loss.item(), inputs["logp"].grad, metrics


def assert_grad(grad, expected_rows):
    expected = pad(expected_rows, fill=0.0)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-12)


def seq_mean_token_mean(rows):
    return sum(sum(r) / len(r) for r in rows) / N


def token_mean(rows):
    return sum(sum(r) for r in rows) / T_TOT


def random_mini_batch(n=64, width=12, seed=0):
    """``n`` float64 rows of random lengths 0..``width`` (empty rows included): logp, old_logp, advantages, mask."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (n,), generator=gen)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    old = -torch.rand(n, width, generator=gen, dtype=torch.float64) * 3
    logp = old + 0.25 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask}


def loss_on_rows(name, batch, rows, cols=slice(None), *, extra: dict | None = None, **options):
    """Loss ``name`` on ``rows`` (and token columns ``cols``) of a `random_mini_batch`, with the per-token tensors
    of ``extra`` (``entropy``, ``rollout_logp`` ...) sliced alike: value, gradient w.r.t. those rows' logp,
    metrics."""
    logp = batch["logp"][rows][:, cols].clone().requires_grad_(True)
    loss, metrics = compute_policy_loss(
        name,
        logp=logp,
        old_logp=batch["old_logp"][rows][:, cols],
        advantages=batch["advantages"][rows],
        mask=batch["mask"][rows][:, cols],
        **{key: value[rows][:, cols] for key, value in (extra or {}).items()},
        **options,
    )
    loss.backward()
    return loss.detach(), logp.grad, metrics


def random_loss_inputs(gen, mask) -> dict:
    """Float64 ``compute_policy_loss`` inputs for the rows of ``mask``, drawn from ``gen`` in this order: old_logp,
    logp (old + 0.3 noise), ref_logp (old + 0.2 noise), entropy and old_entropy in [0, 2), advantages."""
    n, width = mask.shape
    old = -torch.rand(n, width, generator=gen, dtype=torch.float64) * 3
    return {
        "logp": old + 0.3 * torch.randn(n, width, generator=gen, dtype=torch.float64),
        "old_logp": old,
        "ref_logp": old + 0.2 * torch.randn(n, width, generator=gen, dtype=torch.float64),
        "entropy": torch.rand(n, width, generator=gen, dtype=torch.float64) * 2,
        "old_entropy": torch.rand(n, width, generator=gen, dtype=torch.float64) * 2,
        "advantages": torch.randn(n, generator=gen, dtype=torch.float64),
        "mask": mask,
    }


def stats_of(name, batch, *extra, **options):
    """``mini_batch_stats`` of loss ``name`` on the whole ``batch``: its logp, old_logp, advantages, mask and the
    keys named in ``extra``."""
    keys = ("logp", "old_logp", "advantages", "mask", *extra)
    return mini_batch_stats(name, **{key: batch[key] for key in keys}, **options)


def metric_loss_inputs(n: int = 4, t: int = 5) -> dict:
    """A float32 batch with every optional tensor a loss may read (reference, entropies, sampler log-probs)."""
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(n, t, generator=g) - 0.1
    return {
        "logp": logp.clone().requires_grad_(True),
        "old_logp": logp + 0.05 * torch.randn(n, t, generator=g),
        "advantages": torch.randn(n, generator=g),
        "mask": torch.ones(n, t),
        "ref_logp": logp + 0.1,
        "entropy": torch.rand(n, t, generator=g),
        "old_entropy": torch.rand(n, t, generator=g),
        "rollout_logp": logp - 0.02,
    }


def registered_loss_metrics(name: str) -> dict:
    """The metrics loss ``name`` returns with its regularizers on (entropy, KL, and TEPO v2's mask where the loss
    takes it): every metric name a run with that loss can log from the loss."""
    spec = POLICY_LOSSES[name]
    inputs = metric_loss_inputs()
    options = {"entropy_coef": 0.01, "kl_coef": 0.01}
    if spec.needs_batch_stats:
        kept = ("logp", "old_logp", "advantages", "mask", "entropy", "rollout_logp")
        options["batch_stats"] = mini_batch_stats(name, **{k: inputs[k] for k in kept})
    try:
        _, metrics = compute_policy_loss(name, **inputs, tepo_kl_mask_coef=0.1, **options)
    except ValueError:  # the KL mask applies to some losses only
        _, metrics = compute_policy_loss(name, **inputs, **options)
    return metrics
