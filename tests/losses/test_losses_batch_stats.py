"""Mini-batch statistics for clip_cov, kl_cov and cov_gauss: computed once per optimizer mini-batch and sliced
to each micro-batch, they make the sum of the micro-batch gradients exactly the gradient of one call on the
mini-batch, including which tokens clip_cov detaches and kl_cov penalises (the share rule counts the
mini-batch's tokens, so "at least one token" means one per mini-batch, not one per micro-batch)."""

from __future__ import annotations

import pytest
import torch

from loss_cases import loss_on_rows, random_mini_batch, stats_of
from tepo.losses import POLICY_LOSSES, CovStats, mini_batch_stats

COV_LOSSES = ["clip_cov", "kl_cov", "cov_gauss"]
OPTIONS = {
    "clip_cov": {"clip_cov_ratio": 0.1, "clip_cov_lb": -0.4, "clip_cov_ub": 0.4, "seed": 7},
    "kl_cov": {"kl_cov_ratio": 0.05, "kl_cov_coef": 1.0},
    "cov_gauss": {},
}


def test_the_spec_says_which_losses_need_mini_batch_statistics():
    needing = sorted(name for name, spec in POLICY_LOSSES.items() if spec.needs_batch_stats)
    # The covariance losses, and three objectives of open PRs: stare's selection and gate, fipo's and dapo_zv's
    # token counts (tests/losses/test_losses_aggregation.py splits them into micro-batches).
    assert needing == sorted([*COV_LOSSES, "dapo_zv", "fipo", "stare"])
    batch = random_mini_batch(8)
    assert stats_of("tepo", batch, eps=0.2, agg="token-mean") is None


@pytest.mark.parametrize("name", COV_LOSSES)
@pytest.mark.parametrize("split", [4, 8, 32])
def test_micro_batches_with_mini_batch_stats_give_the_one_call_gradient(name, split):
    batch = random_mini_batch()
    n = batch["mask"].shape[0]
    counts = {"num_tokens": int(batch["mask"].sum()), "num_seqs": n}
    options = OPTIONS[name]
    # One call on the whole mini-batch, statistics computed inside it (no batch_stats).
    full_loss, full_grad, full_metrics = loss_on_rows(name, batch, slice(0, n), **counts, **options)
    stats = stats_of(name, batch, **options, **counts)
    parts = [
        loss_on_rows(
            name, batch, slice(s, s + split), batch_stats=stats.rows(slice(s, s + split)), **counts, **options
        )
        for s in range(0, n, split)
    ]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    assert full_grad.abs().sum() > 0
    # The chosen tokens are the one call's: same count (its metric is a share of its own valid tokens).
    key = {"clip_cov": "cov_clip_frac", "kl_cov": "kl_cov_frac"}.get(name)
    if key is not None:
        valid = [int(batch["mask"][s : s + split].sum()) for s in range(0, n, split)]
        chosen = sum(round(p[2][key] * v) for p, v in zip(parts, valid))
        n_valid = int(batch["mask"].sum())
        assert chosen == round(full_metrics[key] * n_valid) == max(1, int(options[f"{name}_ratio"] * n_valid))
        assert int(stats.selected.sum()) == chosen


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_at_least_one_token_per_mini_batch_not_per_micro_batch(name):
    batch = random_mini_batch(32, seed=1)
    n = batch["mask"].shape[0]
    options = {"clip_cov": {"seed": 0, "clip_cov_lb": -1.0, "clip_cov_ub": 1.0}, "kl_cov": {}}[name]
    # Default ratio 2e-4: int(2e-4 * n_valid) = 0 tokens, so the rule picks exactly one over the mini-batch.
    stats = stats_of(name, batch, **options)
    assert int(stats.selected.sum()) == 1
    key = {"clip_cov": "cov_clip_frac", "kl_cov": "kl_cov_frac"}[name]
    chosen = 0
    for s in range(0, n, 8):
        _, _, metrics = loss_on_rows(
            name, batch, slice(s, s + 8), batch_stats=stats.rows(slice(s, s + 8)), **options
        )
        chosen += round(metrics[key] * int(batch["mask"][s : s + 8].sum()))
    assert chosen == 1
    # Per-call statistics (verl's behaviour) choose at least one per non-empty micro-batch instead.
    per_call = sum(
        round(
            loss_on_rows(name, batch, slice(s, s + 8), **options)[2][key]
            * int(batch["mask"][s : s + 8].sum())
        )
        for s in range(0, n, 8)
    )
    assert per_call == 4


