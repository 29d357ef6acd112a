"""The verl rejections ``seq_k3`` (``rollout_rs="seq_mean_k3"``) and ``seq_max_k2``, and ``normalize=true``
(verl ``rollout_is_batch_normalize``): closed forms on hand tensors, verl's clamp, the gradient through a loss,
micro-batch invariance of the batch-normalised weights, the trainer's pre-update pass, refusals (here and in the
config)."""

from __future__ import annotations

import math

import pytest
import torch

from correction_cases import ADV, D_ROWS, MASK, NAN, OLD, E, loss_on_kept, weights_of
from helpers import config_error_lines
from tepo.config import load_config
from tepo.losses import compute_policy_loss, rollout_correction_weights
from tepo.losses.rollout_correction import (
    DROPPING_CORRECTIONS,
    MODE_OPTIONS,
    NORMALIZABLE_CORRECTIONS,
)


def _k3(x):
    return E(x) - 1 - x


def _rows_keep(flags):
    return MASK & torch.tensor(flags).unsqueeze(-1)


def test_defaults_and_registration():
    assert MODE_OPTIONS["seq_k3"] == {"threshold": 0.01}  # verl decoupled_k3_rs
    assert MODE_OPTIONS["seq_max_k2"] == {"threshold": 2.5}  # verl's documented example
    assert {"seq_k3", "seq_max_k2"} <= set(DROPPING_CORRECTIONS)
    assert NORMALIZABLE_CORRECTIONS == ("tis", "mis", "seq_tis")


# ---- seq_k3 ----------------------------------------------------------------------------------------------------


def test_seq_k3_drops_rows_by_their_mean_token_k3():
    k3 = [sum(_k3(x) for x in row) / len(row) for row in D_ROWS[:3]]  # 0.310, 0.339, 1.25e-7
    assert k3[0] < 0.32 < k3[1] and k3[2] < 0.01 < k3[0]
    weights, keep, metrics = weights_of("seq_k3")  # threshold 0.01
    assert torch.equal(keep, _rows_keep([False, False, True, False]))
    torch.testing.assert_close(weights, keep.double(), rtol=0, atol=0)
    assert metrics["is_dropped_frac"] == pytest.approx(6 / 7)
    assert metrics["is_dropped_seq_frac"] == pytest.approx(2 / 3)
    _, keep, _ = weights_of("seq_k3", threshold=0.32)
    assert torch.equal(keep, _rows_keep([True, False, True, False]))


def test_seq_k3_boundary_is_inclusive():
    threshold = sum(_k3(x) for x in D_ROWS[1]) / 2
    _, keep, _ = weights_of("seq_k3", threshold=threshold * (1 + 1e-12))
    assert bool(keep[1, :2].all())
    _, keep, _ = weights_of("seq_k3", threshold=threshold * (1 - 1e-9))
    assert not bool(keep[1].any())


# ---- seq_max_k2 ------------------------------------------------------------------------------------------------


def test_seq_max_k2_vetoes_a_row_for_one_far_token():
    k2max = [max(x * x / 2 for x in row) for row in D_ROWS[:3]]  # 0.603 (ln 3), 0.420 (ln 2.5), 1.25e-7
    assert k2max[1] < 0.5 < k2max[0]
    weights, keep, _ = weights_of("seq_max_k2")  # threshold 2.5: every row passes
    assert torch.equal(keep, MASK) and torch.equal(weights, MASK.double())
    weights, keep, metrics = weights_of("seq_max_k2", threshold=0.5)
    assert torch.equal(keep, _rows_keep([False, True, True, False]))
    torch.testing.assert_close(weights, keep.double(), rtol=0, atol=0)
    assert metrics["is_dropped_seq_frac"] == pytest.approx(1 / 3)
    # The mean of the row's k2 (0.26) is under 0.5: only the max sees the spike.
    assert sum(x * x / 2 for x in D_ROWS[0]) / 4 < 0.5


