"""Aggregation modes by hand, micro-batch invariance for every loss x mode, and padding that never leaks."""

from __future__ import annotations

import itertools

import pytest
import torch

from loss_cases import random_loss_inputs, stats_of
from tepo.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate,
    compute_policy_loss,
    list_policy_losses,
)

NAN, INF = float("nan"), float("inf")

# l[i,t] on a 3 x 4 batch; masked entries hold NaN/inf, which must not matter.
LOSS_ROWS = [[1.0, 2.0, 3.0], [4.0], [-1.0, 0.5, 2.5, 6.0]]
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
LOSS_MAT = torch.tensor(
    [[1.0, 2.0, 3.0, NAN], [4.0, INF, -INF, NAN], [-1.0, 0.5, 2.5, 6.0]], dtype=torch.float64
)


@pytest.mark.parametrize(
    ("mode", "counts", "expected"),
    [
        ("token-mean", {}, (6 + 4 + 8) / 8),
        ("token-mean", {"num_tokens": 20}, (6 + 4 + 8) / 20),
        ("seq-mean-token-mean", {}, (6 / 3 + 4 / 1 + 8 / 4) / 3),
        ("seq-mean-token-mean", {"num_seqs": 5}, (6 / 3 + 4 / 1 + 8 / 4) / 5),
        ("seq-mean-token-sum", {}, (6 + 4 + 8) / 3),
        ("seq-mean-token-sum", {"num_seqs": 6}, (6 + 4 + 8) / 6),
        ("seq-mean-token-sum-norm", {}, (6 + 4 + 8) / (3 * 4)),
        ("seq-mean-token-sum-norm", {"num_seqs": 4, "max_len": 10}, (6 + 4 + 8) / (4 * 10)),
    ],
)
def test_aggregate_modes_by_hand(mode, counts, expected):
    loss_mat = LOSS_MAT.clone().requires_grad_(True)
    value = aggregate(loss_mat, MASK, mode, **counts)
    assert value.item() == pytest.approx(expected, rel=1e-12)
    value.backward()
    assert torch.all(loss_mat.grad[~MASK.bool()] == 0)
    # d value / d l[i,t] for a valid token, by mode:
    n_seqs = counts.get("num_seqs", 3)
    per_row = {
        "token-mean": [1 / counts.get("num_tokens", 8)] * 3,
        "seq-mean-token-mean": [1 / (3 * n_seqs), 1 / (1 * n_seqs), 1 / (4 * n_seqs)],
        "seq-mean-token-sum": [1 / n_seqs] * 3,
        "seq-mean-token-sum-norm": [1 / (n_seqs * counts.get("max_len", 4))] * 3,
    }[mode]
    for i, row in enumerate(LOSS_ROWS):
        torch.testing.assert_close(
            loss_mat.grad[i, : len(row)], torch.full((len(row),), per_row[i], dtype=torch.float64)
        )


def test_aggregate_empty_row_counts_in_n_but_adds_zero():
    mask = torch.tensor([[1, 1], [0, 0]])
    loss_mat = torch.tensor([[2.0, 4.0], [NAN, NAN]])
    assert aggregate(loss_mat, mask, "seq-mean-token-mean").item() == pytest.approx(3.0 / 2)
    assert aggregate(loss_mat, torch.zeros(2, 2), "token-mean").item() == 0.0


def test_aggregate_rejects_bad_mode_and_counts():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean"):
        aggregate(LOSS_MAT, MASK, "mean")
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate(LOSS_MAT, MASK, "token-mean", num_tokens=0)
    with pytest.raises(ValueError, match="same shape"):
        aggregate(LOSS_MAT, MASK[:, :2], "token-mean")


# ---- micro-batch invariance -----------------------------------------------------------------------------------


def _random_batch(seed, n=6, width=5):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=gen)
    lengths[2] = 0  # one empty row (e.g. a filtered sample) must not break anything
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).long()
    mask[4, 0] = 0  # and a hole inside a row (a non-contiguous mask)
    return random_loss_inputs(gen, mask)


REGULARIZERS = {"entropy_coef": 0.01, "kl_coef": 0.05, "kl_estimator": "k3", "tepo_kl_mask_coef": 0.3}


def _options_for_invariance(name, batch):
    """Batch-statistic losses get their mini-batch statistics (see tepo.losses.covariance: with per-call
    statistics they are NOT split-invariant, as in verl); `_loss_grad` slices them to each call's rows."""
    options = {
        "clip_cov": {"clip_cov_ratio": 0.5, "clip_cov_lb": -0.3, "clip_cov_ub": 0.3, "seed": 3},
        "kl_cov": {"kl_cov_ratio": 0.3},
    }.get(name, {})
    extra = [key for key in ("entropy",) if key in POLICY_LOSSES[name].requires]
    stats = stats_of(name, batch, *extra, **options)
    return {**options, **({} if stats is None else {"batch_stats": stats})}


