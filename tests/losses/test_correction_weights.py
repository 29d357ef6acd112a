"""`rollout_correction_weights`: each mode against its closed form on hand tensors, the keep mask, the metrics,
overflow safety, bad options, and the gradient through a loss (the weights are constants)."""

from __future__ import annotations

import math

import pytest
import torch

from correction_cases import ADV, MASK, NAN, OLD, ROLLOUT, WIDTH, E, L, loss_on_kept, weights_of
from tepo.losses import rollout_correction_weights
from tepo.losses.rollout_correction import MODE_OPTIONS, ROLLOUT_CORRECTIONS


def _expected(rows):
    return torch.tensor([row + [0.0] * (WIDTH - len(row)) for row in rows], dtype=torch.float64)


def test_none_is_all_ones_on_valid_tokens():
    weights, keep, metrics = weights_of("none")
    assert torch.equal(weights, MASK.double()) and torch.equal(keep, MASK)
    assert metrics["is_weight_mean"] == 1.0 and metrics["is_dropped_frac"] == 0.0


def test_tis_truncates_each_token_ratio_at_the_cap():
    weights, keep, metrics = weights_of("tis")  # cap 2.0
    expected = _expected([[2.0, 0.4, E(0.1), E(-0.2)], [1.5, 2.0], [E(0.0005)], []])
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=0)
    assert torch.equal(keep, MASK)
    assert metrics["is_truncated_frac"] == pytest.approx(2 / 7)
    assert metrics["is_weight_mean"] == pytest.approx(float(expected.sum()) / 7, rel=1e-12)
    assert metrics["is_weight_min"] == pytest.approx(0.4) and metrics["is_weight_max"] == pytest.approx(2.0)
    assert metrics["is_dropped_frac"] == 0.0 and metrics["is_dropped_seq_frac"] == 0.0
    weights, _, _ = weights_of("tis", cap=3.5)
    assert weights[0, 0].item() == pytest.approx(3.0) and weights[1, 1].item() == pytest.approx(2.5)


def test_mis_drops_tokens_outside_the_range_and_keeps_the_ratio_of_the_others():
    weights, keep, metrics = weights_of("mis")  # [0.5, 2.0]
    expected_keep = torch.tensor(
        [[False, False, True, True], [True, False, False, False], [True, False, False, False], [False] * 4]
    )
    assert torch.equal(keep, expected_keep)
    torch.testing.assert_close(
        weights, _expected([[0.0, 0.0, E(0.1), E(-0.2)], [1.5, 0.0], [E(0.0005)], []]), rtol=1e-12, atol=0
    )
    assert metrics["is_dropped_frac"] == pytest.approx(3 / 7)
    assert metrics["is_dropped_seq_frac"] == pytest.approx(2 / 3)  # rows 0 and 1 of the three non-empty rows
    assert metrics["is_truncated_frac"] == 0.0
    _, keep, _ = weights_of("mis", c_low=0.3, c_high=3.5)  # now every ratio is inside
    assert torch.equal(keep, MASK)


def test_seq_tis_truncates_the_product_ratio_of_each_row():
    weights, keep, metrics = weights_of("seq_tis")  # cap 2.0 on prod_t rho_t
    row0 = 3.0 * 0.4 * E(0.1) * E(-0.2)  # 1.086 < 2: kept as is
    expected = _expected([[row0] * 4, [2.0, 2.0], [E(0.0005)], []])  # row 1: 1.5 * 2.5 = 3.75, capped
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=0)
    assert torch.equal(keep, MASK)
    assert metrics["is_truncated_frac"] == pytest.approx(2 / 7)


