"""tepo's own ``top_entropy_quantile`` and ``entropy_coef`` against TRL 1.16's real code (issue #36 item 5).

The adapter cases in tests/integrations/test_integration_trl_config.py show that ``TepoGRPOTrainer`` reproduces TRL; these
show that tepo's *own* code does, so they fail when tepo's equation changes:

- ``top_entropy_quantile``: tepo's `entropy_threshold` (the (1 - rho) quantile by a float64 sort, linear
  interpolation) against TRL's ``GRPOTrainer.get_high_entropy_mask`` (``torch.quantile`` of the entropies cast to
  float32), called unmodified; and ``compute_policy_loss("dapo", top_entropy_quantile=rho)`` against TRL's whole
  ``GRPOTrainer._compute_loss`` (``loss_type="dapo"``). The two thresholds differ by float32 rounding only: at
  most a few float32 ulps of the largest entropy (``|t32 - t64| <= 4 * 2^-24 * max H``, about 2.4e-7 relative;
  asserted), so the kept sets are equal unless a token's entropy lies between the two thresholds. That happens
  when the quantile is itself a token's entropy (``(1 - rho) * (n - 1)`` an integer): TRL then keeps or drops
  that token as float32 rounds its entropy down or up, and keeps a token just below it when the rounding goes
  down; built and asserted on hand batches and seen on a random one.
- ``entropy_coef``: tepo's option under ``token-mean`` (``-coef * sum(m*H) / T_tot``) against TRL's bonus
  (``-coef * sum(m*H) / sum(m)`` per micro-batch, / GA) inside TRL's ``_compute_loss`` with ``loss_type="dapo"``
  (one micro-batch per window, where TRL's dapo count is the micro-batch's): value and gradient with respect to
  the log-probs and the entropies equal at float64. (TRL restricts its bonus to the tokens its entropy quantile
  keeps; tepo's bonus, a regularizer, is not restricted: docs/parity.md.)
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer

from tepo.losses import compute_policy_loss
from tepo.losses.inputs import LossInputs
from tepo.losses.token_selection import entropy_threshold
from trl_runner import F64, float64_batch, run_loss


def _tepo_threshold(entropy: torch.Tensor, mask: torch.Tensor, rho: float) -> float:
    zeros = torch.zeros_like(entropy)
    inputs = LossInputs(
        logp=zeros,
        old_logp=zeros,
        ref_logp=None,
        advantages=zeros,
        mask=mask.bool(),
        entropy=entropy,
        old_entropy=None,
        num_tokens=1.0,
        num_seqs=1.0,
        max_len=1.0,
    )
    return entropy_threshold(inputs, rho)


def _dapo(b, logp, **options):
    """tepo's ``dapo`` on the float64 batch ``b`` at ``logp``: (loss, metrics)."""
    mask = b["mask"].bool()
    return compute_policy_loss(
        "dapo", logp=logp, old_logp=b["old"], advantages=b["adv"], mask=mask, **options
    )


def _trl_keep(trainer, entropy, mask, rho):
    return GRPOTrainer.get_high_entropy_mask(trainer, entropy, mask, 1.0 - rho)


