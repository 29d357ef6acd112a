"""Token-level advantage estimators inside `TepoGRPOTrainer` (issue #44): the ``[B, T]`` advantages the loss
receives are `tepo.advantages.compute_advantages` on the same inputs, on 1 process and on 2 (torchrun, gloo).

One fixed global batch of 12 completions (3 groups of 4, the middle group split between the two processes
when there are two) goes through ``trainer.train()`` for one optimizer step; only generation and scoring are
replaced (the rollouts and their rewards are recorded), everything after them runs: the adapter's passes at
advantage time (the sampling policy's log-probs and entropies, the reference's log-probs), the gathering over
processes, TRL's shuffling and splitting into micro-batches, the loss. Each process trims its completions to
its own longest one, as TRL pads per process, so the gathered tensors are of unequal widths.

The policy is moved off its initial weights after the trainer is built, so the reference (the frozen copy of
the initial policy that the adapter keeps when ``beta == 0``) differs from the sampling policy: the expected
advantages use a plain forward pass (``log_softmax`` of the logits) of the moved model for ``old_logp`` /
``logp`` / ``entropy`` and of the initial model for ``ref_logp``. This file is also the worker that torchrun
runs.
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
from trl import GRPOConfig, GRPOTrainer

from helpers import run_torchrun_worker
from tepo.advantages import compute_advantages
from tepo.integrations.trl import TepoGRPOTrainer

ROWS, GROUP, COMPLETION, PROMPT = 12, 4, 7, 4
LENGTHS = [7, 2, 5, 3, 6, 6, 1, 4, 6, 3, 5, 2]  # rank 0 (rows 0-5) reaches 7 tokens, rank 1 only 6
ESTIMATORS = {"erpo": {}, "entropy_adv": {"alpha": 0.05}, "ep_grpo": {"num_buckets": 3}}
NOISE, HEAD_SCALE = 0.05, 50.0  # how far the policy is moved from its initial weights


class _FixedRollouts:
    """Mixin between `TepoGRPOTrainer` and TRL's `GRPOTrainer`: generation and scoring return this process's
    contiguous share of the recorded batch, trimmed to its longest completion, and record the rewards of every
    process as TRL's ``_calculate_rewards`` would (gathered, ``[N, 1]``)."""

    fixed_batch: dict[str, torch.Tensor]

    def _generate_and_score_completions(self, inputs):
        local = len(inputs)
        start = self.accelerator.process_index * local
        rows = slice(start, start + local)
        width = int(self.fixed_batch["completion_mask"][rows].sum(-1).max())
        out = {
            "prompt_ids": self.fixed_batch["prompt_ids"][rows],
            "prompt_mask": self.fixed_batch["prompt_mask"][rows],
            "completion_ids": self.fixed_batch["completion_ids"][rows, :width],
            "completion_mask": self.fixed_batch["completion_mask"][rows, :width],
            "advantages": torch.zeros(local),
            "num_items_in_batch": self.fixed_batch["completion_mask"].sum().float(),
        }
        self._tepo_rewards_per_func = self.fixed_batch["rewards"].unsqueeze(1)
        return out


class _RecordingTrainer(TepoGRPOTrainer, _FixedRollouts, GRPOTrainer):
    """Records the completions and advantages of every micro-batch the loss receives."""

    def _compute_loss(self, model, inputs):
        self.seen.append({k: inputs[k].detach().clone() for k in ("completion_ids", "advantages")})
        return super()._compute_loss(model, inputs)


def _never_called_reward(completions, **kwargs):
    raise AssertionError("generation and scoring are replaced by fixed rollouts")


def _move_off_initial(model: torch.nn.Module) -> None:
    """The same deterministic perturbation of every weight, on every process, and a sharper LM head: the random
    initial Llama is nearly uniform (entropies all about ln V), and the z-scores of erpo would amplify float32
    rounding; with logits ~50x larger the entropies and log-probs spread over a wide range."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(NOISE * torch.randn(param.shape, generator=gen))
        model.get_output_embeddings().weight.mul_(HEAD_SCALE)


def seen_advantages(model_dir, batch, name, options, per_device, output_dir):
    """One optimizer step of `TepoGRPOTrainer` with estimator ``name`` on ``batch``: what its loss received."""
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        per_device_train_batch_size=per_device,
        num_generations=GROUP,
        steps_per_generation=2,
        gradient_accumulation_steps=2,
        max_completion_length=COMPLETION,
        max_steps=1,
        beta=0.0,
        report_to="none",
        save_strategy="no",
        bf16=False,
        seed=0,
    )
    _RecordingTrainer.fixed_batch = batch
    trainer = _RecordingTrainer(
        model=LlamaForCausalLM.from_pretrained(model_dir),
        reward_funcs=_never_called_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": f"{a} + {a} ="} for a in range(ROWS)]),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        loss_name="grpo",
        advantage_estimator=name,
        advantage_options=options,
    )
    trainer.seen = []
    _move_off_initial(trainer.model)
    trainer.train()
    return trainer.seen, trainer.accelerator


def worker(argv):
    """Entry point under torchrun: every estimator on 2 processes; each rank saves what its loss received."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batch = torch.load(args.batch)
    results = {}
    for name, options in ESTIMATORS.items():
        seen, accelerator = seen_advantages(
            args.model, batch, name, options, ROWS // 2 // 2, Path(args.out).parent / "run"
        )
        assert accelerator.num_processes == 2 and accelerator.distributed_type.value == "MULTI_CPU"
        results[name] = seen
    torch.save(results, f"{args.out}.{os.environ['RANK']}")


