"""LoRA training (model.lora): adapters on a real (tiny) Llama, merged export, adapter checkpoints, and a real run
with a stop/resume on the embedded model."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_llama

pytest.importorskip("peft")

from tepo.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from tepo.config import ConfigError, LoraConfig, load_config
from tepo.logprobs import response_logprobs
from tepo.lora import LoraTargetError, adapter_state_dict, apply_lora, merge_lora, merged_state_dict

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
    logp, _ = response_logprobs(model, ids, mask, response_len=4)
    plain = tiny_llama(0)
    plain.load_state_dict(merged_state_dict(model))
    with torch.no_grad():
        expected, _ = response_logprobs(plain, ids, mask, response_len=4)
    torch.testing.assert_close(logp.detach(), expected, atol=1e-5, rtol=1e-5)
    logp.sum().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), name
        else:
            assert p.grad is None, name


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


@pytest.mark.slow  # two real runs of the embedded model (minutes); the LoRA + vLLM run in test_rollout_parity is default
@pytest.mark.model
def test_lora_run_resumes_exactly_and_evaluates_merged(tmp_path):
    """``tepo train model.lora.rank=16`` on the embedded model: a run stopped after 1 step and resumed ends
    bit-identical to an uninterrupted 2-step run; checkpoints hold the adapters; eval loads the merged model."""
    from tepo.evaluate.loading import load_eval_model
    from tepo.metrics import read_metrics
    from tepo.models import load_model_and_tokenizer
    from tepo.training import resume, train
    from test_train_e2e import _comparable, tiny

    common = ["model.lora.rank=16", "model.lora.alpha=32", f"model.lora.target_modules={TARGETS}"]
    common += ["eval.size=0", "optim.lr=1e-3", "algorithm.kl_coef=0.01", "algorithm.entropy_coef=0.01"]
    messages = []
    straight = train(tiny(tmp_path, "train.run_name=straight", "train.steps=2", *common), log=messages.append)
    assert any("LoRA rank 16" in m for m in messages)
    final = straight.run_dir / "checkpoints" / "step_000002"
    a = load_file(str(final / "model.safetensors"))
    assert a and all(".lora_A." in k or ".lora_B." in k for k in a)
    assert (final / "model.safetensors").stat().st_size < 30e6  # 4.9M adapter parameters, not 135M
    assert any(float(t.abs().max()) > 0 for k, t in a.items() if "lora_B" in k)  # trained
    rows_a = read_metrics(straight.run_dir / "metrics.jsonl")

    stopped = train(tiny(tmp_path, "train.run_name=stopped", "train.steps=1", *common), log=lambda *_: None)
    messages = []
    resumed = resume(stopped.run_dir, ["train.steps=2"], log=messages.append).run_dir
    assert any("resumed" in m and "step 1" in m for m in messages)
    b = load_file(str(resumed / "checkpoints" / "step_000002" / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert _comparable(rows_a) == _comparable(read_metrics(resumed / "metrics.jsonl"))
    shutil.rmtree(resumed / "checkpoints")

    merged, _, info = load_eval_model(straight.run_dir)
    assert info["kind"] == "run" and not hasattr(merged, "peft_config")
    base, _ = load_model_and_tokenizer(None)
    state, reference = merged.state_dict(), base.state_dict()
    q = "model.layers.0.self_attn.q_proj.weight"
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    delta = (32 / 16) * a[f"{prefix}.lora_B.default.weight"] @ a[f"{prefix}.lora_A.default.weight"]
    torch.testing.assert_close(state[q], reference[q] + delta)
    assert torch.equal(state["model.norm.weight"], reference["model.norm.weight"])
