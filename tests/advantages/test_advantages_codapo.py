"""codapo (verl #7497): GRPO advantages times each group's confidence-weighted learnability, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import compute_advantages

EPS = 1e-6


def _codapo(rewards, old, mask, group_size, **options):
    return compute_advantages(
        "codapo",
        torch.tensor(rewards, dtype=torch.float64),
        group_size,
        old_logp=torch.tensor(old, dtype=torch.float64),
        mask=torch.tensor(mask),
        **options,
    )


def test_a_mixed_group_of_two_by_hand():
    # Mean old log-prob -ln 2 per row: c = 1/2; acc = 1/2: v = 1/2 * 4 * 1/4 = 1/2; A^GRPO = +-0.5 / (sqrt(0.5) + eps).
    half = -math.log(2.0)
    adv = _codapo([1.0, 0.0], [[half, half], [half, 0.0]], [[1, 1], [1, 0]], 2)
    a = 0.5 / (math.sqrt(0.5) + EPS) * (0.5 + 0.1)
    expected = torch.tensor([[a, a], [-a, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=1e-12, atol=0)


def test_confidence_accuracy_and_offset_and_no_std_normalisation():
    # Group of four, rewards (1, 1, 1, 0): acc = 3/4, v = c * 3/4; mean old log-prob -0.2 on every row: c = e^-0.2.
    old = [[-0.2] * 3] * 4
    mask = [[1, 1, 1]] * 4
    adv = _codapo([1.0, 1.0, 1.0, 0.0], old, mask, 4, delta=0.0, norm_by_std=False)
    v = math.exp(-0.2) * 0.75
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.25 * v] * 3 + [-0.75 * v], dtype=torch.float64))


def test_all_equal_group_keeps_only_the_offset_of_a_zero_advantage_and_singletons_follow_verl():
    adv = _codapo([1.0, 1.0], [[-1.0], [-1.0]], [[1], [1]], 2)
    assert torch.equal(adv, torch.zeros(2, 1, dtype=torch.float64))
    # A group of one: mean 0, std 1 (verl), so A^GRPO = R / (1 + eps); acc = 1 gives v = 0.
    adv = _codapo([1.0, 0.0], [[-1.0], [-1.0]], [[1], [1]], 1)
    torch.testing.assert_close(adv, torch.tensor([[0.1 / (1 + EPS)], [0.0]], dtype=torch.float64))


def test_empty_rows_leave_accuracy_and_confidence():
    # Row 2 empty: acc and c over rows 0 and 1 only (1/2, e^-1); v = e^-1.
    adv = _codapo([1.0, 0.0, 1.0], [[-1.0], [-1.0], [0.0]], [[1], [1], [0]], 3, delta=0.0)
    grpo = (torch.tensor([1.0, 0.0, 1.0]) - 2 / 3) / (torch.tensor([1.0, 0.0, 1.0]).std() + EPS)
    expected = (grpo * math.exp(-1.0)).unsqueeze(-1).double() * torch.tensor([[1.0], [1.0], [0.0]])
    torch.testing.assert_close(adv, expected, rtol=1e-6, atol=1e-12)


def test_codasampling_is_refused_and_options_checked():
    with pytest.raises(ValueError, match=r"CoDaSampling .* not offered by tepo's trainer"):
        _codapo([1.0, 0.0], [[-1.0], [-1.0]], [[1], [1]], 2, focused_step=True)
    with pytest.raises(ValueError, match="codapo option delta must be a number >= 0"):
        _codapo([1.0, 0.0], [[-1.0], [-1.0]], [[1], [1]], 2, delta=-0.1)