# ----------------------------------------------------------------------------------------------------------
# The tests (pytest process).
# ----------------------------------------------------------------------------------------------------------


def _recorded_batch(model_dir) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    vocab = LlamaForCausalLM.from_pretrained(model_dir).config.vocab_size
    mask = torch.zeros(ROWS, COMPLETION, dtype=torch.long)
    for i, length in enumerate(LENGTHS):
        mask[i, :length] = 1
    return {
        "prompt_ids": torch.randint(0, vocab, (ROWS, PROMPT), generator=gen),
        "prompt_mask": torch.ones(ROWS, PROMPT, dtype=torch.long),
        "completion_ids": torch.randint(0, vocab, (ROWS, COMPLETION), generator=gen) * mask,
        "completion_mask": mask,
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0]),
    }


def _plain_logps_and_entropy(model, batch):
    """Log-probs of the completions and token entropies from the full logits (no TRL code involved)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, PROMPT - 1 : -1].float()
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def _expected(model_dir, batch, name, options, ref_is_initial=True):
    """compute_advantages on the plain-forward inputs: the moved policy's, and the initial model's reference."""
    policy = LlamaForCausalLM.from_pretrained(model_dir)
    _move_off_initial(policy)
    logp, entropy = _plain_logps_and_entropy(policy, batch)
    ref = _plain_logps_and_entropy(LlamaForCausalLM.from_pretrained(model_dir), batch)[0]
    mask = batch["completion_mask"].bool()
    inputs = dict(logp=logp, old_logp=logp, entropy=entropy, ref_logp=ref if ref_is_initial else logp)
    return compute_advantages(name, batch["rewards"], GROUP, mask=mask, **inputs, **options)


def _by_row(seen, batch) -> torch.Tensor:
    """The advantages the loss received, put back in the rows of ``batch`` (completions are unique)."""
    got = torch.full((ROWS, COMPLETION), float("nan"))
    for micro in seen:
        assert micro["advantages"].dim() == 2, "the loss received sequence-level advantages"
        for ids, adv in zip(micro["completion_ids"], micro["advantages"]):
            width = ids.shape[0]
            matches = [i for i in range(ROWS) if torch.equal(batch["completion_ids"][i, :width], ids)]
            assert len(matches) == 1, matches
            got[matches[0], :width] = adv
    mask = batch["completion_mask"].bool()
    assert not torch.isnan(got[mask]).any(), "some rows never reached the loss"
    return torch.where(mask, got, 0.0)


def _assert_equal_advantages(got, want, wrong, what):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=lambda m: f"{what}: {m}")
    # the comparison can fail: the advantages with a wrong input (the reference or the entropies) differ
    assert (wrong - want).abs().max() > 1e-3, what


def _wrong_input(model_dir, batch, name, options):
    """Advantages computed from a wrong input: erpo and ep_grpo with the policy as their reference; entropy_adv
    without its entropy bonus (the sequence-level grpo advantage broadcast over the tokens)."""
    if name in ("erpo", "ep_grpo"):
        return _expected(model_dir, batch, name, options, ref_is_initial=False)
    mask = batch["completion_mask"].bool()
    return torch.where(mask, compute_advantages("grpo", batch["rewards"], GROUP).unsqueeze(1), 0.0)


@pytest.fixture(scope="module")
def fixed_batch(tiny_model_dir):
    return _recorded_batch(tiny_model_dir)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_one_process_loss_receives_compute_advantages(
    tiny_model_dir, fixed_batch, tmp_path, one_torch_thread, name
):
    options = ESTIMATORS[name]
    seen, _ = seen_advantages(tiny_model_dir, fixed_batch, name, options, ROWS // 2, tmp_path)
    assert len(seen) == 2  # two micro-batches of gradient accumulation
    got = _by_row(seen, fixed_batch)
    want = _expected(tiny_model_dir, fixed_batch, name, options)
    _assert_equal_advantages(got, want, _wrong_input(tiny_model_dir, fixed_batch, name, options), name)


def test_two_processes_loss_receives_compute_advantages(
    tiny_model_dir, fixed_batch, tmp_path, one_torch_thread
):
    batch_file, out = tmp_path / "batch.pt", tmp_path / "seen.pt"
    torch.save(fixed_batch, batch_file)
    run_torchrun_worker(
        __file__, "--model", str(tiny_model_dir), "--batch", str(batch_file), "--out", str(out)
    )
    ranks = [torch.load(f"{out}.{rank}") for rank in (0, 1)]
    # the processes' completions are trimmed to unequal widths, so the gathered tensors had to be padded
    widths = {micro["completion_ids"].shape[1] for rank in ranks for micro in rank["erpo"]}
    assert len(widths) > 1, widths
    for name, options in ESTIMATORS.items():
        got = _by_row(ranks[0][name] + ranks[1][name], fixed_batch)
        want = _expected(tiny_model_dir, fixed_batch, name, options)
        _assert_equal_advantages(got, want, _wrong_input(tiny_model_dir, fixed_batch, name, options), name)


if __name__ == "__main__":
    worker(sys.argv[1:])
