"""`TepoGRPOTrainer` on 2 processes (torchrun, accelerate MULTI_CPU over gloo): the update is exact.

One optimizer step (plain SGD, no gradient clipping, so the update is ``-lr * gradient`` and any error in the
gradient's scale shows) on one fixed global batch of 8 completions, run three ways:

- 1 process, the whole batch in one micro-batch (in this pytest process);
- 2 processes under ``torchrun --nproc_per_node 2``, 4 rows each, one micro-batch each;
- 2 processes, 4 rows each cut into 2 micro-batches of gradient accumulation (``steps_per_generation = GA = 2``).

The parameter update must be the same in all three, and equal ``-lr * grad`` of ``compute_policy_loss`` on the
whole batch computed directly with a plain forward pass, for ``tepo`` (token-mean), ``grpo`` (seq-mean-token-mean)
and ``dr_grpo`` (seq-mean-token-sum-norm), and for ``grpo`` with sequence-level vLLM importance-sampling weights
in the batch (as TRL's ``sequence_mask`` mode leaves them: two sequences at weight 0, still counted). DDP averages gradients over the processes; the adapter's window counts
(``_annotate_counts``: global tokens and sequences of the optimizer window, divided by P) are what make that
average the gradient of the global loss.

Everything TRL and accelerate do runs for real (data loading, TRL's buffering/shuffling/splitting, DDP, gradient
accumulation, the optimizer step); only generation and scoring are replaced by the fixed rollouts, which carry
old log-probs off the current policy so that clipping is active. This file is also the worker that torchrun runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
from datasets import Dataset
from transformers import AutoTokenizer, LlamaForCausalLM
from trl import GRPOConfig

from helpers import run_torchrun_worker
from tepo.integrations.trl import TepoGRPOTrainer
from tepo.losses import compute_policy_loss

# case -> (loss name, whether the batch carries TRL's vLLM importance_sampling_ratio)
CASES = {
    "tepo": ("tepo", False),
    "grpo": ("grpo", False),
    "dr_grpo": ("dr_grpo", False),
    "grpo+is": ("grpo", True),
}
IS_RATIO = torch.tensor([[1.3], [0.0], [0.8], [1.1], [0.0], [0.7], [1.4], [0.9]])  # [N, 1], sequence mode
GLOBAL_ROWS, NUM_GENERATIONS, MAX_COMPLETION, LR = 8, 4, 8, 1.0
# name -> (per_device_train_batch_size, steps_per_generation = gradient_accumulation_steps)
LAYOUTS_2 = {"2 ranks": (4, 1), "2 ranks x GA 2": (2, 2)}


class _FixedRollouts:
    """Mixin placed between `TepoGRPOTrainer` and TRL's `GRPOTrainer`: TRL's generation and scoring return this
    process's contiguous share of the recorded global batch instead of sampling. Everything after generation,
    the adapter's window counts included, runs unchanged."""

    fixed_batch: dict[str, torch.Tensor]

    def _generate_and_score_completions(self, inputs):
        local = len(inputs)
        start = self.accelerator.process_index * local
        out = {}
        for key, value in self.fixed_batch.items():
            out[key] = value if value.dim() == 0 else value[start : start + local]
        return {k: v.to(self.accelerator.device) for k, v in out.items()}


def _trainer_class():
    from trl import GRPOTrainer

    return type("FixedRolloutTepoTrainer", (TepoGRPOTrainer, _FixedRollouts, GRPOTrainer), {})


def _never_called_reward(completions, **kwargs):
    raise AssertionError("generation and scoring are replaced by fixed rollouts")