@pytest.mark.parametrize("spike", [30.0, -30.0])
def test_log_ratios_are_clamped_at_verls_safety_bound(spike):
    # verl clamps log rho to [-20, 20] before k2/k3: the statistic of a spike of +-30 is that of +-20.
    d = torch.tensor([[spike, 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 2, dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    at_bound = math.copysign(20.0, spike)
    k3_mean = _k3(at_bound) / 2
    _, keep, _ = weights_of("seq_k3", old=old, rollout=old - d, mask=mask, threshold=k3_mean * (1 + 1e-9))
    assert bool(keep.all())
    _, keep, _ = weights_of("seq_k3", old=old, rollout=old - d, mask=mask, threshold=k3_mean * (1 - 1e-9))
    assert not bool(keep.any())
    _, keep, _ = weights_of("seq_max_k2", old=old, rollout=old - d, mask=mask, threshold=200.0)  # 20^2/2
    assert bool(keep.all())


@pytest.mark.parametrize("mode", ["seq_k3", "seq_max_k2"])
def test_rejected_rows_leave_the_loss_and_its_token_count(mode):
    """pi_theta = pi_old: the grpo term's gradient is -A / T_kept on kept tokens, 0 on the dropped rows."""
    options = {"threshold": 0.32} if mode == "seq_k3" else {"threshold": 0.5}
    weights, keep, _ = weights_of(mode, **options)
    assert not bool(keep[0].all()) or not bool(keep[1].all())
    t_kept = int(keep.sum())
    loss, grad = loss_on_kept("dapo", weights, keep)
    expected = torch.where(keep, -ADV.unsqueeze(-1) / t_kept, torch.zeros_like(OLD))
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert loss == pytest.approx(float((-ADV.unsqueeze(-1)).expand_as(OLD)[keep].sum()) / t_kept)


# ---- normalize -------------------------------------------------------------------------------------------------


def test_tis_normalize_rescales_to_mean_one_over_the_tokens():
    raw, _, _ = weights_of("tis")
    weights, keep, metrics = weights_of("tis", normalize=True)
    mean = float(raw[MASK].sum()) / 7
    torch.testing.assert_close(weights, raw / mean, rtol=1e-12, atol=0)
    assert float(weights[keep].mean()) == pytest.approx(1.0, rel=1e-12)
    assert metrics["is_batch_norm_factor"] == pytest.approx(mean, rel=1e-12)
    assert metrics["is_weight_mean"] == pytest.approx(1.0, rel=1e-12)
    assert metrics["is_truncated_frac"] == pytest.approx(2 / 7)  # truncation first, then the rescale
    assert "is_batch_norm_factor" not in weights_of("tis")[2]


def test_mis_normalize_averages_over_the_kept_tokens():
    raw, keep, _ = weights_of("mis")  # kept: e^0.1, e^-0.2 (row 0), 1.5 (row 1), e^0.0005 (row 2)
    kept = [E(0.1), E(-0.2), 1.5, E(0.0005)]
    weights, keep_n, metrics = weights_of("mis", normalize=True)
    assert torch.equal(keep_n, keep)
    assert metrics["is_batch_norm_factor"] == pytest.approx(sum(kept) / 4, rel=1e-12)
    torch.testing.assert_close(weights, raw / (sum(kept) / 4), rtol=1e-12, atol=0)
    assert float(weights[~keep].abs().sum()) == 0.0


def test_seq_tis_normalize_averages_one_weight_per_sequence_not_per_token():
    raw, _, _ = weights_of("seq_tis")  # row weights: 3 * 0.4 * e^-0.1 (4 tokens), 2.0 (2), e^0.0005 (1)
    row = [3.0 * 0.4 * E(0.1) * E(-0.2), 2.0, E(0.0005)]
    weights, _, metrics = weights_of("seq_tis", normalize=True)
    mean = sum(row) / 3
    assert metrics["is_batch_norm_factor"] == pytest.approx(mean, rel=1e-12)
    torch.testing.assert_close(weights, raw / mean, rtol=1e-12, atol=0)
    # Per sequence, as verl: the mean over rows is 1, the token mean (length-weighted) is not.
    rows = torch.tensor([float(weights[i, 0]) for i in range(3)], dtype=torch.float64)
    assert float(rows.mean()) == pytest.approx(1.0, rel=1e-12)
    assert float(weights[MASK].mean()) == pytest.approx(
        (4 * row[0] + 2 * row[1] + row[2]) / 7 / mean, rel=1e-12
    )
    assert float(weights[MASK].mean()) != pytest.approx(1.0, rel=1e-3)


def test_normalize_leaves_a_vanishing_mean_alone():
    # Every ratio e^-30: the weights' mean is below 1e-8, so they are returned as they are (verl).
    rollout = torch.where(MASK, OLD + 30.0, torch.full_like(OLD, NAN))
    raw, _, _ = weights_of("tis", rollout=rollout)
    weights, _, metrics = weights_of("tis", rollout=rollout, normalize=True)
    assert torch.equal(weights, raw) and metrics["is_batch_norm_factor"] == 1.0


def test_normalised_weights_from_the_whole_batch_give_micro_batch_invariant_gradients():
    """The trainer computes the weights once over the batch; micro-batches then slice constants. Normalising per
    micro-batch instead would change the gradient, which is why a normalising correction forces that pass."""
    gen = torch.Generator().manual_seed(5)
    n, t = 6, 5
    old = -torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.2
    rollout = old - 0.4 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    logp0 = old + 0.1 * torch.randn(n, t, generator=gen, dtype=torch.float64)
    adv = torch.randn(n, generator=gen, dtype=torch.float64)
    mask = torch.rand(n, t, generator=gen) > 0.3
    mask[:, 0] = True
    num_tokens = float(mask.sum())

    def gradient(parts, per_part_weights):
        logp = logp0.clone().requires_grad_(True)
        full, _, _ = rollout_correction_weights(old, rollout, mask, mode="tis", normalize=True)
        for rows in parts:
            if per_part_weights:
                w, _, _ = rollout_correction_weights(
                    old[rows], rollout[rows], mask[rows], mode="tis", normalize=True
                )
            else:
                w = full[rows]
            loss, _ = compute_policy_loss(
                "grpo",
                logp=logp[rows],
                old_logp=old[rows],
                advantages=adv[rows],
                mask=mask[rows],
                is_weights=w,
                num_tokens=num_tokens,
                num_seqs=float(n),
            )
            loss.backward()
        return logp.grad

    whole = gradient([torch.arange(n)], per_part_weights=False)
    parts = [torch.arange(0, 2), torch.arange(2, 6)]
    torch.testing.assert_close(gradient(parts, per_part_weights=False), whole, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(gradient(parts, per_part_weights=True), whole)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("seq_k3", {"normalize": True}, "'seq_k3' has no IS weights to normalise"),
        ("seq_max_k2", {"normalize": False}, "'seq_max_k2' has no IS weights to normalise"),
        ("seq_mask", {"normalize": True}, "normalize applies to tis, mis, seq_tis"),
        ("none", {"normalize": True}, "'none' has no IS weights"),
        ("tis", {"normalize": 1}, "normalize: must be true or false, got 1"),
        ("seq_k3", {"threshold": 0.0}, "threshold: must be > 0"),
        ("seq_max_k2", {"threshold": float("inf")}, "threshold: must be a finite number"),
        ("seq_k3", {"cap": 2.0}, r"not an option of rollout correction 'seq_k3' \(its options: threshold\)"),
        ("tis", {"threshold": 2.0}, r"\(its options: cap, normalize\)"),
    ],
)
def test_bad_options_are_refused_with_one_message(mode, options, message):
    with pytest.raises(ValueError, match=message):
        weights_of(mode, **options)


# ---- config ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.rollout_correction=seq_k3"],
        ["algorithm.rollout_correction=seq_k3", "algorithm.rollout_correction_options.threshold=0.05"],
        ["algorithm.rollout_correction=seq_max_k2", "algorithm.rollout_correction_options.threshold=2"],
        ["algorithm.rollout_correction=tis", "algorithm.rollout_correction_options.normalize=true"],
        [
            "algorithm.rollout_correction=seq_tis",
            "algorithm.rollout_correction_options={cap: 5, normalize: true}",
        ],
        ["algorithm.rollout_correction_options.normalize=true"],  # auto turns on tis
    ],
)
def test_config_accepts(overrides):
    load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["algorithm.rollout_correction=seq_k3", "algorithm.rollout_correction_options.normalize=true"],
            "algorithm.rollout_correction_options.normalize: rollout correction 'seq_k3' has no IS weights to "
            "normalise (it only keeps or drops tokens, with weight 1); normalize applies to tis, mis, seq_tis",
        ),
        (
            ["algorithm.rollout_correction=tis", "algorithm.rollout_correction_options.normalize=yes please"],
            "algorithm.rollout_correction_options.normalize: must be true or false, got 'yes please'",
        ),
        (
            ["algorithm.rollout_correction=seq_max_k2", "algorithm.rollout_correction_options.threshold=-1"],
            "algorithm.rollout_correction_options.threshold: must be > 0, got -1",
        ),
    ],
)
def test_config_refuses_in_one_line(overrides, line):
    lines = config_error_lines(overrides)
    assert f"  - {line}" in lines
    assert len(lines) == 2
