"""TEPO on GSM8K with TRL (GRPOTrainer + accelerate), the loss computed by tepo.

Single process (CPU or one GPU)::

    python examples/trl_gsm8k_tepo.py --model Qwen/Qwen2.5-1.5B-Instruct --data /path/to/gsm8k/train.jsonl

Several GPUs, with vLLM generating in the training processes (colocate mode)::

    accelerate launch --num_processes 8 examples/trl_gsm8k_tepo.py \\
        --model Qwen/Qwen2.5-7B-Instruct --use-vllm --bf16

``--data`` is a JSONL file with ``problem`` and ``answer`` fields (tepo's GSM8K format) or a Hugging Face
dataset name (``openai/gsm8k``, config ``main``: ``question`` / ``answer`` with the final number after ``####``).
Rewards come from tepo's math-verify reward (`tepo.rewards`), 1.0 for a correct final answer.
See docs/integrations.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def load_gsm8k(source: str, limit: int | None):
    from datasets import Dataset, load_dataset

    if Path(source).is_file():
        rows = []
        with open(source, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    item = json.loads(line)  # data, not code: json only
                    rows.append({"problem": item["problem"], "answer": str(item["answer"])})
        data = Dataset.from_list(rows)
    else:
        data = load_dataset(source, "main", split="train")
        data = data.map(
            lambda x: {"problem": x["question"], "answer": x["answer"].split("####")[-1].strip()},
            remove_columns=data.column_names,
        )
    if limit:
        data = data.select(range(min(limit, len(data))))
    instruction = "Solve the problem step by step. Put the final answer in \\boxed{}."
    return data.map(
        lambda x: {"prompt": [{"role": "user", "content": f"{x['problem']}\n\n{instruction}"}]},
    )


def make_reward(num_workers: int, timeout_s: float):
    """TRL reward function: 1.0 when math-verify accepts the completion's final answer, else 0.0."""
    from tepo.rewards import MathRewardPool

    pool = MathRewardPool(num_workers=num_workers, timeout_s=timeout_s)

    def math_verify_reward(completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(r.reward) for r in pool.score(texts, list(answer))]

    return math_verify_reward


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="Qwen/Qwen2.5-1.5B-Instruct")
    parser.add_argument("--data", default="/work/shared/data/gsm8k/train.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    parser.add_argument("--output-dir", default="runs/trl-gsm8k-tepo")
    parser.add_argument("--loss", default="tepo", help="a tepo.losses registry name")
    parser.add_argument("--eps", type=float, default=0.2)
    parser.add_argument("--tepo-kl-mask-coef", type=float, default=0.0, help="TEPO v2's KL mask (0: off)")
    parser.add_argument("--prompts-per-step", type=int, default=8, help="prompts per optimizer step per GPU")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--updates-per-rollout", type=int, default=1, help="steps_per_generation / GA")
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--dynamic-sampling", action="store_true", help="drop all-equal-reward groups")
    parser.add_argument("--use-vllm", action="store_true", help="vLLM generation, colocated with training")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--reward-workers", type=int, default=4)
    args = parser.parse_args()

    from trl import GRPOConfig

    from tepo.integrations.trl import TepoGRPOTrainer
    from tepo.losses import get_policy_loss

    loss_options = {"tepo_kl_mask_coef": args.tepo_kl_mask_coef}
    if get_policy_loss(args.loss).has_clip_pair:  # losses with eps_low / eps_high accept the symmetric eps
        loss_options["eps"] = args.eps
    per_device = args.prompts_per_step * args.num_generations
    config = GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=per_device,
        num_generations=args.num_generations,
        gradient_accumulation_steps=1,
        # One generation feeds `updates_per_rollout` optimizer steps (old log-probs are then recomputed).
        steps_per_generation=args.updates_per_rollout,
        max_completion_length=args.max_completion_length,
        temperature=1.0,
        learning_rate=args.lr,
        max_steps=args.max_steps,
        beta=0.0,
        logging_steps=1,
        save_steps=50,
        bf16=args.bf16,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        # The sampler-mismatch weight is not a tepo loss term (the adapter refuses it rather than dropping it).
        vllm_importance_sampling_correction=False,
        report_to="none",
    )
    trainer = TepoGRPOTrainer(
        model=args.model,
        reward_funcs=make_reward(args.reward_workers, timeout_s=5.0),
        args=config,
        train_dataset=load_gsm8k(args.data, args.limit),
        loss_name=args.loss,
        loss_options=loss_options,
        dynamic_sampling=args.dynamic_sampling,
    )
    trainer.train()
    trainer.save_model(args.output_dir)


if __name__ == "__main__":
    main()
