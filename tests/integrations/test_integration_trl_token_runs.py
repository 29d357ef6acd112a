"""`TepoGRPOTrainer(advantage_estimator=<token-level>)` trains through ``trainer.train()`` on the tiny Llama with
real generation (issue #44): 2 optimizer steps each, the loss receiving ``[B, T]`` advantages, with the passes
the adapter adds counted; with LoRA the reference log-probs are the adapter-off model's.

That the advantages equal `compute_advantages` on the same inputs, on 1 and 2 processes:
test_integration_trl_token_advantages.py.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("peft")
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoTokenizer, LlamaForCausalLM

from tepo.advantages import compute_advantages
from tepo.integrations.trl import TepoGRPOTrainer
from trl_runner import length_reward, two_step_config


def _trainer(model_dir, tmp_path, name, *, options=None, peft_config=None, **config) -> TepoGRPOTrainer:
    """2 steps of 2 prompts x 2 completions of 8 tokens (tests/trl_runner.py's `two_step_config`), rewarded by
    their length, loss ``grpo``, that records what the estimator and the loss receive."""
    prompts = ["What is 2 + 3? Answer with a number.", "Name a prime number bigger than 10."]
    trainer = TepoGRPOTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        reward_funcs=length_reward,
        args=two_step_config(tmp_path, **config),
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        loss_name="grpo",
        advantage_estimator=name,
        advantage_options=options,
        peft_config=peft_config,
    )
    trainer.recorded = {"estimator": [], "loss": [], "passes": []}
    _record(trainer)
    return trainer


def _record(trainer: TepoGRPOTrainer) -> None:
    """Wrap (on the instance) the estimator's inputs, the loss and the log-prob pass, to record what they get."""
    inputs_of, loss_of, logps_of = (
        trainer._global_estimator_inputs,
        trainer._compute_loss,
        trainer._get_per_token_logps_and_entropies,
    )

    def estimator_inputs(output, old_entropy):
        got = inputs_of(output, old_entropy)
        trainer.recorded["estimator"].append(
            (output, got, trainer._global_rewards())
        )  # output: as the loss gets it
        return got

    def loss(model, inputs):
        trainer.recorded["loss"].append(inputs["advantages"].detach().clone())
        return loss_of(model, inputs)

    def logps(model, *args, **kwargs):
        if not torch.is_grad_enabled():  # the no-grad passes of generation time, not the loss's
            trainer.recorded["passes"].append("policy" if model is trainer.model else "reference")
        return logps_of(model, *args, **kwargs)

    trainer._global_estimator_inputs = estimator_inputs
    trainer._compute_loss = loss
    trainer._get_per_token_logps_and_entropies = logps


def _train_and_check(trainer) -> None:
    """``train()`` moves the trained parameters, logs 2 finite steps, and every advantage the loss received is
    ``[B, T]`` and what the estimator computed from its recorded inputs."""
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in trained]
    trainer.train()
    assert sum(float((p.detach() - b).abs().sum()) for p, b in zip(trained, before)) > 0
    logs = [h for h in trainer.state.log_history if "tepo/loss" in h]
    assert len(logs) == 2 and all(math.isfinite(e["tepo/loss"]) for e in logs)
    assert trainer.recorded["loss"] and all(a.dim() == 2 for a in trainer.recorded["loss"])
    for output, inputs, rewards in trainer.recorded["estimator"]:
        want = compute_advantages(
            trainer.advantage_estimator, rewards.float(), 2, **inputs, **trainer.advantage_options
        )
        assert want.dim() == 2
        torch.testing.assert_close(output["advantages"], want[:, : output["completion_mask"].shape[1]])


def test_erpo_trains_reusing_trls_old_policy_pass(tiny_model_dir, tmp_path, one_torch_thread):
    """steps_per_generation=2 > gradient accumulation 1: TRL makes its own old-policy pass, whose log-probs and
    entropies the estimator reads; the adapter adds only the reference pass (the frozen initial copy)."""
    trainer = _trainer(tiny_model_dir, tmp_path, "erpo")
    _train_and_check(trainer)
    assert len(trainer.recorded["estimator"]) == 1  # one generation for the two steps
    assert trainer.recorded["passes"] == ["policy", "reference"]
    output, inputs, _ = trainer.recorded["estimator"][0]
    assert set(inputs) == {"entropy", "logp", "mask", "ref_logp"}
    assert inputs["logp"].shape == output["old_per_token_logps"].shape
    torch.testing.assert_close(inputs["logp"], output["old_per_token_logps"].float())


def test_entropy_adv_trains_with_one_extra_pass_per_generation(tiny_model_dir, tmp_path, one_torch_thread):
    """steps_per_generation=1: TRL makes no old-policy pass, so the adapter makes one no-grad pass of the policy
    per generation for the entropies (and no reference pass: entropy_adv does not read ref_logp)."""
    trainer = _trainer(
        tiny_model_dir, tmp_path, "entropy_adv", options={"alpha": 0.05}, steps_per_generation=1
    )
    _train_and_check(trainer)
    assert len(trainer.recorded["estimator"]) == 2
    assert trainer.recorded["passes"] == ["policy", "policy"]
    assert trainer._tepo_reference is None


def test_lora_reference_is_the_adapter_off_model(tiny_model_dir, tmp_path, one_torch_thread):
    """ep_grpo with a PEFT adapter (as EP-GRPO's authors trained, in TRL with LoRA) and beta=0: the reference
    log-probs are the base model's (the adapter switched off, as TRL does for its KL term): equal to a plain
    forward of the untouched tiny Llama, and not the policy's. The adapter starts non-zero
    (init_lora_weights=False), so the two differ from the first step."""
    peft = LoraConfig(
        r=4,
        lora_alpha=32,
        target_modules=["q_proj", "v_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    trainer = _trainer(tiny_model_dir, tmp_path, "ep_grpo", peft_config=peft, learning_rate=1e-3)
    assert trainer._tepo_reference is None  # no copy: the adapters are switched off instead
    _train_and_check(trainer)
    output, inputs, _ = trainer.recorded["estimator"][0]
    base = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], 1)
    attention = torch.cat([output["prompt_mask"], output["completion_mask"]], 1)
    width = output["completion_ids"].shape[1]
    with torch.no_grad():
        logits = base(input_ids=ids, attention_mask=attention).logits[:, -width - 1 : -1]
    base_logp = torch.log_softmax(logits.float(), -1).gather(-1, output["completion_ids"].unsqueeze(-1))
    mask = inputs["mask"]
    torch.testing.assert_close(inputs["ref_logp"][mask], base_logp.squeeze(-1)[mask], rtol=1e-5, atol=1e-5)
    assert (inputs["ref_logp"] - inputs["old_logp"])[
        mask
    ].abs().max() > 1e-3  # the policy is not the reference


def test_with_a_kl_term_the_reference_is_trls_own(tiny_model_dir, tmp_path, one_torch_thread):
    """beta > 0: TRL loads its reference model and computes its log-probs; the estimator reads those (no copy of
    the policy is kept, no second reference pass is made)."""
    trainer = _trainer(tiny_model_dir, tmp_path, "erpo", beta=0.04)
    assert trainer._tepo_reference is None and trainer.ref_model is not None
    _train_and_check(trainer)
    assert trainer.recorded["passes"] == ["policy", "reference"]  # TRL's old-policy and reference passes
    output, inputs, _ = trainer.recorded["estimator"][0]
    torch.testing.assert_close(inputs["ref_logp"], output["ref_per_token_logps"].float(), rtol=0, atol=0)
