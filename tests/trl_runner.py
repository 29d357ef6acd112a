"""The TRL builders of the TRL integration and parity tests (tests/integrations/test_integration_trl*.py,
test_parity_trl_*.py): trainers on the embedded model or on the tiny Llama of ``tiny_model_dir``, a fixed
float64 batch fed to a trainer's loss in place of its log-prob pass, and the loss-and-gradient of a call.

Import it after ``pytest.importorskip("trl")``: it imports TRL.
"""

from __future__ import annotations

import torch
from datasets import Dataset
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig

from helpers import one_window_grpo_config
from tepo.integrations.trl import TepoGRPOTrainer

F64 = torch.float64
N, T = 4, 5  # the rows and completion tokens of `float64_batch`


def length_reward(completions, **kwargs):
    """Deterministic stand-in reward: completion length in characters / 32 (not a correctness check)."""
    return [len(c) / 32.0 for c in completions]


def unused_reward(completions, **kwargs):
    """Never called (no generation); GRPOTrainer requires a reward function."""
    return [0.0 for _ in completions]


def _two_prompts(n: int = 2) -> Dataset:
    prompts = ["What is 2 + 3? Answer with a number.", "Name a prime number bigger than 10."]
    return Dataset.from_list([{"prompt": prompts[i % len(prompts)]} for i in range(n)])


def two_step_config(tmp_path, **overrides) -> GRPOConfig:
    """A 2-step CPU run of 2 prompts x 2 completions of 8 tokens, float32, logged every step, seed 0: the
    one-window config with 2 rows per device and 2 steps per generation."""
    run = dict(
        per_device_train_batch_size=2,
        steps_per_generation=2,
        max_steps=2,
        learning_rate=1e-5,
        logging_steps=1,
        temperature=1.0,
        use_bias_correction_kl=False,
    )
    return one_window_grpo_config(tmp_path, 8, **{**run, **overrides})


def embedded_model_trainer(tmp_path, model=None, tokenizer=None, **kwargs) -> TepoGRPOTrainer:
    """`TepoGRPOTrainer` of `two_step_config` (``config=`` overrides it) on ``model`` (default: the embedded
    model), rewarded by `length_reward`; other ``kwargs`` go to the trainer."""
    from tepo.models import load_model_and_tokenizer

    config_overrides = kwargs.pop("config", {})
    if model is None:
        model, tokenizer = load_model_and_tokenizer(None)
    return TepoGRPOTrainer(
        model=model,
        reward_funcs=length_reward,
        args=two_step_config(tmp_path, **config_overrides),
        train_dataset=_two_prompts(),
        processing_class=tokenizer,
        **kwargs,
    )


def tiny_trainer(
    model_dir,
    output_dir,
    completion_tokens: int,
    *,
    trainer_cls=TepoGRPOTrainer,
    reward=unused_reward,
    model=None,
    tokenizer=None,
    config: dict | None = None,
    **kwargs,
):
    """``trainer_cls`` (TRL's ``GRPOTrainer`` or `TepoGRPOTrainer`) on the Llama and tokenizer at ``model_dir`` (or
    the ``model`` / ``tokenizer`` given), with `one_window_grpo_config` and ``config`` over it, in training mode,
    ready for direct ``_compute_loss`` calls; other ``kwargs`` go to the trainer."""
    trainer = trainer_cls(
        model=model if model is not None else LlamaForCausalLM.from_pretrained(model_dir),
        reward_funcs=reward,
        args=one_window_grpo_config(output_dir, completion_tokens, **(config or {})),
        train_dataset=Dataset.from_list([{"prompt": "2 + 3 ="}] * 4),
        processing_class=tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model_dir),
        **kwargs,
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which these tests do not run
    return trainer