def _loss_grad(name, batch, rows, **options):
    logp = batch["logp"][rows].clone().requires_grad_(True)
    part = {k: v[rows] for k, v in batch.items() if k != "logp"}
    if "batch_stats" in options:
        options = {**options, "batch_stats": options["batch_stats"].rows(rows)}
    loss, _ = compute_policy_loss(name, logp=logp, **part, **options)
    loss.backward()
    return loss.detach(), logp.grad


@pytest.mark.parametrize(("name", "agg"), list(itertools.product(list_policy_losses(), AGG_MODES)))
def test_micro_batches_with_global_counts_sum_to_the_full_batch(name, agg):
    batch = _random_batch(7)
    n, width = batch["mask"].shape
    counts = {"num_tokens": int(batch["mask"].sum()), "num_seqs": n, "max_len": width}
    options = {"agg": agg, **counts, **REGULARIZERS, **_options_for_invariance(name, batch)}
    full_loss, full_grad = _loss_grad(name, batch, slice(0, n), **options)
    splits = [slice(0, 2), slice(2, 3), slice(3, 6)]
    parts = [_loss_grad(name, batch, s, **options) for s in splits]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    assert full_grad.abs().sum() > 0  # the comparison is not between two zero gradients


@pytest.mark.parametrize("estimator", ["k2", "k3+", "k3_unbiased"])
def test_tepo_kl_mask_estimators_split_into_micro_batches_unchanged(estimator):
    batch = _random_batch(7)
    n = batch["mask"].shape[0]
    options = {
        "num_tokens": int(batch["mask"].sum()),
        "tepo_kl_mask_coef": 0.3,
        "tepo_kl_mask_estimator": estimator,
    }
    full_loss, full_grad = _loss_grad("tepo", batch, slice(0, n), **options)
    parts = [_loss_grad("tepo", batch, s, **options) for s in (slice(0, 2), slice(2, n))]
    torch.testing.assert_close(sum(p[0] for p in parts), full_loss, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=1e-12, atol=1e-14)
    without = _loss_grad("tepo", batch, slice(0, n), num_tokens=options["num_tokens"])[1]
    assert not torch.allclose(full_grad, without)  # the masked term is there, not an empty set


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "cov_gauss"])
def test_batch_statistic_losses_are_computed_per_call(name):
    """Documented behaviour: without cov_stats the statistics are those of each call, so one micro-batch equal to
    the full batch reproduces it exactly, while a real split generally does not."""
    batch = _random_batch(11)
    n = batch["mask"].shape[0]
    counts = {"num_tokens": int(batch["mask"].sum()), "num_seqs": n}
    options = {"clip_cov": {"seed": 0, "clip_cov_lb": -0.3, "clip_cov_ub": 0.3, "clip_cov_ratio": 0.5}}.get(
        name, {}
    )
    options = {**options, **({"kl_cov_ratio": 0.2} if name == "kl_cov" else {})}
    full = _loss_grad(name, batch, slice(0, n), **counts, **options)
    again = _loss_grad(name, batch, slice(0, n), **counts, **options)
    torch.testing.assert_close(full, again, rtol=0, atol=0)
    split = [_loss_grad(name, batch, s, **counts, **options) for s in (slice(0, 3), slice(3, n))]
    assert not torch.allclose(torch.cat([p[1] for p in split]), full[1])


# ---- padding --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_policy_losses())
@pytest.mark.parametrize("token_adv", [False, True])
def test_nan_and_inf_at_masked_positions_change_nothing(name, token_adv):
    clean = _random_batch(5)
    if token_adv:
        clean["advantages"] = clean["advantages"].unsqueeze(-1).expand_as(clean["logp"]).clone()
    padding = ~clean["mask"].bool()
    dirty = {k: v.clone() for k, v in clean.items()}
    for key, fill in (
        ("logp", NAN),
        ("old_logp", INF),
        ("ref_logp", -INF),
        ("entropy", NAN),
        ("old_entropy", INF),
    ):
        dirty[key][padding] = fill
    if token_adv:
        dirty["advantages"][padding] = NAN
    options = {**REGULARIZERS, **({"seed": 1} if name == "clip_cov" else {})}
    n = clean["mask"].shape[0]
    clean_loss, clean_grad = _loss_grad(name, clean, slice(0, n), **options)
    dirty_loss, dirty_grad = _loss_grad(name, dirty, slice(0, n), **options)
    assert torch.isfinite(dirty_loss)
    assert torch.equal(clean_loss, dirty_loss)
    assert torch.equal(clean_grad, dirty_grad)
    assert torch.all(dirty_grad[padding] == 0)
