"""The built-in trainer on a CUDA device (``-m gpu``; skipped, saying so, on a machine without one).

What a CPU run cannot show: the update on the device matches the CPU's (same float32 numerics up to kernel
rounding), the log-prob kernel's hand-written backward on the device, checkpoints moving between devices with the
CUDA RNG state, and a short ``tepo train train.device=cuda`` run (finite metrics, changed weights, exact resume).
scripts/gpu_check.sh runs these and a 3-step run of a random-weight model built from the embedded model's config.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import random_rollout_batch, small_run_overrides, tiny_llama, write_tiny_llama
from update_runs import apply_update

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason=f"no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is False)",
    ),
]
GROUPS, G, PROMPT, RESPONSE = 4, 4, 3, 6


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama with random weights and the embedded model's tokenizer: from $TEPO_MODEL_KIT (the folder
    ``scripts/gpu_check.sh --prepare`` writes) where set, else from the embedded model itself."""
    import os

    from transformers import AutoTokenizer

    kit = os.environ.get("TEPO_MODEL_KIT")
    if kit:
        source = kit
    else:
        from tepo.models import embedded_model_dir

        source = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(source)
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer, max_position_embeddings=256)


def _batch():
    batch = random_rollout_batch(GROUPS, G, PROMPT, RESPONSE, seed=1, vocab=90)
    batch.rollout_logp = torch.full((GROUPS * G, RESPONSE), -3.0) * batch.response_mask
    return batch


def _update(device: str, *, autocast: bool = False):
    """Parameters after two AdamW updates (2 epochs, shuffled) of a tiny Llama on ``device``."""
    from tepo.training.logprob_pass import LogprobSettings, batch_logprobs
    from tepo.training.plan import UpdatePlan, UpdateSettings

    model = tiny_llama(0).train().to(device)
    batch = _batch().to(device)
    settings = LogprobSettings(8, 1.0, autocast, True, "auto")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    old_logp, old_entropy, _ = batch_logprobs(model, batch, settings, entropy=True)
    advantages = torch.linspace(-1.5, 1.5, GROUPS * G, device=device)
    plan = UpdatePlan(UpdateSettings("tepo", {}, 2, GROUPS // 2, G, 1.0, float(RESPONSE)), settings)
    rows = dict(advantages=advantages, mask=batch.response_mask, old_logp=old_logp, old_entropy=old_entropy)
    out = apply_update(model, optimizer, batch, plan, **rows)
    return out, torch.cat([p.detach().flatten().cpu() for p in model.parameters()])


def test_update_on_cuda_matches_the_cpu():
    cpu_out, cpu_params = _update("cpu")
    cuda_out, cuda_params = _update("cuda")
    assert cuda_out["update/optimizer_updates"] == cpu_out["update/optimizer_updates"] == 4
    assert math.isclose(cuda_out["update/loss"], cpu_out["update/loss"], rel_tol=1e-4, abs_tol=1e-6)
    torch.testing.assert_close(cuda_params, cpu_params, rtol=1e-4, atol=1e-5)


def test_bf16_autocast_update_on_cuda_is_finite_and_close():
    _, cpu_params = _update("cpu", autocast=True)
    cuda_out, cuda_params = _update("cuda", autocast=True)
    assert math.isfinite(cuda_out["update/loss"]) and cuda_out["update/optimizer_updates"] == 4
    # bf16 matmuls: the two devices' kernels round apart.
    torch.testing.assert_close(cuda_params, cpu_params, rtol=0, atol=5e-3)


def test_log_prob_kernel_backward_on_cuda_matches_the_cpu():
    from tepo.logprobs import _TargetLogpAndEntropy

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 13, generator=gen)
    targets = torch.randint(0, 13, (7,), generator=gen)
    grads = []
    for device in ("cpu", "cuda"):
        x = logits.to(device).requires_grad_(True)
        logp, entropy = _TargetLogpAndEntropy.apply(x, targets.to(device), 0.7, True)
        (logp.sum() + 0.5 * entropy.sum()).backward()
        grads.append((logp.detach().cpu(), x.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_checkpoints_move_between_devices_with_the_cuda_rng(tmp_path):
    from tepo.checkpoint import (
        find_latest_checkpoint,
        load_checkpoint,
        rng_state,
        save_checkpoint,
        set_rng_state,
    )

    model = tiny_llama(0).to("cuda")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 4, dtype=torch.long, device="cuda")).logits.sum().backward()
    optimizer.step()
    torch.cuda.manual_seed(5)
    state = {"optimizer": optimizer.state_dict(), "rng": rng_state()}
    expected = torch.rand(3, device="cuda")
    save_checkpoint(tmp_path, 1, model, state, keep=1)
    assert "cuda" in state["rng"]
    for device in ("cpu", "cuda"):  # CUDA -> CPU and CUDA -> CUDA
        other = tiny_llama(1).to(device)
        other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
        loaded = load_checkpoint(find_latest_checkpoint(tmp_path), other)
        other_opt.load_state_dict(loaded["optimizer"])
        for a, b in zip(model.parameters(), other.parameters()):
            assert torch.equal(a.cpu(), b.cpu())
        moments = [s["exp_avg"] for s in other_opt.state.values()]
        assert moments and all(m.device.type == device for m in moments)
    set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3, device="cuda"), expected)


