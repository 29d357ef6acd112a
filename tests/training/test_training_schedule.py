"""The learning-rate schedule follows planned updates: a skipped (non-finite) update still advances it, so the
learning rate at a step depends on the step alone, as with verl's and the transformers Trainer's schedulers."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import tiny_llama
from tepo.config import load_config
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings
from tepo.training.plan import UpdatePlan, UpdateSettings
from tepo.training.schedule import lr_factor, updates_per_step
from tepo.training.update import RowTensors, update_policy


def test_lr_factor_closed_form():
    c = load_config("default", ["optim.warmup_steps=2", "optim.schedule=cosine"])
    f = lr_factor(c, total_updates=6)
    assert [f(0), f(1)] == [0.5, 1.0]
    # After warm-up: 0.5 (1 + cos(pi (u - 2) / 4)).
    assert [f(u) for u in range(2, 7)] == pytest.approx(
        [1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.5 * (1 + math.cos(3 * math.pi / 4)), 0.0]
    )
    linear = lr_factor(load_config("default", ["optim.schedule=linear"]), total_updates=4)
    assert [linear(u) for u in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]


def test_updates_per_step_counts_epochs_and_mini_batches():
    c = load_config(
        "default", ["train.prompts_per_step=5", "train.mini_batch_prompts=2", "train.ppo_epochs=3"]
    )
    assert updates_per_step(c) == 9


def _tiny_batch() -> RolloutBatch:
    ids = torch.tensor([[3, 4, 5, 6], [3, 4, 7, 0], [3, 5, 8, 9], [3, 5, 6, 0]])
    att = (ids != 0).long()
    return RolloutBatch(
        input_ids=ids,
        attention_mask=att,
        response_mask=att[:, 2:].float(),
        response_len=2,
        prompt_index=torch.tensor([0, 0, 1, 1]),
        texts=["a", "b", "c", "d"],
        truncated=torch.zeros(4, dtype=torch.bool),
        gen_seconds=0.0,
        num_generated_tokens=6,
    )


def test_a_skipped_update_still_advances_the_schedule(monkeypatch):
    model = tiny_llama(0).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.0)
    config = load_config("default", ["optim.warmup_steps=4"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(config, total_updates=8))
    calls = []
    batch = _tiny_batch()
    plan = UpdatePlan(
        UpdateSettings(
            loss="grpo",
            loss_options={},
            epochs=1,
            mini_batch_groups=1,
            group_size=2,
            max_grad_norm=1.0,
            max_len=2.0,
        ),
        LogprobSettings(
            micro_batch_size=2,
            temperature=1.0,
            autocast_bf16=False,
            share_prompt_prefix=False,
            train_attention="model",
        ),
    )
    real = plan.loss

    def nan_on_first_call(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 1 else loss), metrics

    object.__setattr__(
        plan, "loss", nan_on_first_call
    )  # the loss the plan bound (frozen), first call non-finite
    out = update_policy(
        model,
        optimizer,
        scheduler,
        batch,
        RowTensors(advantages=torch.tensor([1.0, -1.0, 0.5, -0.5]), mask=batch.response_mask),
        plan,
        generator=torch.Generator().manual_seed(0),
    )
    assert (out.metrics["update/skipped_updates"], out.metrics["update/optimizer_updates"]) == (1, 1)
    # Two planned updates (one per group): warm-up factor (2 + 1) / 4 whether or not the first was applied.
    assert scheduler.last_epoch == 2
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.75)
