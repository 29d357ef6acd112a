"""LoRA training (model.lora): adapters on a real (tiny) Llama, merged export, adapter checkpoints, and a real run
with a stop/resume on the embedded model."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_llama

pytest.importorskip("peft")

from tepo.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tepo.config import ConfigError, LoraConfig, load_config
from tepo.logprobs import response_logprobs
from tepo.lora import (
    AdaptersOff,
    LoraTargetError,
    adapter_state_dict,
    apply_lora,
    merge_lora,
    merged_state_dict,
    scoring,
)

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def _lora(seed=0, **kw):
    model = apply_lora(tiny_llama(seed), LoraConfig(rank=4, alpha=8.0, target_modules=TARGETS, **kw))
    with torch.no_grad():  # B starts at zero; give it values so the adapters change the model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def test_only_adapters_train_and_merged_weights_are_w0_plus_scaled_ba():
    model = _lora()
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all("lora_A" in n or "lora_B" in n for n in trained)
    assert len(trained) == 2 * 7 * 2  # A and B of 7 modules in each of 2 layers
    merged = merged_state_dict(model)
    base = tiny_llama(0).state_dict()
    assert merged.keys() == base.keys()  # the base model's names: what vLLM loads
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight
    expected = base["model.layers.0.self_attn.q_proj.weight"] + (8.0 / 4) * b @ a  # LoRA Eq. 3, alpha / r
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected)
    assert torch.equal(merged["model.norm.weight"], base["model.norm.weight"])
    # peft's own merge agrees, and merged_state_dict left the model unmerged (still trainable)
    assert trained == {n for n, p in model.named_parameters() if p.requires_grad}
    reference = merge_lora(_lora()).state_dict()
    for key, value in reference.items():
        torch.testing.assert_close(merged[key], value, atol=1e-6, rtol=1e-6)


def test_logprobs_of_the_adapted_model_equal_the_merged_model_and_grads_reach_adapters_only():
    model = _lora().train()
    torch.manual_seed(1)
    ids = torch.randint(1, 97, (3, 10))
    mask = torch.ones_like(ids)
    logp, _, _ = response_logprobs(model, ids, mask, response_len=4)
    plain = tiny_llama(0)
    plain.load_state_dict(merged_state_dict(model))
    with torch.no_grad():
        expected, _, _ = response_logprobs(plain, ids, mask, response_len=4)
    torch.testing.assert_close(logp.detach(), expected, atol=1e-5, rtol=1e-5)
    logp.sum().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        else:
            assert p.grad is None, name


def test_the_reference_with_adapters_off_equals_a_copy_of_the_base_model():
    """The LoRA reference (the policy with its adapters switched off) scores exactly as the copy of the base model
    the trainer used to keep, while the adapters are trained away from it; afterwards the policy is as before."""
    base = tiny_llama(0)
    copy_of_base = tiny_llama(0).eval()  # what the trainer kept before: the base model, taken before LoRA
    model = apply_lora(base, LoraConfig(rank=4, alpha=8.0, target_modules=TARGETS))
    with torch.no_grad():  # trained adapters: the policy is no longer the base model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.train()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    torch.manual_seed(1)
    ids = torch.randint(1, 97, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # left padding in one row
    with torch.no_grad():
        policy_before, _, _ = response_logprobs(model, ids, mask, response_len=4)
        expected, _, _ = response_logprobs(copy_of_base, ids, mask, response_len=4)
        with scoring(AdaptersOff(model)) as reference:
            assert reference is model and not model.training  # eval mode, as the copy was
            got, _, _ = response_logprobs(reference, ids, mask, response_len=4)
        policy_after, _, _ = response_logprobs(model, ids, mask, response_len=4)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert (
        policy_before - expected
    ).abs().max() > 1e-3  # the adapters matter, so the equality is not vacuous
    assert torch.equal(policy_after, policy_before) and model.training
    assert trainable == {n for n, p in model.named_parameters() if p.requires_grad}
    plain = tiny_llama(0)
    with scoring(plain) as reference:  # a full-fine-tuning reference is its own frozen copy, used as it is
        assert reference is plain
    with pytest.raises(TypeError, match="peft-wrapped LoRA model"):
        AdaptersOff(plain)


def _lora_kl_config(tmp_path, model_dir, *extra):
    return load_config(
        "default",
        [
            f"model.name={model_dir}",
            "model.lora.rank=4",
            f"model.lora.target_modules={TARGETS}",
            "algorithm.kl_coef=0.01",
            "rollout.backend=hf",
            f"train.output_dir={tmp_path}",
            "train.steps=1",
            "train.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "eval.size=0",
            "train.save_every=0",
            "reward.num_workers=1",
            "log.progress=false",
            *extra,
        ],
    )


def test_a_lora_run_with_a_kl_term_keeps_no_second_model(tmp_path, tiny_model_dir):
    from tepo.training.trainer import Trainer

    trainer = Trainer(
        _lora_kl_config(tmp_path, tiny_model_dir), tmp_path / "lora", log=lambda *_: None
    ).setup()
    assert isinstance(trainer.ref_model, AdaptersOff) and trainer.ref_model.model is trainer.model
    full = _lora_kl_config(tmp_path, tiny_model_dir, "model.lora.rank=0")
    full_trainer = Trainer(full, tmp_path / "full", log=lambda *_: None).setup()
    assert isinstance(full_trainer.ref_model, torch.nn.Module)  # full fine-tuning keeps its frozen copy
    assert full_trainer.ref_model is not full_trainer.model


@pytest.mark.slow  # a real step (sampling, rewards, update): 5-20 s; the test above checks the wiring
def test_a_lora_step_scores_the_reference_with_the_adapters_off(tmp_path, tiny_model_dir, monkeypatch):
    import tepo.training.step as step_module
    from tepo.training.trainer import Trainer

    passes = []  # each no-grad log-prob pass of a step: which module, adapters off?, train mode?
    real_pass = step_module.batch_logprobs

    def spy(model, *args, **kwargs):
        passes.append((model, bool(getattr(model, "_adapters_disabled", False)), model.training))
        return real_pass(model, *args, **kwargs)

    monkeypatch.setattr(step_module, "batch_logprobs", spy)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trainer = Trainer(_lora_kl_config(tmp_path, tiny_model_dir), run_dir, log=lambda *_: None).setup()
    assert trainer.run().steps_done == 1
    # The step's reference pass ran on the policy itself, adapters off, in eval mode; then it was the policy again.
    assert [(m is trainer.model, off, training) for m, off, training in passes if off] == [
        (True, True, False)
    ]
    assert trainer.model.training and not trainer.model._adapters_disabled


def test_missing_target_module_names_the_key():
    with pytest.raises(LoraTargetError, match=r"model\.lora\.target_modules.*c_attn"):
        apply_lora(tiny_llama(0), LoraConfig(rank=4, target_modules="q_proj,c_attn"))


def test_bad_lora_settings_fail_before_any_model_loads():
    with pytest.raises(ConfigError) as err:
        load_config("default", ["model.lora.rank=-2"])
    assert "model.lora.rank" in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config("default", ["model.lora.rank=4", "model.lora.alpha=0", "model.lora.dropout=1"])
    assert "model.lora.alpha" in str(err.value) and "model.lora.dropout" in str(err.value)
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules: empty"):
        load_config("default", ["model.lora.rank=4", "model.lora.target_modules=' , '"])
    assert load_config(
        "default", ["model.lora.target_modules=[q_proj, v_proj]"]
    ).model.lora.target_modules == [
        "q_proj",
        "v_proj",
    ]


def test_checkpoint_holds_the_adapters_and_restores_them(tmp_path):
    model = _lora()
    path = save_checkpoint(tmp_path, 1, model, {"x": 1}, keep=0)
    saved = load_file(str(path / "model.safetensors"))
    assert saved.keys() == adapter_state_dict(model).keys()
    fresh = _lora(seed=0)
    with torch.no_grad():
        for p in adapter_state_dict(fresh).values():
            p.zero_()
    load_checkpoint(Checkpoint(path=path, step=1), fresh)
    for key, value in adapter_state_dict(model).items():
        assert torch.equal(adapter_state_dict(fresh)[key], value)
