"""The per-token tensors a token-level advantage estimator reads, computed where `TepoGRPOTrainer` computes
advantages: right after TRL's generation and scoring.

An estimator declares what it reads (`tepo.advantages.estimator_requires`); TRL computes advantages from
rewards only, so this module supplies, on every process, for the rows of that process:

* ``mask``: TRL's completion mask (and tool mask);
* ``old_logp`` and ``entropy``: the sampling policy's log-probs and token entropies. TRL's own old-policy pass is
  reused when TRL makes one (``num_iterations > 1``, ``steps_per_generation`` not dividing gradient accumulation,
  vLLM's importance-sampling correction), with the entropies the same pass returns (the fused LM head computes
  them anyway); otherwise one no-grad pass of the current model, which *is* the sampling policy then;
* ``logp``: the current policy's log-probs. Advantages are computed once per generation, before any update of
  it, so they are ``old_logp`` itself (as in tepo's own trainer);
* ``ref_logp``: TRL's reference log-probs when TRL computes them (``beta != 0``); otherwise the adapter-off
  model's with PEFT (TRL's own ``use_adapter``, the ``"ref"`` adapter when the model has one), or else a frozen
  copy of the policy taken when the trainer is built (`frozen_reference_copy`).

`gather_rows` then pads and gathers them over processes, in the order of TRL's gathered rewards, so that groups
split across processes are whole again when the estimator runs.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from accelerate.utils import is_peft_model
from trl.models import prepare_deepspeed, prepare_fsdp
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import add_fused_lm_head, use_adapter

from tepo.advantages import ADVANTAGE_ESTIMATORS, estimator_requires, zero_log_ratio_problem

# What this module can compute at TRL's advantage time.
COMPUTABLE = frozenset({"mask", "logp", "old_logp", "entropy", "ref_logp"})
_POLICY = frozenset({"logp", "old_logp", "entropy"})


def checked_requirements(name: str, options: dict[str, Any] | None) -> frozenset[str]:
    """The tensors estimator ``name`` reads with ``options``; ValueError when TRL cannot supply one of them, or
    when the estimator compares ``logp`` with ``old_logp`` (one tensor at advantage time, so the term is 0)."""
    needs = estimator_requires(name, options)
    missing = needs - COMPUTABLE
    if missing:
        available = [n for n in ADVANTAGE_ESTIMATORS if estimator_requires(n) <= COMPUTABLE]
        gdpo = (
            " (for GDPO, TRL's own multi_objective_aggregation='normalize_then_sum' is tepo's gdpo with "
            "eps=1e-4, batch_norm='sequence')"
            if "reward_components" in missing
            else ""
        )
        raise ValueError(
            f"advantage_estimator {name!r} needs {', '.join(sorted(missing))} at advantage time, which "
            f"TepoGRPOTrainer does not compute from TRL; use one of {', '.join(available)}{gdpo}"
        )
    if (problem := zero_log_ratio_problem(name, options)) is not None:
        raise ValueError(f"advantage_estimator {problem}")
    return needs


def needs_reference_copy(trainer: Any, needs: frozenset[str]) -> bool:
    """True when the estimator reads ``ref_logp`` and TRL has no reference of its own (``beta == 0``) and the model
    has no adapters to switch off."""
    return "ref_logp" in needs and trainer.beta == 0.0 and not is_peft_model(trainer.model)


def frozen_reference_copy(trainer: Any) -> torch.nn.Module:
    """A frozen copy of the policy as it is now (built before training: the initial policy), prepared for the
    processes as TRL prepares its own reference model. Costs one more copy of the weights in memory."""
    accelerator = trainer.accelerator
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    if trainer.is_deepspeed_enabled and plugin is not None and plugin.zero_stage == 3:
        raise ValueError(
            "the estimator reads ref_logp; with DeepSpeed ZeRO-3 the policy's weights are partitioned and cannot "
            "be copied: set GRPOConfig(beta=...) > 0 (TRL then loads its reference model) or train a PEFT adapter"
        )
    reference = copy.deepcopy(accelerator.unwrap_model(trainer.model))
    # TRL's fused LM head is bound to the model it patched: drop the copied binding, patch the copy itself.
    reference.__dict__.pop("forward", None)
    add_fused_lm_head(
        reference, temperature=trainer.temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32
    )
    reference.requires_grad_(False)
    reference.eval()
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(reference, accelerator)
    if trainer.is_fsdp_enabled:
        return prepare_fsdp(reference, accelerator)
    return accelerator.prepare_model(reference, evaluation_mode=True)


def local_token_inputs(
    trainer: Any,
    output: dict[str, Any],
    needs: frozenset[str],
    *,
    old_entropy: torch.Tensor | None,
    reference: torch.nn.Module | None,
    forward_kwargs: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """This process's ``[B, T]`` tensors among ``needs`` for TRL's generation ``output``.

    ``old_entropy``: the entropies of TRL's own old-policy pass when it made one (else None); ``reference``: the
    `frozen_reference_copy` (None with PEFT or when TRL computed reference log-probs); ``forward_kwargs``: the
    multimodal inputs TRL's log-prob pass takes.
    """
    mask = output["completion_mask"].bool()
    if output.get("tool_mask") is not None:
        mask = mask & output["tool_mask"].bool()
    inputs = {"mask": mask}
    if needs & _POLICY:
        old_logp = output.get("old_per_token_logps")
        entropy = old_entropy
        if old_logp is None or ("entropy" in needs and entropy is None):
            # TRL made no old-policy pass: the current model is the sampling policy; one no-grad pass.
            wants = "entropy" in needs
            old_logp, entropy = _scored(trainer, trainer.model, output, forward_kwargs, entropy=wants)
        inputs.update(old_logp=old_logp, logp=old_logp)
        if entropy is not None:
            inputs["entropy"] = entropy
    if "ref_logp" in needs:
        ref_logp = output.get("ref_per_token_logps")
        if ref_logp is None:
            ref_logp = _reference_logps(trainer, output, reference, forward_kwargs)
        inputs["ref_logp"] = ref_logp
    return {key: value for key, value in inputs.items() if key in needs}


def _reference_logps(trainer, output, reference, forward_kwargs) -> torch.Tensor:
    if reference is not None:
        return _scored(trainer, reference, output, forward_kwargs)[0]
    # PEFT: the base model is the policy with its adapters off, or the "ref" adapter (TRL's rule, TRL's helper).
    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return _scored(trainer, trainer.model, output, forward_kwargs)[0]


def _scored(trainer, model, output, forward_kwargs, entropy: bool = False):
    """TRL's own log-prob pass (``_get_per_token_logps_and_entropies``) over the batch's prompts and completions,
    without gradients, chunked by the per-device batch size as TRL chunks its old-policy pass."""
    completion_ids = output["completion_ids"]
    mode = "train" if trainer.model.training else "eval"
    batch_size = getattr(trainer.args, f"per_device_{mode}_batch_size")
    kwargs = {key: value for key, value in forward_kwargs.items() if value is not None}
    gradient_checkpointing = trainer.args.gradient_checkpointing_kwargs
    with torch.no_grad(), disable_gradient_checkpointing(trainer.model, gradient_checkpointing):
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            model,
            torch.cat([output["prompt_ids"], completion_ids], dim=1),
            torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
            completion_ids.size(1),
            batch_size=batch_size,
            compute_entropy=entropy,
            **kwargs,
        )
    return logps, entropies


def gather_rows(accelerator: Any, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every process's ``[B, T_p]`` tensors as ``[N, T_max]`` on the CPU (rows in process order, as TRL gathers
    rewards; columns padded with 0, which the masks mark as padding). The mask comes back bool."""
    gathered = {}
    for key in sorted(tensors):  # the same order on every process: one collective call each
        value = tensors[key].float()
        value = accelerator.pad_across_processes(value, dim=1, pad_index=0)
        gathered[key] = accelerator.gather(value).cpu()
    if "mask" in gathered:
        gathered["mask"] = gathered["mask"] > 0.5
    return gathered
