"""What every configuration key means, in one line each: the text ``tepo config show`` writes above each key.

:mod:`tepo.config.schema` holds the defaults and the longer reasons beside each field; this table holds the one
line a user reads. ``tests/config/test_config_show.py`` fails when a key of the schema has no line here, or a line
here names no key, so a new field cannot ship without its meaning.
"""

from __future__ import annotations

MEANINGS: dict[str, str] = {
    # model
    "model.name": "Hugging Face model name or local path; null: the embedded SmolLM2-135M-Instruct",
    "model.trust_remote_code": "allow a model that ships its own Python code (auto_map); off: such models are refused",
    "model.autocast_bf16": "bf16 autocast for the update's passes; auto: where the hardware computes bf16 natively",
    "model.gradient_checkpointing": "recompute layer activations in the backward pass (less memory, same values)",
    "model.train_attention": "attention kernel of the log-prob passes: auto, eager, sdpa or model (the loaded one)",
    "model.share_prompt_prefix": "compute each prompt once for its G samples in the log-prob passes (exact)",
    "model.lora.rank": "LoRA rank (needs the lora extra); 0: off, full fine-tuning",
    "model.lora.alpha": "LoRA scale numerator: the adapters are scaled by alpha / rank",
    "model.lora.dropout": "dropout on the adapters' input while training",
    "model.lora.target_modules": "layers that get adapters: all-linear, or names such as q_proj,v_proj",
    "model.dtype": "weights' dtype: float32, or bfloat16 (half the memory, not exact; GPU only)",
    # data
    "data.source": "procedural task (arithmetic, arithmetic-mix, ...), JSONL/Parquet path, or Hugging Face dataset",
    "data.split": "split of a Hugging Face dataset to train on",
    "data.subset": "configuration (config name) of a Hugging Face dataset; null: its default",
    "data.problem_field": "field of a data row that holds the problem text",
    "data.answer_field": "field of a data row that holds the reference answer",
    "data.limit": "train on the first N rows only; null: all",
    "data.instruction": "text added after every problem in the user turn; empty: the problem text alone",
    # rollout
    "rollout.backend": "sampler: vllm (a vLLM server process), hf (transformers generate), or auto (vllm if installed)",
    "rollout.group_size": "samples per prompt (G)",
    "rollout.max_new_tokens": "longest response, in tokens; longer ones are cut and counted as truncated",
    "rollout.temperature": "sampling temperature",
    "rollout.top_p": "nucleus sampling share; 1: the full softmax",
    "rollout.autocast_bf16": "hf backend: generate under bf16 autocast; auto: where bf16 is native; null: float32",
    "rollout.async_steps": "1: sample the next batch during the update (one policy version behind); 0: in turn",
    "rollout.hf.max_batch_size": "hf backend: rows per generate call; null: all rows at once",
    "rollout.vllm.python": "vllm backend: the engine's Python interpreter; null: this one or .venv-vllm's",
    "rollout.vllm.dtype": "vllm backend: the engine's weights' dtype; auto: bfloat16 where native, else float32",
    "rollout.vllm.kv_cache_gb": "vllm backend on the CPU: KV-cache budget in GiB; null: vLLM sizes it",
    "rollout.vllm.gpu_memory_utilization": "vllm backend on CUDA: share of the GPU's memory the engine may take",
    "rollout.vllm.max_model_len": "vllm backend: prompt + response tokens accepted; null: min(model's, 4096)",
    "rollout.vllm.block_size": "vllm backend: tokens per KV-cache block (prefix sharing is by whole blocks); null: 32 on CPU, vLLM's on CUDA",
    "rollout.vllm.compile": "vllm backend on the CPU: compiled engine (faster decode, 15-85 s longer start-up)",
    "rollout.vllm.keep_weights_file": "vllm backend: keep the weight-sync file for the run, overwritten in place (faster sync, one copy of the weights held in RAM)",
    "rollout.parity.check": "after weight syncs, check that the engine samples the weights it was sent",
    "rollout.parity.every": "check the first two syncs, then every N-th (1: every sync)",
    "rollout.parity.max_gap": "stop when engine and trainer differ by more than this per token (nats, mean)",
    "rollout.parity.min_shift": "judge the engine's follow-through only for updates that moved the probe this much",
    "rollout.parity.min_share": "stop when the engine followed less than this share of such an update",
    # algorithm
    "algorithm.loss": "policy loss, a name of `tepo losses`",
    "algorithm.loss_options": "the loss's options (eps_low, eps_high, eps, agg, ...); {}: its defaults",
    "algorithm.advantage": "advantage estimator, a name of `tepo estimators`",
    "algorithm.advantage_options": "the estimator's options; {}: its defaults",
    "algorithm.entropy_coef": "weight of the entropy bonus added to the loss (0: off)",
    "algorithm.kl_coef": "weight of the KL penalty to the frozen initial policy (0: off; >0 loads a reference)",
    "algorithm.kl_estimator": "estimator of that KL: k1, k2 or k3",
    "algorithm.tepo_kl_mask_coef": "TEPO v2: KL to the old policy on tokens with A > 0 and falling entropy (0: off)",
    "algorithm.tepo_kl_mask_estimator": "estimator of that masked KL: k3 (default), k2, k3+ (k3 value, k2 gradient)...",
    "algorithm.dynamic_sampling": "drop groups whose rewards are all equal (DAPO's dynamic sampling)",
    "algorithm.max_resample_rounds": "extra prompt batches drawn to refill a batch that dynamic sampling thinned",
    "algorithm.rollout_correction": "sampler/trainer gap correction: auto, none, tis, mis, seq_tis, seq_mask, ...",
    "algorithm.rollout_correction_options": "the correction's options (cap, c_low, c_high, threshold, normalize)",
    # optim
    "optim.lr": "AdamW learning rate",
    "optim.weight_decay": "AdamW weight decay",
    "optim.betas": "AdamW betas (beta1, beta2)",
    "optim.warmup_steps": "optimizer steps of linear warm-up from 0 to lr",
    "optim.schedule": "learning-rate schedule after warm-up: constant, cosine or linear",
    "optim.max_grad_norm": "clip the gradient's global norm to this",
    "optim.fused": "fused AdamW kernel (the same update, less time and memory)",
    # train
    "train.steps": "training steps (one rollout batch each)",
    "train.prompts_per_step": "prompts per step; each is sampled group_size times",
    "train.ppo_epochs": "passes over each rollout batch (more than 1: off-policy updates, ratios move)",
    "train.mini_batch_prompts": "prompts per optimizer step within an epoch; null: the whole batch, one step",
    "train.micro_batch_size": "sequences per forward/backward (gradient accumulation beyond it)",
    "train.micro_batch_tokens": "token budget per micro-batch instead, rows sorted by length; auto: 4096 from 512 "
    "new tokens on",
    "train.seed": "seed of the prompts, the sampling and the initial state",
    "train.output_dir": "folder where run directories are created",
    "train.run_name": "run directory name; null: date, time and loss",
    "train.save_every": "checkpoint every N steps (0: none periodically)",
    "train.save_final": "also checkpoint after the last step",
    "train.keep_last": "keep the N newest intact checkpoints (0: all)",
    "train.save_optimizer": "include AdamW's moments in checkpoints (needed for an exact resume)",
    "train.resume_without_optimizer": "allow a resume from a checkpoint without moments (not exact)",
    "train.max_bad_steps": "stop after this many non-finite steps in a row",
    "train.device": "where the step runs: auto (CUDA when available), cpu, cuda or cuda:N",
    "train.deterministic": "deterministic CUDA kernels, so a resume is bit-exact on a GPU too (slower)",
    # reward
    "reward.num_workers": "worker processes that verify responses",
    "reward.timeout_s": "seconds one response may take to verify; beyond it: reward 0 and a counted time-out",
    "reward.answer_format": "where the answer is read: boxed, or boxed_or_last (else the last number)",
    "reward.overlong_buffer": "DAPO's soft overlong punishment over the last N tokens of the limit, or a share of it in (0, 1) (0: off)",
    "reward.overlong_penalty_factor": "largest overlong penalty, reached at the length limit",
    "reward.overlong_filter": "leave truncated responses out of the loss (DAPO's overlong filtering)",
    "reward.functions": "reward functions with weights, built-in names or {path, name} of your own",
    "reward.stop_failure_share": (
        "stop the run when one of your functions fails on this share of a step's responses (1: all; null: never)"
    ),
    # eval
    "eval.source": (
        "held-out set: a benchmark name or a file; null: a procedural task's test split, or the last eval.size "
        "rows of data.source (left out of training)"
    ),
    "eval.size": "held-out problems, graded by math-verify (0: no held-out evaluation; train on every row)",
    "eval.seed": "draw of a procedural task's held-out problems; null: train.seed (tepo compare sets one for all runs)",
    "eval.samples": "sampled responses per problem for sampled accuracy (0: greedy only)",
    "eval.temperature": "temperature of those samples",
    "eval.every": "also evaluate every N steps (0: only before and after training)",
    "eval.max_new_tokens": "longest held-out response; null: rollout.max_new_tokens",
    "eval.batch_prompts": "prompts per generate call; null: what keeps the backend busy",
    "eval.pass_k_samples": "pass@k of the initial and trained policy from n samples per problem (0: off)",
    # log
    "log.tensorboard": "also write TensorBoard events (needs the tensorboard extra)",
    "log.wandb": "also log to Weights & Biases (needs the wandb extra)",
    "log.wandb_project": "the Weights & Biases project",
    "log.progress": "show progress bars and per-step lines",
    "log.samples_every": "record sample rollouts' per-token entropy and advantage every N steps (0: never)",
    "log.samples_rows": "rows per recorded step; null: all",
}