def one_step_update(model_dir, batch, loss_name, per_device, accumulation, output_dir):
    """Parameter change of one optimizer step of `TepoGRPOTrainer` on ``batch`` (this process's share)."""
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        per_device_train_batch_size=per_device,
        num_generations=NUM_GENERATIONS,
        steps_per_generation=accumulation,
        gradient_accumulation_steps=accumulation,
        max_completion_length=MAX_COMPLETION,
        temperature=1.0,
        max_steps=1,
        learning_rate=LR,
        lr_scheduler_type="constant",
        optim="sgd",
        weight_decay=0.0,
        max_grad_norm=0.0,  # no clipping: the update is -lr * gradient
        beta=0.0,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        bf16=False,
        seed=0,
    )
    cls = _trainer_class()
    cls.fixed_batch = batch
    prompts = [f"{a} + {a} =" for a in range(GLOBAL_ROWS // NUM_GENERATIONS * 4)]
    trainer = cls(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        reward_funcs=_never_called_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        loss_name=loss_name,
    )
    assert trainer._tepo_exact_windows
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    after = trainer.accelerator.unwrap_model(trainer.model).parameters()
    update = torch.cat([(p.detach() - b).flatten() for p, b in zip(after, before)])
    return update, trainer.accelerator


def _case_batch(batch, with_is):
    return {**batch, "importance_sampling_ratio": IS_RATIO} if with_is else batch


def worker(argv):
    """Entry point under torchrun: every loss x 2-rank layout; rank 0 saves the updates."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batch = torch.load(args.batch)
    results = {}
    for case, (name, with_is) in CASES.items():
        for layout, (per_device, accumulation) in LAYOUTS_2.items():
            update, accelerator = one_step_update(
                args.model,
                _case_batch(batch, with_is),
                name,
                per_device,
                accumulation,
                Path(args.out).parent / "run",
            )
            assert accelerator.num_processes == 2, accelerator.num_processes
            assert accelerator.distributed_type.value == "MULTI_CPU", accelerator.distributed_type
            # DDP keeps the replicas identical: every rank took the same step
            gathered = accelerator.gather(update.unsqueeze(0))
            torch.testing.assert_close(gathered[0], gathered[1], rtol=0, atol=0)
            results[f"{case}/{layout}"] = update
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, args.out)


# ----------------------------------------------------------------------------------------------------------
# The test (pytest process).
# ----------------------------------------------------------------------------------------------------------


def _logps(model, batch):
    """Per-token log-probs of the completions under ``model`` (plain forward, temperature 1)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    logits = model(input_ids=input_ids, attention_mask=attention).logits
    comp_len = batch["completion_ids"].shape[1]
    logits = logits[:, -comp_len - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)


def _recorded_batch(model_dir) -> dict[str, torch.Tensor]:
    """8 completions (2 groups of 4) of ragged length, advantages of both signs, old log-probs off-policy."""
    gen = torch.Generator().manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(model_dir)
    rows, prompt_len, comp_len = GLOBAL_ROWS, 4, 7
    mask = torch.ones(rows, comp_len, dtype=torch.long)
    for i, length in enumerate([7, 2, 5, 3, 7, 6, 1, 4]):
        mask[i, length:] = 0
    batch = {
        "prompt_ids": torch.randint(0, model.config.vocab_size, (rows, prompt_len), generator=gen),
        "prompt_mask": torch.ones(rows, prompt_len, dtype=torch.long),
        "completion_ids": torch.randint(0, model.config.vocab_size, (rows, comp_len), generator=gen),
        "completion_mask": mask,
        "advantages": torch.tensor([1.2, -0.4, 0.9, -1.7, 0.5, -0.8, 1.5, -1.2]),
        "num_items_in_batch": mask.sum().float(),
    }
    with torch.no_grad():
        logps = _logps(model, batch)
    batch["old_per_token_logps"] = (logps + 0.3 * torch.randn(logps.shape, generator=gen)) * mask
    return batch


def _direct_update(model_dir, batch, name) -> torch.Tensor:
    """``-lr * grad`` of compute_policy_loss on the whole batch, with no trainer involved."""
    model = LlamaForCausalLM.from_pretrained(model_dir)
    logps = _logps(model, batch)
    ratio = batch.get("importance_sampling_ratio")
    loss, _ = compute_policy_loss(
        name,
        logp=logps,
        is_weights=None if ratio is None else ratio.expand_as(logps),
        old_logp=batch["old_per_token_logps"],
        advantages=batch["advantages"],
        mask=batch["completion_mask"],
        max_len=MAX_COMPLETION,
    )
    loss.backward()
    return torch.cat([-LR * p.grad.flatten() for p in model.parameters()])


def _assert_same_update(got, want, what):
    scale = float(want.abs().max())
    assert scale > 0, what
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


def test_two_rank_update_equals_one_rank_update(tiny_model_dir, tmp_path, one_torch_thread):
    batch = _recorded_batch(tiny_model_dir)
    assert batch["completion_mask"][:4].sum() != batch["completion_mask"][4:].sum()  # unequal shards
    batch_file, out = tmp_path / "batch.pt", tmp_path / "updates.pt"
    torch.save(batch, batch_file)
    run_torchrun_worker(
        __file__, "--model", str(tiny_model_dir), "--batch", str(batch_file), "--out", str(out)
    )
    two_rank = torch.load(out)

    for case, (name, with_is) in CASES.items():
        case_batch = _case_batch(batch, with_is)
        one_rank, _ = one_step_update(tiny_model_dir, case_batch, name, GLOBAL_ROWS, 1, tmp_path / "one")
        direct = _direct_update(tiny_model_dir, case_batch, name)
        _assert_same_update(one_rank, direct, f"{case}: 1 rank vs direct")
        for layout in LAYOUTS_2:
            _assert_same_update(two_rank[f"{case}/{layout}"], one_rank, f"{case}: {layout} vs 1 rank")
    # the cases differ, so the equalities above are not one update compared with itself
    for a, b in (("tepo", "grpo"), ("grpo", "dr_grpo"), ("grpo", "grpo+is")):
        assert not torch.allclose(two_rank[f"{a}/2 ranks"], two_rank[f"{b}/2 ranks"], rtol=1e-3), (a, b)


if __name__ == "__main__":
    worker(sys.argv[1:])
