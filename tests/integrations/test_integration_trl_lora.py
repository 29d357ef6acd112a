"""`TepoGRPOTrainer` with TRL's own ``peft_config`` (a real peft LoRA) and a tepo loss: only the adapters train."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")
from peft import LoraConfig

from trl_runner import embedded_model_trainer

pytestmark = pytest.mark.model


def test_two_step_lora_run_trains_the_adapters_only(tmp_path):
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = embedded_model_trainer(
        tmp_path, loss_name="tepo", peft_config=peft_config, config={"learning_rate": 1e-3}
    )
    named = dict(trainer.model.named_parameters())
    trained = {n for n, p in named.items() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    before = {n: p.detach().clone() for n, p in named.items()}
    trainer.train()
    moved = {n for n, p in trainer.model.named_parameters() if not bool((p.detach() == before[n]).all())}
    assert moved and moved <= trained  # the base weights are untouched
    assert any("lora_B" in n for n in moved)
    logs = [h for h in trainer.state.log_history if "tepo/loss" in h]
    assert len(logs) == 2 and all(math.isfinite(e["tepo/loss"]) for e in logs)
