"""Checking a run configuration before any model loads: cross-field rules, registry look-ups, and trial calls of
the loss and the estimator on tiny tensors, each problem one line naming the key and what was expected."""

from __future__ import annotations

import math

from tepo.config.questions import loss_options
from tepo.config.schema import AlgorithmConfig, RolloutConfig, RunConfig


def validate(config: RunConfig) -> list[str]:
    """Cross-field checks and registry look-ups; returns one message per problem (empty when valid)."""
    from tepo.lora import lora_config_errors
    from tepo.rollout import rollout_config_errors

    c = config
    errors = _number_errors(c)
    errors += _reward_errors(c)
    errors += rollout_config_errors(c.rollout)  # backend name and each backend's own keys
    errors += lora_config_errors(c.model.lora)
    errors += _async_errors(c.rollout)
    errors += _device_errors(c)
    errors += _schedule_errors(c)
    errors += _algorithm_errors(c)
    return errors


def _number_errors(c: RunConfig) -> list[str]:
    """Counts, rates and ranges of the training, sampling and optimizer keys."""
    from tepo.precision import config_precision_errors

    errors = []
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
    if c.train.micro_batch_tokens not in (None, "auto") and (
        isinstance(c.train.micro_batch_tokens, bool)
        or not isinstance(c.train.micro_batch_tokens, int)
        or c.train.micro_batch_tokens < 1
    ):
        errors.append(
            f"train.micro_batch_tokens: must be an int >= 1, auto or null, got {c.train.micro_batch_tokens!r}"
        )
    errors += config_precision_errors(c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm.dtype)
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
    return errors


def _schedule_errors(c: RunConfig) -> list[str]:
    """The attention kernel, the mini-batches, checkpoints, evaluations and resampling rounds."""
    errors = []
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
    if (
        isinstance(c.eval.pass_k_samples, bool)
        or not isinstance(c.eval.pass_k_samples, int)
        or c.eval.pass_k_samples < 0
    ):
        errors.append(f"eval.pass_k_samples must be an int >= 0 (got {c.eval.pass_k_samples!r})")
    if c.eval.seed is not None and (isinstance(c.eval.seed, bool) or not isinstance(c.eval.seed, int)):
        errors.append(f"eval.seed must be an int or null (got {c.eval.seed!r})")
    if c.eval.batch_prompts is not None and c.eval.batch_prompts < 1:
        errors.append(f"eval.batch_prompts must be >= 1 or null (got {c.eval.batch_prompts})")
    if c.algorithm.max_resample_rounds and not c.algorithm.dynamic_sampling:
        errors.append("algorithm.max_resample_rounds > 0 needs algorithm.dynamic_sampling: true")
    return errors


def _algorithm_errors(c: RunConfig) -> list[str]:
    """The rollout correction, the KL estimators, and the loss and estimator by a dry call on a tiny batch."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS
    from tepo.losses import KL_ESTIMATORS, POLICY_LOSSES

    errors = []
    errors += _rollout_correction_errors(c.algorithm)
    # Checked even while their coefficient is 0, so a misspelt estimator is not silently unused until turned on.
    estimator_in_use_is_bad = False  # then the dry run below would report the estimator a second time
    for key, coef in (("kl_estimator", "kl_coef"), ("tepo_kl_mask_estimator", "tepo_kl_mask_coef")):
        if getattr(c.algorithm, key) not in KL_ESTIMATORS:
            errors.append(
                f"algorithm.{key}: unknown estimator {getattr(c.algorithm, key)!r} (valid: {', '.join(KL_ESTIMATORS)})"
            )
            estimator_in_use_is_bad |= bool(getattr(c.algorithm, coef))

    # Registry names and options: a dry call on a tiny batch catches unknown options now, not after model load.
    if c.algorithm.loss not in POLICY_LOSSES:
        errors.append(
            f"algorithm.loss: unknown loss {c.algorithm.loss!r} (valid: {', '.join(sorted(POLICY_LOSSES))})"
        )
    elif not estimator_in_use_is_bad:
        errors += _dry_run_loss(c.algorithm)
    if c.algorithm.advantage not in ADVANTAGE_ESTIMATORS:
        from tepo.advantages.registry import REFUSED_ESTIMATORS

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
    from tepo.rewards import COMPLETION_ANSWER_FORMATS, parse_reward_functions, user_reward_function_errors

    errors = []
    r = c.reward
    if r.answer_format not in COMPLETION_ANSWER_FORMATS:
        expected = ", ".join(COMPLETION_ANSWER_FORMATS)
        errors.append(f"reward.answer_format: expected one of {expected}, got {r.answer_format!r}")
    errors += _overlong_buffer_errors(r.overlong_buffer, c.rollout.max_new_tokens)
    if not (math.isfinite(r.overlong_penalty_factor) and r.overlong_penalty_factor >= 0):
        errors.append(
            f"reward.overlong_penalty_factor: must be a finite number >= 0, got {r.overlong_penalty_factor}"
        )
    share = r.stop_failure_share
    if share is not None and not 0 < share <= 1:
        errors.append(
            "reward.stop_failure_share: expected a share in (0, 1] of a step's responses (1: stop only when "
            f"every call of a function failed) or null (never stop), got {share}"
        )
    bad_functions = parse_reward_functions(r.functions)[1]
    # The user's own reward files are imported here, so a wrong path, name or signature is one line now, not
    # an error in every reward worker after the model has loaded.
    errors += bad_functions or user_reward_function_errors(r.functions)
    return errors


def _overlong_buffer_errors(buffer, max_new_tokens: int) -> list[str]:
    """``reward.overlong_buffer``: 0 (off), a whole number of tokens below the limit, or a share in (0, 1)."""
    from tepo.rewards.shaping import overlong_buffer_tokens

    if (
        not isinstance(buffer, (int, float))
        or isinstance(buffer, bool)
        or not math.isfinite(buffer)
        or buffer < 0
    ):
        return [
            "reward.overlong_buffer: must be >= 0: tokens (e.g. 26), a share of rollout.max_new_tokens in (0, 1) "
            f"(e.g. 0.2), or 0 (off); got {buffer}"
        ]
    if buffer >= 1 and buffer != int(buffer):
        return [f"reward.overlong_buffer: {buffer} is neither a whole number of tokens nor a share in (0, 1)"]
    tokens = overlong_buffer_tokens(buffer, max_new_tokens)
    if tokens >= max_new_tokens:
        given = f"{buffer}: {tokens} tokens" if buffer < 1 else str(tokens)
        return [
            f"reward.overlong_buffer ({given}) must be smaller than rollout.max_new_tokens "
            f"({max_new_tokens}): the penalty starts at max_new_tokens - overlong_buffer tokens"
        ]
    return []


def _advantage_errors(c: RunConfig) -> list[str]:
    """Checks of the estimator against what it declares in the registry (never against its name)."""
    from tepo.advantages import (
        ADVANTAGE_ESTIMATORS,
        TENSOR_INPUTS,
        estimator_requires,
        zero_log_ratio_problem,
    )
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
            f"read as a success rate), but reward.overlong_buffer={c.reward.overlong_buffer:g} subtracts up to "
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
            f"(reward.overlong_buffer={c.reward.overlong_buffer:g}) is not one of them, so it would be ignored; "
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
        problem = zero_log_ratio_problem(name, options)
    except ValueError as err:
        errors.append(f"algorithm.advantage_options: {err}")
        return errors
    if problem is not None:
        errors.append(f"algorithm.advantage_options: {problem}")
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
