"""A step is handed its parts: ``train_step(parts, plan, ...)`` runs from a ``StepParts`` built without any
``Trainer``, and the rollout correction is computed once per step (each token's weight once; its metrics from
those weights, equal to a whole-batch call)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tepo.training.step as step_module
import tepo.training.update as update_module
from tepo.config import load_config
from tepo.data import Problem, PromptStream
from tepo.losses.rollout_correction import rollout_correction_weights
from tepo.metrics.catalogue import in_group
from tepo.rewards import RewardPool
from tepo.rollout.hf import HFRollout
from tepo.training.overlap import RolloutPrefetch
from tepo.training.parts import StepParts, build_step_parts
from tepo.training.plan import plan_step
from tepo.training.step import collect_step, train_step

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=1, timeout_s=10.0) as p:
        yield p


def _parts(tiny_model_dir, tmp_path, *overrides: str):
    """A tiny model's run parts, as a tool would build them: no Trainer anywhere."""
    from tepo.models import load_model_and_tokenizer

    config = load_config(
        "default",
        [
            f"model.name={tiny_model_dir}",
            "rollout.backend=hf",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "log.samples_every=0",
            "algorithm.entropy_coef=0.01",  # a non-zero gradient whatever the rewards
            *overrides,
        ],
    )
    plan = plan_step(config, backend="hf")
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(str(tiny_model_dir))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    problems = [Problem(id=f"p{i}", problem=f"What is {i} + 1?", answer=str(i + 1)) for i in range(4)]
    parts = build_step_parts(
        config,
        model=model,
        ref_model=None,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        rollout=HFRollout(model, tokenizer, autocast_bf16=False),
        tokenizer=tokenizer,
        stream=PromptStream(problems, seed=0),
        device=torch.device("cpu"),
        run_dir=tmp_path,
    )
    return parts, plan


def test_train_step_runs_from_parts_built_without_a_trainer(tiny_model_dir, tmp_path, pool):
    parts, plan = _parts(tiny_model_dir, tmp_path)
    assert isinstance(parts, StepParts) and not plan.needs_old_pass
    before = [p.detach().clone() for p in parts.model.parameters()]
    row = train_step(parts, plan, pool, step=4)
    assert row["step"] == 5 and row["rollout/num_sequences"] == 4
    assert row["update/optimizer_updates"] == 1
    assert "mismatch/kl_k3" in row  # the HF sampler's own log-probs
    assert any(not torch.equal(a, b) for a, b in zip(before, parts.model.parameters(), strict=True))
    # The step writes nothing back into its parts.
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts.model = None  # type: ignore[misc]


def _count_corrections(monkeypatch) -> dict:
    """Rows given to each correction function during a step, and the update's batch and pre-update log-probs."""
    seen = {"update_rows": 0, "step_rows": 0}
    in_update = update_module.rollout_correction_tokens
    in_step = step_module.rollout_correction_weights
    update_policy = step_module.update_policy

    def counting_update(old, rollout_logp, mask, **kw):
        seen["update_rows"] += old.shape[0]
        return in_update(old, rollout_logp, mask, **kw)

    def counting_step(old, rollout_logp, mask, **kw):
        seen["step_rows"] += old.shape[0]
        return in_step(old, rollout_logp, mask, **kw)

    def recording_update(model, optimizer, scheduler, batch, tensors, plan, **kw):
        out = update_policy(model, optimizer, scheduler, batch, tensors, plan, **kw)
        seen["batch"], seen["token_logp"] = batch, out.token_logp.clone()
        return out

    monkeypatch.setattr(update_module, "rollout_correction_tokens", counting_update)
    monkeypatch.setattr(step_module, "rollout_correction_weights", counting_step)
    monkeypatch.setattr(step_module, "update_policy", recording_update)
    return seen


@pytest.mark.parametrize("mode", ["tis", "seq_tis"])
def test_an_in_update_correction_is_computed_once_and_its_metrics_are_the_whole_batchs(
    tiny_model_dir, tmp_path, pool, monkeypatch, mode
):
    # A cap of 1.0001 caps some tokens (the HF sampler's scores differ from the trainer's in the last bits);
    # one row per micro-batch: the weights are put together from four calls.
    parts, plan = _parts(
        tiny_model_dir,
        tmp_path,
        f"algorithm.rollout_correction={mode}",
        "algorithm.rollout_correction_options.cap=1.0001",
        "train.micro_batch_size=1",
    )
    assert not plan.needs_old_pass and plan.update.correction is not None
    seen = _count_corrections(monkeypatch)
    row = train_step(parts, plan, pool, step=0)
    n = row["rollout/num_sequences"]
    assert seen["update_rows"] == n, "each row's weights once"
    assert seen["step_rows"] == 0, "no second whole-batch computation for the metrics"
    batch = seen["batch"]
    expected = in_group(  # the step names the correction's metrics in the mismatch group
        "mismatch",
        rollout_correction_weights(
            seen["token_logp"], batch.rollout_logp, batch.response_mask, mode=mode, cap=1.0001
        )[2],
    )
    got = {key: row[key] for key in expected}
    if mode == "tis":
        assert got == expected  # token weights: bit for bit those of one whole-batch call
    else:  # a row's log-ratio sum over its trimmed columns may differ in the last bit
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)


def test_with_an_old_pass_the_step_computes_the_correction_once(tiny_model_dir, tmp_path, pool, monkeypatch):
    parts, plan = _parts(tiny_model_dir, tmp_path, "algorithm.rollout_correction=mis")
    assert plan.needs_old_pass and plan.update.correction is None
    seen = _count_corrections(monkeypatch)
    row = train_step(parts, plan, pool, step=0)
    assert seen["update_rows"] == 0
    assert seen["step_rows"] == row["rollout/num_sequences"]
    assert "mismatch/is_dropped_frac" in row


class _StagingRollout(HFRollout):
    """The HF backend with the staging calls of an engine that samples during the update (as vLLM's)."""

    staged = 0

    def stage_weights(self) -> float:
        self.staged += 1
        return 0.0

    def end_staging(self) -> None:
        self.staged -= 1


def test_an_overlapped_rollout_samples_from_the_parts_what_the_step_would(tiny_model_dir, tmp_path, pool):
    parts, plan = _parts(tiny_model_dir, tmp_path)
    parts = dataclasses.replace(
        parts, rollout=_StagingRollout(parts.model, parts.tokenizer, autocast_bf16=False)
    )
    prefetch = RolloutPrefetch(parts, pool)
    try:
        prefetch.start(0)
        assert prefetch.stream_state == {"epoch": 0, "offset": 0}  # before the in-flight batch's prompts
        assert prefetch.take(1) is None  # nothing in flight for another step
        collected = prefetch.take(0)
    finally:
        prefetch.close()
    assert parts.rollout.staged == 0
    assert collected.metrics["rollout/policy_lag"] == 1
    # The same prompts and seeds as the synchronous loop: a fresh stream gives the same batch.
    again = collect_step(
        dataclasses.replace(parts, stream=PromptStream(parts.stream.problems, seed=0)), pool, 0
    )
    assert collected.batch.texts == again.batch.texts
    assert torch.equal(collected.rewards, again.rewards)
    row = train_step(parts, plan, pool, 0, collected)
    assert row["rollout/policy_lag"] == 1 and row["update/optimizer_updates"] == 1
