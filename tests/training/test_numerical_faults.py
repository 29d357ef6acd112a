"""Numerical faults in training: a step whose loss or gradient is NaN/inf is skipped and counted, never
applied; after ``train.max_bad_steps`` such steps in a row the run stops with ``TrainingStopped`` and its last
good checkpoint is intact. Faults are injected by wrapping the bound policy loss the update calls
(``tepo.losses.compute.BoundPolicyLoss``); everything else
(the embedded model, rollout, reward pool, optimizer, checkpoints) is real."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file

import tepo.training.step
from helpers import small_run_overrides
from tepo.checkpoint import find_latest_checkpoint
from tepo.config import load_config
from tepo.losses.compute import BoundPolicyLoss
from tepo.metrics import read_metrics
from tepo.training import Trainer, TrainingStopped

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("one_torch_thread")]


class _InfGradient(torch.autograd.Function):
    """Identity in the forward pass (the loss stays finite), +inf in the backward pass."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("inf")


def inject(monkeypatch, faults: dict[int, str]) -> list[int]:
    """Make the n-th call (1-based) of the policy loss return a NaN loss ("nan") or an infinite gradient ("inf")."""
    real = BoundPolicyLoss.__call__
    calls = []

    def faulty(self, *args, **kwargs):
        loss, metrics = real(self, *args, **kwargs)
        calls.append(len(calls) + 1)
        fault = faults.get(len(calls))
        if fault == "nan":
            loss = loss * float("nan")
        elif fault == "inf":
            loss = _InfGradient.apply(loss)
        return loss, metrics

    monkeypatch.setattr(BoundPolicyLoss, "__call__", faulty)
    return calls


def tiny(tmp_path, *extra):
    # One micro-batch per step (4 sequences <= micro_batch_size), so loss call n is step n.
    faults = [
        "train.run_name=faults",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "train.micro_batch_size=8",
    ]
    # no evaluation; an entropy bonus: a non-zero gradient whatever the rewards
    rest = ["eval.size=0", "optim.lr=1e-3", "algorithm.entropy_coef=0.01"]
    return load_config("default", small_run_overrides(tmp_path, *faults, *rest, *extra))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _spy_on_updates(monkeypatch) -> dict[int, dict]:
    """Copies of the weights and optimizer state as each step's update begins, by step (1-based)."""
    real = tepo.training.step.update_policy
    seen = {}

    def spy(model, optimizer, *args, **kwargs):
        seen[len(seen) + 1] = {
            "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict()),
            "grads_alive": sum(p.grad is not None for p in model.parameters()),
        }
        return real(model, optimizer, *args, **kwargs)

    monkeypatch.setattr(tepo.training.step, "update_policy", spy)
    return seen


def _same_optimizer(a: dict, b: dict) -> bool:
    if a["state"].keys() != b["state"].keys():
        return False
    return all(
        torch.equal(a["state"][k][name], b["state"][k][name]) for k in a["state"] for name in a["state"][k]
    )


@pytest.mark.slow  # real training steps until the stop: 57 s; the skip-and-count rule keeps unit tests by default
def test_nonfinite_steps_are_skipped_counted_and_stop_the_run(tmp_path, monkeypatch, embedded_model_dir):
    """Steps: 1 NaN loss, 2 good (checkpoint), 3 NaN loss, 4 infinite gradient; max_bad_steps=2.

    Step 1 is skipped and the good step 2 resets the count; steps 3 and 4 are two bad steps in a row, so the run
    stops at step 4 with the step-2 checkpoint intact. No bad step changes a weight or an optimizer moment.
    """
    calls = inject(monkeypatch, {1: "nan", 3: "nan", 4: "inf"})
    seen = _spy_on_updates(monkeypatch)
    config = tiny(tmp_path, "train.steps=6", "train.max_bad_steps=2", "train.save_every=2")
    run_dir = tmp_path / "faults"
    run_dir.mkdir()
    messages = []
    trainer = Trainer(config, run_dir, log=messages.append).setup()
    with pytest.raises(TrainingStopped, match=r"2 steps in a row had a non-finite loss or gradient") as err:
        trainer.run()
    assert "checkpoints" in str(err.value) and "intact" in str(err.value)
    assert calls == [1, 2, 3, 4], "the run went on after the limit, or stopped early"
    assert trainer.step == 4

    rows = read_metrics(run_dir / "metrics.jsonl")
    by_step = {row["step"]: row for row in rows}
    assert [r["step"] for r in rows][:3] == [1, 2, 3] and max(by_step) <= 4
    assert [by_step[s]["update/skipped_updates"] for s in (1, 2, 3)] == [1, 0, 1]
    assert [by_step[s]["update/optimizer_updates"] for s in (1, 2, 3)] == [0, 1, 0]

    initial = load_file(str(embedded_model_dir / "model.safetensors"))
    before_2, before_3 = seen[2]["weights"], seen[3]["weights"]
    # Step 1 (NaN loss) changed nothing; step 2 (good) changed the weights (the entropy gradient is non-zero).
    assert _same({k: before_2[k] for k in initial}, initial)
    assert seen[2]["optimizer"]["state"] == {}, "a skipped first step must not create Adam moments"
    assert not _same({k: before_3[k] for k in initial}, initial)
    # Gradients are freed as soon as they are applied: none idles through the next rollout.
    assert seen[3]["grads_alive"] == 0
    # Steps 3 (NaN loss) and 4 (infinite gradient) changed neither the weights nor Adam's moments.
    current = {k: v.detach() for k, v in trainer.model.state_dict().items()}
    assert _same(current, before_3)
    assert _same_optimizer(trainer.optimizer.state_dict(), seen[3]["optimizer"])
    assert all(torch.isfinite(v).all() for v in current.values())

    # The stopped step wrote no checkpoint; the newest one is intact and holds the last good weights.
    latest = find_latest_checkpoint(run_dir, warn=messages.append)
    assert latest is not None and latest.step == 2
    assert not [m for m in messages if "skipping" in m]
    saved = load_file(str(latest.path / "model.safetensors"))
    assert _same(saved, {k: before_3[k] for k in saved})
    state = torch.load(latest.path / "state.pt", weights_only=True)
    assert state["bad_steps_in_row"] == 0 and state["step"] == 2
    assert _same_optimizer(state["optimizer"], seen[3]["optimizer"])
