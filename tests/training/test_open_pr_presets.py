"""The presets of the objectives from open TRL / verl pull requests: each resolves, validates and computes its
loss (and CoDaPO its advantages) on a small batch in the default suite; each trains 2 steps on the real embedded
model under ``-m slow`` (a few minutes each on a loaded 2-core machine)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import small_run_overrides
from loss_cases import random_loss_inputs
from tepo.advantages import compute_advantages
from tepo.config import load_config, validate
from tepo.losses import compute_policy_loss
from tepo.metrics import read_metrics

PRESETS = ["up", "cppo", "topr", "stare", "fipo", "dapo_zv", "codapo"]


@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_resolves_validates_and_its_loss_and_estimator_run(preset):
    config = load_config(preset)
    assert validate(config) == []
    algo = config.algorithm
    assert preset in (algo.loss, algo.advantage)
    gen = torch.Generator().manual_seed(0)
    mask = torch.arange(6).unsqueeze(0) < torch.tensor([[6], [4], [2], [5]])
    inputs = random_loss_inputs(gen, mask)
    adv = compute_advantages(
        algo.advantage,
        torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64),
        2,
        old_logp=inputs["old_logp"],
        mask=mask,
        **algo.advantage_options,
    )
    inputs["advantages"] = adv
    logp = inputs.pop("logp").requires_grad_(True)
    loss, metrics = compute_policy_loss(algo.loss, logp=logp, **inputs, **algo.loss_options)
    loss.backward()
    assert math.isfinite(loss.item()) and logp.grad.abs().sum() > 0
    assert math.isfinite(metrics["policy_loss"])


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("preset", PRESETS)
def test_the_preset_trains_two_steps(tmp_path, preset):
    from tepo.training import train

    overrides = small_run_overrides(
        tmp_path, "train.steps=2", "train.keep_last=1", "algorithm.entropy_coef=0.01"
    )
    result = train(load_config(preset, overrides), log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["update/loss"]) and math.isfinite(row["update/grad_norm"])
