"""TEPO on GSM8K with TRL (GRPOTrainer + accelerate), the loss computed by tepo.

One-step smoke test on CPU, 2 processes (accelerate MULTI_CPU over gloo; the embedded model, 2 prompts x 2
samples per process, 16 new tokens, nothing saved)::

    torchrun --nproc_per_node 2 examples/trl_gsm8k_tepo.py --smoke

Single process (CPU or one GPU)::

    python examples/trl_gsm8k_tepo.py --model Qwen/Qwen2.5-1.5B-Instruct

Several GPUs, with vLLM generating in the training processes (colocate mode)::

    accelerate launch --num_processes 8 examples/trl_gsm8k_tepo.py \\
        --model Qwen/Qwen2.5-7B-Instruct --use-vllm

``--precision auto`` (the default) gives TRL ``bf16=True`` only where the hardware computes bf16 natively
(``tepo.precision.trainer_bf16``: a GPU from Ampere on, a CPU with avx512_bf16/amx_bf16 or Arm bf16) and
``bf16=False`` elsewhere, where emulated bf16 is up to 28x slower than float32; ``--precision bf16|float32``
(or the older ``--bf16``) forces it.

``--data`` is a JSONL file with ``problem`` and ``answer`` fields (tepo's GSM8K format; default
``$TEPO_DATA_DIR/gsm8k/train.jsonl``) or a Hugging Face dataset name (``openai/gsm8k``, config ``main``:
``question`` / ``answer`` with the final number after ``####``). ``--model`` is a hub name, a local directory,
or ``embedded`` (SmolLM2-135M-Instruct, shipped with tepo). Rewards come from tepo's math-verify reward
(`tepo.rewards`), 1.0 for a correct final answer. With ``--use-vllm``, TRL's importance-sampling correction of the
vLLM/trainer mismatch is on (TRL's default ``sequence_mask``; ``--vllm-is-mode``) and reaches the tepo loss as
``is_weights``. See docs/integrations.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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
    from tepo.rewards import RewardPool

    pool = RewardPool(num_workers=num_workers, timeout_s=timeout_s)

    def math_verify_reward(completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(r.reward) for r in pool.score(texts, list(answer))]

    return math_verify_reward


def default_data() -> str | None:
    root = os.environ.get("TEPO_DATA_DIR")
    return str(Path(root) / "gsm8k" / "train.jsonl") if root else None


def check_data(source: str | None) -> str:
    """One clear message for a missing data source, before any model loads."""
    if source is None:
        sys.exit("--data is required when $TEPO_DATA_DIR is not set (a GSM8K JSONL file, or openai/gsm8k)")
    looks_local = source.endswith(".jsonl") or source.startswith((".", "/", "~"))
    if looks_local and not Path(source).expanduser().is_file():
        sys.exit(f"--data {source}: no such file (expected a JSONL file with 'problem' and 'answer' fields)")
    return str(Path(source).expanduser()) if looks_local else source


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="hub name, directory or 'embedded' (default: Qwen2.5-1.5B)"
    )
    parser.add_argument("--data", default=default_data(), help="default: $TEPO_DATA_DIR/gsm8k/train.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N problems")
    parser.add_argument("--output-dir", default="runs/trl-gsm8k-tepo")
    parser.add_argument("--loss", default="tepo", help="a tepo.losses registry name")
    parser.add_argument("--eps", type=float, default=0.2)
    parser.add_argument("--tepo-kl-mask-coef", type=float, default=0.0, help="TEPO v2's KL mask (0: off)")
    parser.add_argument(
        "--prompts-per-step", type=int, default=8, help="prompts per optimizer step per process"
    )
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--updates-per-rollout", type=int, default=1, help="steps_per_generation / GA")
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--max-steps", type=int, default=200)
    parser.add_argument("--dynamic-sampling", action="store_true", help="drop all-equal-reward groups")
    parser.add_argument("--use-vllm", action="store_true", help="vLLM generation, colocated with training")
    parser.add_argument(
        "--vllm-is-mode",
        default="sequence_mask",
        choices=["token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "off"],
        help="TRL's importance-sampling correction of the vLLM sampler (with --use-vllm); off disables it",
    )
    parser.add_argument(
        "--precision",
        choices=("auto", "bf16", "float32"),
        default="auto",
        help="TRL's bf16 flag: auto = bf16 where the hardware computes it natively (tepo.precision), else float32",
    )
    parser.add_argument("--bf16", action="store_true", help="same as --precision bf16")
    parser.add_argument("--cpu", action="store_true", help="train on CPU even when a GPU is present")
    parser.add_argument("--reward-workers", type=int, default=4)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1 optimizer step on CPU: embedded model (unless --model), 2 prompts x 2 samples per process, "
        "16 new tokens, nothing saved",
    )
    args = parser.parse_args()
    if args.smoke:
        args.model = args.model or "embedded"
        args.limit, args.max_steps, args.cpu = args.limit or 16, 1, True
        args.prompts_per_step, args.num_generations, args.max_completion_length = 1, 2, 16
        args.updates_per_rollout, args.reward_workers, args.lr = 1, 1, 1e-6
    args.model = args.model or "Qwen/Qwen2.5-1.5B-Instruct"
    data = check_data(args.data)

    from trl import GRPOConfig

    from tepo.integrations.trl import TepoGRPOTrainer
    from tepo.losses import get_policy_loss
    from tepo.models import resolve_model_path
    from tepo.precision import trainer_bf16

    precision = "bf16" if args.bf16 else args.precision
    bf16 = trainer_bf16("cpu" if args.cpu else None) if precision == "auto" else precision == "bf16"
    print(f"precision: {'bf16' if bf16 else 'float32'} (--precision {precision})", flush=True)
    loss_options = {"tepo_kl_mask_coef": args.tepo_kl_mask_coef}
    if get_policy_loss(args.loss).has_clip_pair:  # losses with eps_low / eps_high accept the symmetric eps
        loss_options["eps"] = args.eps
    per_device = args.prompts_per_step * args.num_generations
    config = GRPOConfig(
        output_dir=args.output_dir,
        use_cpu=args.cpu,
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
        save_strategy="no" if args.smoke else "steps",
        save_steps=50,
        bf16=bf16,
        use_vllm=args.use_vllm,
        vllm_mode="colocate",
        # TRL's weights of the vLLM/trainer mismatch; the adapter hands them to the tepo loss as is_weights.
        vllm_importance_sampling_correction=args.vllm_is_mode != "off",
        vllm_importance_sampling_mode="sequence_mask" if args.vllm_is_mode == "off" else args.vllm_is_mode,
        report_to="none",
    )
    reward = make_reward(args.reward_workers, timeout_s=5.0)
    trainer = TepoGRPOTrainer(
        model=resolve_model_path(args.model),
        reward_funcs=reward,
        args=config,
        train_dataset=load_gsm8k(data, args.limit),
        loss_name=args.loss,
        loss_options=loss_options,
        dynamic_sampling=args.dynamic_sampling,
    )
    trainer.train()
    if not args.smoke:
        trainer.save_model(args.output_dir)
    losses = [h["tepo/loss"] for h in trainer.state.log_history if "tepo/loss" in h]
    if trainer.accelerator.is_main_process:
        print(
            f"done: {trainer.state.global_step} optimizer step(s) on {trainer.accelerator.num_processes} "
            f"process(es) ({trainer.accelerator.distributed_type}), tepo/loss {losses}"
        )


if __name__ == "__main__":
    main()