def test_seq_mask_drops_rows_by_their_geometric_mean_ratio():
    weights, keep, metrics = weights_of("seq_mask")  # [1/1.001, 1/0.999] on exp(mean_t log rho)
    g = [E((L(1.2) - 0.1) / 4), E(L(3.75) / 2), E(0.0005)]
    assert not 0.999 <= g[0] <= 1.001 and not 0.999 <= g[1] <= 1.001 and 0.999 <= g[2] <= 1.001
    assert torch.equal(keep, MASK & torch.tensor([False, False, True, False]).unsqueeze(-1))
    torch.testing.assert_close(weights, _expected([[0.0] * 4, [0.0, 0.0], [1.0], []]), rtol=0, atol=0)
    assert metrics["is_dropped_frac"] == pytest.approx(6 / 7)
    assert metrics["is_dropped_seq_frac"] == pytest.approx(2 / 3)
    _, keep, _ = weights_of("seq_mask", c_low=0.9, c_high=1.1)  # g_0 = 1.021 now inside, g_1 = 1.94 still out
    assert torch.equal(keep, MASK & torch.tensor([True, False, True, False]).unsqueeze(-1))


@pytest.mark.parametrize("mode", ROLLOUT_CORRECTIONS)
def test_equal_policies_give_unit_weights_and_keep_everything(mode):
    weights, keep, metrics = rollout_correction_weights(OLD, OLD.clone(), MASK, mode=mode)
    assert torch.equal(weights, MASK.double()) and torch.equal(keep, MASK)
    assert metrics["is_dropped_frac"] == 0.0 and metrics["is_truncated_frac"] == 0.0


@pytest.mark.parametrize("mode", ROLLOUT_CORRECTIONS)
def test_huge_ratios_stay_finite(mode):
    rollout = OLD - torch.tensor([[200.0, -200.0, 0.0, 0.0]] * 4, dtype=torch.float64)
    weights, _, metrics = rollout_correction_weights(OLD, rollout, MASK, mode=mode)
    assert torch.isfinite(weights).all() and all(math.isfinite(v) for v in metrics.values())


def test_weights_carry_no_gradient_and_enter_the_loss_as_constants():
    """With pi_theta = pi_old (the first update), the grpo term's gradient is -A * w / T_kept on kept tokens and
    0 on dropped ones: mis weights, the dropped tokens removed from the mask and from the token count."""
    old = OLD.clone().requires_grad_(True)
    weights, keep, _ = rollout_correction_weights(old, ROLLOUT, MASK, mode="mis")
    assert not weights.requires_grad
    loss, grad = loss_on_kept("grpo", weights, keep, agg="token-mean")
    t_kept = int(keep.sum())
    expected = torch.where(keep, -ADV.unsqueeze(-1) * weights / t_kept, torch.zeros_like(weights))
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=1e-15)
    assert loss == pytest.approx(float((-ADV.unsqueeze(-1) * weights)[keep].sum()) / t_kept, rel=1e-12)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("tis", {"cap": 0.0}, "cap: must be > 0"),
        ("seq_tis", {"cap": -1.0}, "cap: must be > 0"),
        ("mis", {"c_low": 0.0}, "c_low: must be > 0"),
        ("mis", {"c_low": 3.0, "c_high": 2.0}, "c_low: must be <= c_high"),
        ("seq_mask", {"c_high": 0.5}, "c_low: must be <= c_high"),
        ("tis", {"c_low": 0.5}, "not an option of rollout correction 'tis'"),
        ("none", {"cap": 2.0}, "not an option of rollout correction 'none'"),
        ("mis", {"c_high": float("nan")}, "finite number"),
        ("mis", {"c_high": "2"}, "finite number"),
    ],
)
def test_bad_options_are_rejected(mode, options, message):
    with pytest.raises(ValueError, match=message):
        weights_of(mode, **options)


def test_bad_mode_and_inputs_are_rejected():
    with pytest.raises(ValueError, match="unknown rollout correction mode 'auto'"):
        weights_of("auto")
    with pytest.raises(ValueError, match="one shape"):
        rollout_correction_weights(OLD, ROLLOUT[:, :2], MASK, mode="tis")
    bad = ROLLOUT.clone()
    bad[0, 1] = NAN
    with pytest.raises(ValueError, match="NaN on a valid token"):
        rollout_correction_weights(OLD, bad, MASK, mode="tis")


def test_every_mode_documents_its_defaults():
    assert set(MODE_OPTIONS) == set(ROLLOUT_CORRECTIONS)
    assert MODE_OPTIONS["tis"] == {"cap": 2.0} and MODE_OPTIONS["mis"] == {"c_low": 0.5, "c_high": 2.0}