@pytest.mark.parametrize("rho", [0.2, 0.5, 0.8])
def test_tepo_entropy_threshold_keeps_what_trls_get_high_entropy_mask_keeps(build_trl_trainer, rho):
    """Equal kept sets except on a token whose entropy lies between the float32 and float64 thresholds: with an
    odd number of valid tokens and rho = 0.5 the quantile *is* one token's entropy, and TRL drops that token when
    float32 rounds its entropy up (asserted to happen on this batch, on that one token only)."""
    trainer = build_trl_trainer()
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 40, (16,), generator=gen)
    mask = (torch.arange(40).unsqueeze(0) < lengths.unsqueeze(1)).long()
    entropy = torch.rand(16, 40, generator=gen, dtype=F64) * 3
    valid = mask.bool()
    t64 = _tepo_threshold(entropy, mask, rho)
    t32 = float(torch.quantile(entropy[valid].float(), 1.0 - rho))
    assert abs(t64 - t32) <= 4 * 2.0**-24 * float(entropy[valid].max())
    ours = valid & (entropy >= t64)
    theirs = _trl_keep(trainer, entropy, mask, rho)
    assert 0 < int(ours.sum()) < int(valid.sum())
    between = valid & (entropy >= min(t64, t32)) & (entropy <= max(t64, t32))
    differ = ours != theirs
    assert not bool((differ & ~between).any())
    pos = (1.0 - rho) * (int(valid.sum()) - 1)
    if (
        rho == 0.5 and pos == int(pos) and t32 > t64
    ):  # the quantile is a token's entropy, rounded up in float32
        assert int(differ.sum()) == 1 and bool((ours & ~theirs).any())
    else:
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    ("low", "middle", "tepo_keeps", "trl_keeps"),
    [
        (1.0, 1.0 + 1e-10, 3, 4),  # float32(middle) = 1.0 < middle: TRL also keeps the token at 1.0
        (
            0.7,
            1.0 - 1e-10,
            3,
            2,
        ),  # float32(middle) = 1.0 > middle: TRL drops the token at the quantile itself
    ],
)
def test_the_float32_quantile_differs_only_by_rounding(build_trl_trainer, low, middle, tepo_keeps, trl_keeps):
    """rho = 0.5 over five tokens: the quantile is the middle token's entropy. tepo's float64 threshold is that
    value; TRL's is its float32 rounding, 1.0, so a token at 1.0 or the middle token itself falls on the other
    side. The difference is float32 rounding of the entropies, nothing else."""
    entropy = torch.tensor([[0.5, low, middle, 1.5, 2.0]], dtype=F64)
    mask = torch.ones_like(entropy, dtype=torch.long)
    t64 = _tepo_threshold(entropy, mask, 0.5)
    assert t64 == middle
    assert float(torch.quantile(entropy[0].float(), 0.5)) == 1.0
    assert int((entropy >= t64).sum()) == tepo_keeps
    assert int(_trl_keep(build_trl_trainer(), entropy, mask, 0.5).sum()) == trl_keeps


@pytest.mark.parametrize("rho", [0.3, 0.6])
def test_tepo_top_entropy_quantile_loss_equals_trls_compute_loss(build_trl_trainer, rho):
    trainer = build_trl_trainer(loss_type="dapo", epsilon_high=0.28, top_entropy_quantile=rho)
    b = float64_batch()
    trl_loss, trl_grad, _, _ = run_loss(trainer, GRPOTrainer._compute_loss, b)
    logp = b["logp"].clone().requires_grad_(True)
    ours, _ = _dapo(b, logp, entropy=b["entropy"], top_entropy_quantile=rho)
    ours.backward()
    torch.testing.assert_close(ours.detach(), trl_loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(logp.grad, trl_grad, rtol=1e-12, atol=1e-15)
    without = _dapo(b, b["logp"])[0]
    assert abs(float(without - ours)) > 1e-6  # the selection changes the loss on this batch


@pytest.mark.parametrize("coef", [0.05, -0.3])
def test_tepo_entropy_coef_under_token_mean_equals_trls_bonus(build_trl_trainer, coef):
    trainer = build_trl_trainer(loss_type="dapo", epsilon_high=0.28, entropy_coef=coef)
    b = float64_batch()
    trl_loss, trl_grad, trl_grad_h, _ = run_loss(trainer, GRPOTrainer._compute_loss, b)
    logp = b["logp"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    ours, _ = _dapo(b, logp, entropy=entropy, entropy_coef=coef)
    ours.backward()
    torch.testing.assert_close(ours.detach(), trl_loss, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(logp.grad, trl_grad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(entropy.grad, trl_grad_h, rtol=1e-12, atol=1e-15)
    assert bool(trl_grad_h.abs().gt(0).any())  # TRL's bonus is on: its entropy gradient is not zero
