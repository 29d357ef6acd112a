"""The rollout-correction tests' shared inputs (tests/losses/test_correction_weights.py and
test_correction_rejections.py): four rows of hand-chosen log-ratios, the weights of a mode on them, and a loss
that takes a correction's weights and kept tokens.

The rows (float64, width 4): log-ratios d = log pi_old - log pi_sampler on each row's valid tokens, the last row
empty; pi_old's log-probs are random, the sampler's are ``OLD - D`` on valid tokens and NaN on padding (it must
not matter).
"""

from __future__ import annotations

import math

import torch

from tepo.losses import compute_policy_loss, rollout_correction_weights

L = math.log
E = math.exp
NAN = float("nan")
# Log-ratios d = log pi_old - log pi_sampler on the valid tokens of four rows (the last one empty).
D_ROWS = [[L(3.0), L(0.4), 0.1, -0.2], [L(1.5), L(2.5)], [0.0005], []]
WIDTH = 4
MASK = torch.tensor([[len(row) > t for t in range(WIDTH)] for row in D_ROWS])
OLD = -torch.rand(4, WIDTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64) - 0.5
D = torch.tensor([row + [0.0] * (WIDTH - len(row)) for row in D_ROWS], dtype=torch.float64)
ROLLOUT = torch.where(MASK, OLD - D, torch.full_like(OLD, NAN))  # padding holds NaN: it must not matter
ADV = torch.tensor([1.0, -2.0, 0.5, 3.0], dtype=torch.float64)  # one advantage a row


def weights_of(mode, old=OLD, rollout=ROLLOUT, mask=MASK, **options):
    """``rollout_correction_weights`` of ``mode`` (weights, keep, metrics), on the four rows unless told."""
    return rollout_correction_weights(old, rollout, mask, mode=mode, **options)


def loss_on_kept(name, weights, keep, **options):
    """Loss ``name`` at pi_theta = pi_old (logp = OLD, advantages ADV) with a correction's ``weights`` as IS
    weights and its ``keep`` in the mask and the token count: the loss value and its gradient w.r.t. logp."""
    logp = OLD.clone().requires_grad_(True)
    loss, _ = compute_policy_loss(
        name,
        logp=logp,
        old_logp=OLD,
        advantages=ADV,
        mask=MASK & keep,
        is_weights=weights,
        num_tokens=int(keep.sum()),
        **options,
    )
    loss.backward()
    return loss.item(), logp.grad
