"""TRL's vLLM importance-sampling correction through `TepoGRPOTrainer`: equal to TRL's builtin loss.

TRL (1.16) computes ``importance_sampling_ratio`` during generation when ``use_vllm`` and
``vllm_importance_sampling_correction`` are on, and multiplies it into its per-token policy loss. The adapter
passes the same weights to ``compute_policy_loss(..., is_weights=...)``. Here, for every pair of (tepo loss, TRL
configuration) whose losses coincide without correction, a fixed batch carries a ratio built with TRL's own
formula for each of its four modes (clipped or masked weights included), and the adapter's value and gradient
must equal TRL's builtin ``GRPOTrainer._compute_loss`` on the same batch.

Real TRL and a small real Llama (random weights from a config, the embedded model's tokenizer). vLLM itself is
not run (no GPU): the trainer is built without it and ``use_vllm`` is switched on afterwards only so that TRL's
builtin loss reads the ratio, exactly as it does after a vLLM generation.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer

from trl_runner import loss_and_grad, random_micro_batch, tiny_trainer

CLIP_MIN, CLIP_MAX = 0.6, 1.5
MAX_COMPLETION = 8

# (tepo loss, TRL's importance_sampling_level, TRL's loss_type, beta): pairs that are the same objective.
PAIRS = {
    "tepo=sequence+dapo": ("tepo", "sequence", "dapo", 0.0),
    "grpo=token+grpo": ("grpo", "token", "grpo", 0.0),
    "dr_grpo=token+dr_grpo": ("dr_grpo", "token", "dr_grpo", 0.0),
    # the KL term must not be weighted (TRL adds it after the weighting; tepo weights the policy term only)
    "grpo+kl=token+grpo+beta": ("grpo", "token", "grpo", 0.05),
}
MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


@pytest.fixture(scope="module")
def trainers(tiny_model_dir, tmp_path_factory, one_torch_thread):
    built = {}
    for key, (name, level, loss_type, beta) in PAIRS.items():
        config = dict(
            importance_sampling_level=level,
            loss_type=loss_type,
            epsilon=0.2,
            epsilon_high=0.2,
            beta=beta,
            use_bias_correction_kl=False,
            vllm_importance_sampling_clip_min=CLIP_MIN,
            vllm_importance_sampling_clip_max=CLIP_MAX,
        )
        out = tmp_path_factory.mktemp("out")
        built[key] = tiny_trainer(tiny_model_dir, out, MAX_COMPLETION, config=config, loss_name=name)
    return built


def _trl_ratio(old_logps, sampling_logps, mask, mode):
    """``importance_sampling_ratio`` as TRL's `_generate_and_score_completions` builds it (TRL 1.16)."""
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=CLIP_MIN, max=CLIP_MAX)
    return ratio.masked_fill((ratio < CLIP_MIN) | (ratio > CLIP_MAX), 0.0)


def _batch(trainer, mode, seed=0, rows=6, prompt_len=4, comp_len=7):
    gen = torch.Generator().manual_seed(seed)
    lengths = [7, 5, 3, 6, 2, 7][:rows]
    advantages = [1.0, -0.5, 0.8, -1.2, 0.3, -0.7][:rows]
    batch, logps = random_micro_batch(trainer, gen, lengths, advantages, prompt_len, comp_len)
    old, mask = batch["old_per_token_logps"], batch["completion_mask"]
    # Sequence ratios sum the token log-ratios, so their spread is smaller per token to keep some inside the bounds.
    scale = 0.15 if mode.startswith("sequence") else 0.5
    sampling = old + scale * torch.randn(logps.shape, generator=gen)
    batch["old_per_token_logps"] = old
    batch["sampling_per_token_logps"] = sampling
    batch["importance_sampling_ratio"] = _trl_ratio(old, sampling, mask, mode)
    if trainer.beta != 0.0:
        batch["ref_per_token_logps"] = logps + 0.2 * torch.randn(logps.shape, generator=gen)
    return batch


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pair", list(PAIRS))
def test_adapter_with_vllm_is_correction_equals_trl_builtin(trainers, pair, mode):
    trainer = trainers[pair]
    batch = _batch(trainer, mode)
    ratio, valid = batch["importance_sampling_ratio"], batch["completion_mask"].bool()
    # The weights are not trivial: some differ from 1 on loss tokens, and each mode's bound is hit.
    on_tokens = ratio.expand(valid.shape)[valid]
    assert bool((on_tokens - 1).abs().gt(1e-3).any())
    if mode.endswith("mask"):
        assert bool((on_tokens == 0).any()) and bool((on_tokens > 0).any())
    else:
        assert bool(((on_tokens == CLIP_MIN) | (on_tokens == CLIP_MAX)).any())

    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = mode
    try:
        want, want_grad = loss_and_grad(
            trainer, lambda: GRPOTrainer._compute_loss(trainer, trainer.model, batch)
        )
        got, got_grad = loss_and_grad(trainer, lambda: trainer._compute_loss(trainer.model, batch))
        # and the correction matters: without the ratio, both losses change
        unweighted = {k: v for k, v in batch.items() if k != "importance_sampling_ratio"}
        trainer.use_vllm = False
        plain, _ = loss_and_grad(trainer, lambda: trainer._compute_loss(trainer.model, unweighted))
        plain_trl, _ = loss_and_grad(
            trainer, lambda: GRPOTrainer._compute_loss(trainer, trainer.model, unweighted)
        )
    finally:
        trainer.use_vllm = False
    assert math.isfinite(want.item()) and want.item() != 0.0
    # float32: TRL adds the KL per token before aggregating, tepo aggregates each term, so the last bits differ
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert float(want_grad.abs().max()) > 0
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6 * float(want_grad.abs().max()))
    torch.testing.assert_close(plain, plain_trl, rtol=1e-5, atol=1e-7)
    assert abs(plain.item() - got.item()) > 1e-6