def test_rows_slices_columns_like_a_trimmed_micro_batch():
    batch = random_mini_batch(16, seed=2)
    options = {"kl_cov_ratio": 0.2}
    counts = {"num_tokens": int(batch["mask"].sum()), "num_seqs": 16}
    stats = stats_of("kl_cov", batch, **options)
    _, full_grad, _ = loss_on_rows("kl_cov", batch, slice(0, 16), batch_stats=stats, **counts, **options)
    rows = torch.tensor([3, 0, 9, 12])
    cols = slice(0, int(batch["mask"][rows].sum(dim=0).nonzero().max()) + 1)  # trimmed to the used columns
    _, grad, _ = loss_on_rows(
        "kl_cov", batch, rows, cols, batch_stats=stats.rows(rows, cols), **counts, **options
    )
    torch.testing.assert_close(grad, full_grad[rows][:, cols], rtol=1e-12, atol=1e-14)


def test_a_generator_is_drawn_from_once_per_mini_batch():
    batch = random_mini_batch(16, seed=3)
    options = {"clip_cov_ratio": 0.3, "clip_cov_lb": -1.0, "clip_cov_ub": 1.0}
    first = stats_of("clip_cov", batch, generator=torch.Generator().manual_seed(5), **options)
    again = stats_of("clip_cov", batch, generator=torch.Generator().manual_seed(5), **options)
    assert torch.equal(first.selected, again.selected) and int(first.selected.sum()) > 1


def test_mini_batch_stats_hand_values():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    stats = mini_batch_stats("cov_gauss", logp=logp, old_logp=logp, advantages=adv, mask=mask)
    mean_logp, mean_adv = -3.5 / 3, 0.0
    cov = [(-1.0 - mean_logp) * 1.0, (-2.0 - mean_logp) * 1.0, (-0.5 - mean_logp) * -2.0]
    mean_cov = sum(cov) / 3
    assert stats.mean_logp == pytest.approx(mean_logp, rel=1e-12)
    assert stats.mean_adv == pytest.approx(mean_adv, abs=1e-15)
    assert stats.std_cov == pytest.approx((sum((c - mean_cov) ** 2 for c in cov) / 3) ** 0.5, rel=1e-12)
    assert stats.selected is None and stats.rows(slice(0, 1)) is stats


def test_misuse_is_reported():
    batch = random_mini_batch(8, seed=4)
    stats = stats_of("kl_cov", batch)
    with pytest.raises(ValueError, match=r"rows\(rows, cols\)"):
        loss_on_rows("kl_cov", batch, slice(0, 4), batch_stats=stats)
    with pytest.raises(ValueError, match="computed for policy loss 'kl_cov', not 'clip_cov'"):
        loss_on_rows("clip_cov", batch, slice(0, 8), batch_stats=stats)
    with pytest.raises(ValueError, match="takes no batch_stats"):
        loss_on_rows("tepo", batch, slice(0, 8), batch_stats=stats)
    with pytest.raises(ValueError, match="either batch_stats or cov_stats"):
        loss_on_rows("kl_cov", batch, slice(0, 8), batch_stats=stats, cov_stats=stats)
    with pytest.raises(ValueError, match="do not pass it"):
        stats_of("kl_cov", batch, cov_stats=stats)
    with pytest.raises(ValueError, match="unknown option"):
        stats_of("kl_cov", batch, kl_cov_share=0.1)
    with pytest.raises(ValueError, match="CovStats"):
        loss_on_rows("cov_gauss", batch, slice(0, 8), cov_stats=(0.0, 0.0, 1.0))
    assert isinstance(stats, CovStats)
