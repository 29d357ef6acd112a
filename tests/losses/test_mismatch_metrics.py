"""`rollout_mismatch_metrics`: exact zeros and ones for identical policies, closed forms on hand tensors."""

from __future__ import annotations

import math

import pytest
import torch

from tepo.losses import rollout_mismatch_metrics

NAN = float("nan")
# d = log pi_trainer - log pi_sampler on the valid tokens of four rows (the third one empty).
D_ROWS = [[0.5, -1.0, 0.0], [1.5, 0.2], [], [0.1]]
WIDTH = 3
MASK = torch.tensor([[len(row) > t for t in range(WIDTH)] for row in D_ROWS])
ROLLOUT = -torch.rand(4, WIDTH, generator=torch.Generator().manual_seed(0), dtype=torch.float64) - 0.1
D = torch.tensor([row + [0.0] * (WIDTH - len(row)) for row in D_ROWS], dtype=torch.float64)
TRAINER = torch.where(MASK, ROLLOUT + D, torch.full_like(ROLLOUT, NAN))  # padding holds NaN: must not matter


def test_identical_policies_give_exact_zeros_and_ones():
    metrics = rollout_mismatch_metrics(ROLLOUT, ROLLOUT.clone(), MASK, threshold_c=2.0)
    ones = {"mismatch_seq_ratio_mean", "mismatch_seq_ratio_min", "mismatch_seq_ratio_max"}
    for key, value in metrics.items():
        assert value == (1.0 if key in ones else 0.0), key


def test_hand_values():
    metrics = rollout_mismatch_metrics(TRAINER, ROLLOUT, MASK, threshold_c=2.0)
    flat = [d for row in D_ROWS for d in row]
    means = [sum(row) / len(row) for row in D_ROWS if row]
    g = [math.exp(m) for m in means]
    g_mean = sum(g) / 3
    log_c = math.log(2.0)
    expected = {
        "mismatch_kl_k1": -sum(flat) / 6,
        "mismatch_kl_k3": sum(math.exp(d) - 1 - d for d in flat) / 6,
        "mismatch_abs_log_ratio_mean": sum(abs(d) for d in flat) / 6,
        "mismatch_abs_log_ratio_max": 1.5,
        "mismatch_token_out_frac": 2 / 6,  # d = -1.0 and 1.5 leave [-log 2, log 2]
        "mismatch_seq_token_out_frac": 2 / 3,  # rows 0 and 1 (of the three non-empty ones)
        "mismatch_seq_out_frac": sum(abs(m) > log_c for m in means) / 3,  # row 1: mean 0.85
        "mismatch_seq_ratio_mean": g_mean,
        "mismatch_seq_ratio_std": math.sqrt(sum((x - g_mean) ** 2 for x in g) / 3),
        "mismatch_seq_ratio_min": min(g),
        "mismatch_seq_ratio_max": max(g),
    }
    assert expected["mismatch_seq_out_frac"] == pytest.approx(1 / 3)
    assert set(metrics) == set(expected)
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_the_threshold_moves_the_out_of_range_shares():
    wide = rollout_mismatch_metrics(TRAINER, ROLLOUT, MASK, threshold_c=5.0)  # log 5 = 1.61 > every |d|
    assert wide["mismatch_token_out_frac"] == 0.0 and wide["mismatch_seq_out_frac"] == 0.0
    tight = rollout_mismatch_metrics(TRAINER, ROLLOUT, MASK, threshold_c=1.05)  # log 1.05 = 0.049
    assert tight["mismatch_token_out_frac"] == pytest.approx(5 / 6)  # all but d = 0
    assert tight["mismatch_seq_out_frac"] == pytest.approx(1.0)


def test_estimators_agree_with_the_exact_kl_of_a_bf16_sampler():
    """Sampler: the softmax of bf16-rounded logits (what a bf16 engine computes); trainer: float64. Tokens drawn
    from the sampler; the exact KL(pi_s || pi_t) per position is a sum over the vocabulary."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(256, 100, generator=gen, dtype=torch.float64) * 3
    trainer = torch.log_softmax(logits, dim=-1)
    sampler = torch.log_softmax(logits.bfloat16().double(), dim=-1)
    exact = float((sampler.exp() * (sampler - trainer)).sum(dim=-1).mean())
    draws = 400
    tokens = torch.multinomial(sampler.exp(), draws, replacement=True, generator=gen)  # [positions, draws]
    metrics = rollout_mismatch_metrics(
        trainer.gather(-1, tokens), sampler.gather(-1, tokens), torch.ones_like(tokens), threshold_c=2.0
    )
    assert exact > 0
    assert metrics["mismatch_kl_k3"] == pytest.approx(exact, rel=0.05)
    # k1 is unbiased but noisy: its std over n samples is about sqrt(2 KL / n).
    assert abs(metrics["mismatch_kl_k1"] - exact) < 5 * math.sqrt(2 * exact / tokens.numel())
    assert metrics["mismatch_token_out_frac"] == 0.0


def test_empty_mask_and_bad_threshold():
    metrics = rollout_mismatch_metrics(TRAINER, ROLLOUT, torch.zeros_like(MASK))
    assert metrics["mismatch_kl_k1"] == 0.0 and metrics["mismatch_seq_ratio_mean"] == 1.0
    with pytest.raises(ValueError, match="threshold_c must be a number >= 1"):
        rollout_mismatch_metrics(TRAINER, ROLLOUT, MASK, threshold_c=0.5)