def _overrides(tmp_path, model_dir, *extra):
    # an entropy bonus: a non-zero gradient whatever the rewards
    on_cuda = [f"model.name={model_dir}", "train.device=cuda", "algorithm.entropy_coef=0.01", "optim.lr=1e-3"]
    return small_run_overrides(tmp_path, *on_cuda, *extra)


_EXACT = ("train.deterministic=true",)


def test_train_on_cuda_logs_finite_metrics_and_resumes_exactly(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from tepo.config import load_config
    from tepo.metrics import read_metrics
    from tepo.training import resume, train

    straight = train(
        # deterministic: CUDA's index_select backward and memory-efficient attention would differ in the last bits
        load_config(None, _overrides(tmp_path, tiny_model_dir, "train.steps=3", "train.run_name=a", *_EXACT)),
        log=lambda *_: None,
    ).run_dir
    rows = read_metrics(straight / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert (
            math.isfinite(row["update/loss"])
            and math.isfinite(row["update/grad_norm"])
            and row["memory/gpu_peak_mb"] > 0
        )
    initial = load_file(str(tiny_model_dir / "model.safetensors"))
    final = load_file(str(straight / "checkpoints" / "step_000003" / "model.safetensors"))
    assert any(not torch.equal(final[k], initial[k]) for k in final if k in initial)

    stopped = train(
        load_config(None, _overrides(tmp_path, tiny_model_dir, "train.steps=2", "train.run_name=b", *_EXACT)),
        log=lambda *_: None,
    ).run_dir
    resumed = resume(stopped, ["train.steps=3"], log=lambda *_: None).run_dir
    again = load_file(str(resumed / "checkpoints" / "step_000003" / "model.safetensors"))
    for key in final:
        assert torch.equal(final[key], again[key]), key

    def comparable(rs):
        return [
            {k: v for k, v in r.items() if "seconds" not in k and "per_s" not in k and "memory" not in k}
            for r in rs
        ]

    assert comparable(read_metrics(resumed / "metrics.jsonl")) == comparable(rows)


def test_bf16_weights_train_on_cuda(tmp_path, tiny_model_dir):
    from tepo.config import load_config
    from tepo.metrics import read_metrics
    from tepo.training import train

    config = load_config(
        None, _overrides(tmp_path, tiny_model_dir, "train.steps=1", "model.dtype=bfloat16", "eval.size=0")
    )
    run = train(config, log=lambda *_: None).run_dir
    (row,) = read_metrics(run / "metrics.jsonl")
    assert math.isfinite(row["update/loss"]) and row["update/optimizer_updates"] == 1