def float64_batch(
    seed=0, lengths=(T, T - 2, 2, T - 1), *, logp_noise=0.3, sampling=True, entropy_scale=2.0
) -> dict:
    """N x T float64 log-probs (current, old, reference and, with ``sampling``, the sampler's), entropies in
    ``[0, entropy_scale)``, sequence advantages and a 0/1 mask of the given row ``lengths``."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(N, T, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, length:] = 0
    old = -torch.rand(N, T, generator=gen, dtype=F64) * 2 - 0.1
    batch = {
        "logp": old + logp_noise * torch.randn(N, T, generator=gen, dtype=F64),
        "old": old,
        "ref": old + 0.3 * torch.randn(N, T, generator=gen, dtype=F64),
    }
    if sampling:
        batch["sampling"] = old + 0.2 * torch.randn(N, T, generator=gen, dtype=F64)
    batch["entropy"] = torch.rand(N, T, generator=gen, dtype=F64) * entropy_scale
    batch["adv"] = torch.tensor([1.0, -0.5, 0.8, -1.2], dtype=F64)
    batch["mask"] = mask
    return batch


def run_loss(trainer, loss_fn, b, sampling=False):
    """``loss_fn(trainer, model, inputs)`` on batch ``b`` of `float64_batch` (the trainer's log-prob pass returns
    its log-probs and entropies): value, gradients w.r.t. logp and entropy, and the metrics it logged."""
    logp = b["logp"].clone().requires_grad_(True)
    entropy = b["entropy"].clone().requires_grad_(True)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, entropy, None)
    inputs = {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": b["mask"],
        "advantages": b["adv"],
        "old_per_token_logps": b["old"],
        "ref_per_token_logps": b["ref"],
        "num_items_in_batch": b["mask"].sum().to(F64),
    }
    if sampling:
        inputs["sampling_per_token_logps"] = b["sampling"]
    trainer._metrics["train"].clear()
    loss = loss_fn(trainer, trainer.model, inputs)
    loss.backward()
    zeros = torch.zeros_like(entropy)
    grad_h = entropy.grad if entropy.grad is not None else zeros
    logged = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    return loss.detach(), logp.grad, grad_h, logged


def loss_and_grad(trainer, fn):
    """``fn()``'s loss and the flattened gradient of the trainer's model, gradients cleared before and after."""
    trainer.model.zero_grad(set_to_none=True)
    loss = fn()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
    trainer.model.zero_grad(set_to_none=True)
    return loss.detach(), grads


def policy_logps(trainer, batch, **options):
    """The trainer's own log-prob pass over a TRL micro-batch's prompts and completions: (logps, entropies, _)."""
    return trainer._get_per_token_logps_and_entropies(
        trainer.model,
        torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1),
        torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1),
        batch["completion_ids"].shape[1],
        **options,
    )


def random_micro_batch(trainer, gen, lengths, advantages, prompt_len: int, comp_len: int, slices: int = 1):
    """A TRL micro-batch drawn from ``gen``: random prompt and completion ids, completions of the given
    ``lengths``, ``num_items_in_batch`` as if it were 1 of ``slices``, and old log-probs 0.3-noise off the
    policy's (``trainer``'s own pass, returned beside the batch as ``logps``)."""
    rows = len(lengths)
    vocab = trainer.model.config.vocab_size
    mask = torch.ones(rows, comp_len, dtype=torch.long)
    for i, length in enumerate(lengths):
        mask[i, length:] = 0
    batch = {
        "prompt_ids": torch.randint(0, vocab, (rows, prompt_len), generator=gen),
        "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (rows, comp_len), generator=gen),
        "completion_mask": mask,
        "advantages": torch.tensor(advantages),
        "num_items_in_batch": torch.tensor(float(mask.sum() * slices)),
    }
    with torch.no_grad():
        logps, _, _ = policy_logps(trainer, batch)
    # Old policy a little off the current one, so ratios differ from 1 and some get clipped.
    batch["old_per_token_logps"] = logps + 0.3 * torch.randn(logps.shape, generator=gen)
    return batch, logps
