"""The standard-deviation conventions: grpo's (unbiased by default, as TRL and verl), erpo's z-scores
(population), and the base's convention carried unchanged through the token-level estimators."""

from __future__ import annotations

import math

import pytest
import torch

from tepo.advantages import compute_advantages
from tepo.advantages._common import group_std


def test_group_std_closed_form():
    # Deviations (1, -1, 2, -2): sum of squares 10; n = 4 -> unbiased sqrt(10/3), population sqrt(10/4).
    c = torch.tensor([[1.0, -1.0, 2.0, -2.0]], dtype=torch.float64)
    assert group_std(c, 4, "unbiased").item() == pytest.approx(math.sqrt(10 / 3))
    assert group_std(c, 4, "population").item() == pytest.approx(math.sqrt(10 / 4))
    # Rows with too few entries for the convention give 0, not NaN or inf.
    one = torch.tensor([[0.0]], dtype=torch.float64)
    assert group_std(one, 1, "unbiased").item() == 0.0
    assert group_std(one, torch.tensor([[0.0]]), "population").item() == 0.0
    with pytest.raises(ValueError, match=r"std convention must be 'unbiased' or 'population', got 'sample'"):
        group_std(c, 4, "sample")


def test_grpo_conventions_differ_by_bessel_factor():
    # R = (2, 4, 6, 4, 9): mean 5, deviations (-3, -1, 1, -1, 4), sum of squares 28.
    # unbiased std sqrt(28/4) = sqrt(7), population sqrt(28/5): A_pop / A_unb = sqrt(G / (G - 1)) with eps = 0.
    r = torch.tensor([2.0, 4, 6, 4, 9], dtype=torch.float64)
    unbiased = compute_advantages("grpo", r, 5, eps=0.0)
    population = compute_advantages("grpo", r, 5, eps=0.0, std="population")
    dev = torch.tensor([-3.0, -1, 1, -1, 4], dtype=torch.float64)
    assert torch.allclose(unbiased, dev / math.sqrt(7))
    assert torch.allclose(population, dev / math.sqrt(28 / 5))
    assert torch.allclose(population / unbiased, torch.full((5,), math.sqrt(5 / 4), dtype=torch.float64))
    # The default is unbiased.
    assert torch.equal(compute_advantages("grpo", r, 5, eps=0.0, std="unbiased"), unbiased)


def test_erpo_zscores_are_population():
    # G = 2, K = 1 bucket, gate "none", lam 1, base dr_grpo on R = (1, 0): A = (0.5, -0.5), sgn = (+1, -1).
    # Progress: bucket means 0.2 and -0.2 -> population z across the pair = (+1, -1) (unbiased: +-1/sqrt 2).
    # Entropy over the 6 valid tokens (0, 0, 3 | 1, 1, 1): mean 1, squared deviations sum to 6, population
    # std 1 -> z = (-1, -1, 2 | 0, 0, 0) (unbiased would divide by sqrt(6/5)).
    # A[i,t] - A_i = lam * z[i,t] * Sn_i * sgn(A_i) = z[i,t] for both rows here.
    r = torch.tensor([1.0, 0.0], dtype=torch.float64)
    ref = torch.zeros(2, 3, dtype=torch.float64)
    logp = torch.tensor([[0.2, 0.2, 0.2], [-0.2, -0.2, -0.2]], dtype=torch.float64)
    adv = compute_advantages(
        "erpo",
        r,
        2,
        entropy=torch.tensor([[0.0, 0.0, 3.0], [1.0, 1.0, 1.0]], dtype=torch.float64),
        mask=torch.ones(2, 3),
        logp=logp,
        ref_logp=ref,
        num_buckets=1,
        gate="none",
        lam=1.0,
        eps=0.0,
        base="dr_grpo",
    )
    z = adv - torch.tensor([[0.5], [-0.5]], dtype=torch.float64)
    assert torch.allclose(z, torch.tensor([[-1.0, -1.0, 2.0], [0.0, 0.0, 0.0]], dtype=torch.float64))
    assert z.square().sum().item() == pytest.approx(6.0)  # population z: unit mean square over its pool


def test_token_level_estimators_keep_the_base_convention():
    # With no token signal, entropy_adv and erpo return their base exactly: grpo's unbiased std by default,
    # population when base_options asks for it.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    mask = torch.ones(8, 2)
    zero = torch.zeros(8, 2)
    for base_options in (None, {"std": "population"}):
        grpo = compute_advantages("grpo", r, 4, **(base_options or {}))
        ent = compute_advantages("entropy_adv", r, 4, entropy=zero, mask=mask, base_options=base_options)
        erpo = compute_advantages(
            "erpo", r, 4, entropy=zero, mask=mask, logp=zero, ref_logp=zero, base_options=base_options
        )
        assert torch.equal(ent, grpo.unsqueeze(1).expand(8, 2))
        assert torch.equal(erpo, grpo.unsqueeze(1).expand(8, 2))
    unbiased = compute_advantages("entropy_adv", r, 4, entropy=zero, mask=mask)
    population = compute_advantages(
        "entropy_adv", r, 4, entropy=zero, mask=mask, base_options={"std": "population"}
    )
    assert not torch.allclose(unbiased, population)
