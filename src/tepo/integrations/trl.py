"""TEPO and the rest of the `tepo.losses` registry inside TRL's `GRPOTrainer` (TRL >= 1.16).

`TepoGRPOTrainer` keeps everything TRL does (generation with transformers or vLLM, reward functions,
accelerate/DeepSpeed/FSDP, logging, checkpoints) and replaces only the loss: the per-token log-probs, the
entropies and the old / reference log-probs TRL already computes are handed to
`tepo.losses.compute_policy_loss`, the one place where the math lives. Optionally the advantages come from
`tepo.advantages.compute_advantages` (token-level estimators too: their inputs are computed right after
generation by `tepo.integrations.trl_token_inputs`, at the cost of at most one no-grad pass of the policy and
one of the reference) and DAPO's group filter (`tepo.advantages.filter_groups`) drops groups whose rewards are
all equal.

Normalisation (why the result does not depend on how the batch is split)
-----------------------------------------------------------------------
TRL generates one *generation batch* every ``steps_per_generation * num_iterations`` micro-steps, shuffles it,
cuts it into ``steps_per_generation`` slices and runs one slice per micro-step; an optimizer step sums the
gradients of ``gradient_accumulation_steps`` (GA) micro-steps, and DDP/FSDP/DeepSpeed average them over the P
processes. TRL's own ``loss_type="dapo"`` divides each micro-batch's token sum by
``num_items_in_batch / P * GA / steps_per_generation`` (``num_items_in_batch`` = loss tokens of the whole
generation batch on all processes): the *expected* token count of one optimizer window, exact when
``steps_per_generation == GA`` (TRL's default) and exact only on average otherwise.

This adapter passes the *exact* global counts of the optimizer window instead: when ``steps_per_generation``
is a multiple of GA (the windows are then fixed groups of GA consecutive slices), it counts the loss tokens
and sequences of each window over all processes right after generation, and every micro-batch of the window
calls ``compute_policy_loss(..., num_tokens=T_window / P, num_seqs=N_window / P)``. After the P-average of the
gradients the update is exactly the gradient of the window's loss as `compute_policy_loss` defines it on the
whole window, for every aggregation mode (tested on 2 processes under torchrun: the one-step update equals the
1-process update). When ``steps_per_generation`` is not a multiple of GA the windows straddle generations and
their counts are not known in advance: the adapter falls back to TRL's rule (expected count) and says so once at
start-up. In evaluation (no accumulation) the counts are those of the eval batch.
``max_len`` (the ``seq-mean-token-sum-norm`` constant) defaults to ``max_completion_length``, as TRL's dr_grpo.

What is taken from TRL's config (`tepo.integrations.trl_config.plan_loss`)
------------------------------------------------------------------------
``loss_name=None`` trains the loss ``GRPOConfig`` describes: ``loss_type`` x ``importance_sampling_level`` with
``epsilon`` / ``epsilon_high`` (and ``sapo_temperature_*``, ``vespo_*``) become the registry loss that computes
TRL 1.16's value and gradient (token: grpo -> ``grpo``, bnpo and dapo -> ``dapo``, dr_grpo -> ``dr_grpo``, luspo ->
``grpo`` with ``agg=seq-mean-token-sum``, cispo -> ``cispo`` with ``cap = epsilon_high`` (TRL's ceiling itself,
any value > 0), sapo -> ``sapo``, vespo -> ``vespo``; sequence: grpo -> ``gspo``, bnpo and dapo -> ``tepo``,
dr_grpo -> ``tepo`` with ``agg=seq-mean-token-sum-norm``, luspo -> ``luspo``, cispo -> ``cispo_seq`` with
``cap = epsilon_high``, vespo -> ``vespo``). ``loss_name="<name>"`` (default
``"tepo"``) trains that registry loss with ``loss_options``; TRL's loss fields must then be TRL's defaults or
describe the same loss, else the trainer refuses (never ignores) them. In both cases: ``beta`` is ``kl_coef``
(it is also what makes TRL load the reference model, so ``kl_coef`` in ``loss_options`` is refused);
``use_bias_correction_kl`` (on by default in TRL) with ``beta > 0`` is ``kl_estimator="k3_unbiased"``;
``off_policy_mask_threshold`` is ``off_policy_mask`` (behaviour = TRL's ``sampling_per_token_logps`` where TRL has
them); ``top_entropy_quantile < 1`` is ``top_entropy_quantile`` with TRL's threshold (the quantile of the
micro-batch's entropies over all processes, float32), not tepo's optimizer mini-batch; ``delta`` is
``dual_clip`` (equal when ``delta > 1 + eps_high``; below that TRL's delta also caps the positive-advantage ratio
and is refused); ``entropy_coef`` is TRL's own bonus, ``coef * sum(m*H) / sum(m)`` per micro-batch divided by
gradient accumulation whatever the loss (tepo's ``entropy_coef`` option follows the loss's aggregation instead),
and ``use_adaptive_entropy`` runs TRL's controller on TRL's own state.
Refused, with the reason: combinations with no registry equal (sapo on the sequence ratio, ``delta`` on a sequence ratio or where TRL ignores it, vespo with vLLM's IS correction,
the sequence-ratio-weighted k3 of ``importance_sampling_level="sequence"`` with the bias correction), one number
set both in GRPOConfig and in loss_options, and the Liger kernel (which
bypasses the loss hook). The MoE router auxiliary loss is added as TRL adds it. Tested equal to TRL's builtin
loss at float64: tests/integrations/test_integration_trl_config.py.

TRL warns on ``importance_sampling_level="sequence"`` with a token-sum loss (it "weights each sequence by its
completion length"): that is TEPO's own configuration, deliberately, and the trainer logs why
(`tepo.integrations.trl_config.TEPO_LENGTH_WEIGHTING`).

vLLM's sampler-mismatch correction
----------------------------------
With ``use_vllm`` and ``vllm_importance_sampling_correction`` (TRL's default), TRL puts
``importance_sampling_ratio`` into each batch: ``w = exp(log pi_old - log pi_vllm)`` per token ([N, T], modes
``token_truncate`` / ``token_mask``) or per sequence (summed log-ratio over the loss tokens, [N, 1], modes
``sequence_truncate`` / ``sequence_mask``), clamped to ``[vllm_importance_sampling_clip_min, _clip_max]``
(truncate) or set to 0 outside it (mask). TRL multiplies it into the policy term's per-token loss before
aggregation and before adding the KL term. The adapter passes the same weights as
``compute_policy_loss(..., is_weights=w)`` (a sequence weight broadcast over the tokens), which does exactly
that: the regularizers (KL, entropy, TEPO's KL mask) are not weighted. A token or sequence the mask modes reject
has weight 0 but *stays* in the loss mask, so it still counts in the token/sequence denominators: this is
TRL's reading (it changes the weights, not the mask), kept so the adapter's ``grpo``/``tepo``/``dr_grpo`` equal
TRL's builtin losses under correction too (tested). tepo's own trainer instead drops rejected tokens from the
mask (``tepo.losses.rollout_correction``), so their counts differ there.

Metrics
-------
Every metric of `compute_policy_loss` is averaged over processes and appended to TRL's ``_metrics`` as
``tepo/<name>`` (``tepo/loss``, ``tepo/policy_loss``, ``tepo/clip_frac_low``, ``tepo/approx_kl``,
``tepo/entropy``, ``tepo/tepo_kl_mask_frac``...), so they appear wherever TRL logs (console, W&B,
``trainer.state.log_history``). With dynamic sampling the filter's counts appear as
``tepo/dynamic_sampling/<name>``. Beside them, TRL's own names with TRL's meaning
(`tepo.integrations.trl_metrics`): ``kl``, ``entropy``, ``clip_ratio/{low_mean,high_mean,region_mean,low_min,
high_max}``, ``cispo_clip_ratio``, ``vespo/phi_seq_mean``, ``policy_loss`` and ``entropy_coef``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

try:
    from trl import GRPOTrainer
except ImportError as exc:  # pragma: no cover - exercised only without the extra installed
    raise ImportError(
        "tepo.integrations.trl needs TRL >= 1.16: install it with `pip install 'tepo[trl]'`"
    ) from exc

from tepo.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, filter_groups
from tepo.integrations.trl_config import TEPO_LENGTH_WEIGHTING, check_advantage_settings, plan_loss
from tepo.integrations.trl_emulation import (
    adapt_entropy_coef,
    entropy_coef_now,
    entropy_mean,
    entropy_threshold,
    log_trl_metrics,
    sampler_is_weights,
)
from tepo.integrations.trl_token_inputs import (
    checked_requirements,
    frozen_reference_copy,
    gather_rows,
    local_token_inputs,
    needs_reference_copy,
)
from tepo.integrations.trl_windows import KEEP, annotate_counts, loss_mask, window_counts
from tepo.losses import compute_policy_loss, get_policy_loss, mini_batch_stats

logger = logging.getLogger(__name__)

# The key this adapter adds to TRL's per-micro-batch input dicts for pi_old's entropy (the window counts' keys:
# tepo.integrations.trl_windows).
_OLD_ENTROPY = "tepo_old_entropy"
_MULTIMODAL_KEYS = (
    "pixel_values",
    "image_grid_thw",
    "num_images",
    "pixel_attention_mask",
    "spatial_shapes",
    "num_tiles",
    "image_sizes",
    "token_type_ids",
    "mm_token_type_ids",
    "image_position_ids",
)


class TepoGRPOTrainer(GRPOTrainer):
    """`trl.GRPOTrainer` whose loss is ``tepo.losses.compute_policy_loss(loss_name, **loss_options)``.

    Extra keyword arguments (everything else is `GRPOTrainer`'s):

    - ``loss_name``: a name of the `tepo.losses` registry (default ``"tepo"``), or None for the loss
      ``GRPOConfig`` describes (``loss_type``, ``importance_sampling_level``, ``epsilon``...; module docstring).
    - ``loss_options``: that loss's options (``eps``, ``eps_low``, ``eps_high``, ``agg``, ``entropy_coef``,
      ``kl_estimator``, ``tepo_kl_mask_coef``, ...); ``kl_coef`` comes from ``GRPOConfig.beta``.
    - ``advantage_estimator`` / ``advantage_options``: an estimator of `tepo.advantages` (``grpo``, ``rloo``,
      ``opo``, ... or a token-level one: ``erpo``, ``entropy_adv``, ``ep_grpo``, ...) applied to the weighted
      sum of the reward functions, replacing TRL's ``scale_rewards`` normalisation; the per-token inputs it
      declares are computed at advantage time (`tepo.integrations.trl_token_inputs`) and a token-level
      estimator's ``[B, T]`` advantages go to the loss. None keeps TRL's advantages.
    - ``dynamic_sampling``: drop (mask out of the loss and of the token counts) every group whose rewards are
      all equal (DAPO; TEPO Eq. 10's ``0 < |correct| < G``). TRL cannot refill the batch, so the batch
      shrinks instead of being topped up with new prompts; the dropped share is logged.

    See the module docstring for the normalisation, which TRL options are refused, and the logged metrics.
    """

    def __init__(
        self,
        *args: Any,
        loss_name: str | None = "tepo",
        loss_options: dict[str, Any] | None = None,
        advantage_estimator: str | None = None,
        advantage_options: dict[str, Any] | None = None,
        dynamic_sampling: bool = False,
        **kwargs: Any,
    ) -> None:
        if loss_name is not None:
            get_policy_loss(loss_name)  # unknown name -> ValueError listing the registry
        loss_options = dict(loss_options or {})
        if advantage_estimator is not None:
            if advantage_estimator not in ADVANTAGE_ESTIMATORS:
                raise ValueError(
                    f"unknown advantage_estimator {advantage_estimator!r}; registered: "
                    f"{', '.join(ADVANTAGE_ESTIMATORS)}"
                )
            # Per-token inputs are computed at advantage time (tepo.integrations.trl_token_inputs).
            self._tepo_estimator_needs = checked_requirements(advantage_estimator, advantage_options)
        elif advantage_options:
            raise ValueError("advantage_options given without advantage_estimator")
        else:
            self._tepo_estimator_needs = frozenset()
        train_args = kwargs.get("args", args[2] if len(args) > 2 else None)
        if train_args is not None:  # fail before TRL loads models or starts vLLM
            plan_loss(train_args, loss_name, loss_options)
            check_advantage_settings(train_args, advantage_estimator)
        self.advantage_estimator = advantage_estimator
        self.advantage_options = dict(advantage_options or {})
        self.dynamic_sampling = bool(dynamic_sampling)
        self._tepo_captured_entropies: list[torch.Tensor] | None = None
        self._tepo_rewards_per_func: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        plan = plan_loss(self.args, loss_name, loss_options)  # args may have been built by GRPOTrainer itself
        check_advantage_settings(self.args, advantage_estimator)
        self._tepo_plan = plan
        self.loss_name = plan.name
        self.loss_options = plan.options
        for note in plan.notes:
            logger.info("TepoGRPOTrainer: %s", note)
        if self.loss_name in ("tepo", "tepo_token") and self.importance_sampling_level == "sequence":
            # TRL has just warned about exactly this configuration (sequence ratio, token-sum loss).
            logger.warning("TepoGRPOTrainer: %s", TEPO_LENGTH_WEIGHTING)
        if self.beta != 0.0:
            self.loss_options["kl_coef"] = self.beta
        self.loss_options.setdefault("max_len", self.max_completion_length)
        self._tepo_needs_old_entropy = float(self.loss_options.get("tepo_kl_mask_coef", 0.0)) != 0.0
        self._tepo_reference = (
            frozen_reference_copy(self) if needs_reference_copy(self, self._tepo_estimator_needs) else None
        )
        self._tepo_exact_windows = self.args.steps_per_generation % self.args.gradient_accumulation_steps == 0
        if not self._tepo_exact_windows:
            logger.warning(
                "steps_per_generation=%d is not a multiple of gradient_accumulation_steps=%d: the loss is "
                "normalised by the expected token count of an optimizer window (TRL's rule), not the exact one",
                self.args.steps_per_generation,
                self.args.gradient_accumulation_steps,
            )

    # ------------------------------------------------------------------------------------------------------
    # Generation side: capture what the loss needs that TRL does not keep.
    # ------------------------------------------------------------------------------------------------------

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, *args, **kw
    ):
        capture = self._tepo_captured_entropies
        # Inside generation: the policy's first pass (when TRL makes one for the old policy) is pi_old's; ask for
        # its entropies too (the fused head computes them anyway) instead of a second forward. Not the reference
        # model's pass: TRL's fused head on it computes log-probs only.
        first_policy_pass = capture is not None and not capture and model is self.model
        if first_policy_pass:
            kw["compute_entropy"] = True
        logps, entropies, aux = super()._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, *args, **kw
        )
        if first_policy_pass:
            capture.append(entropies)
        return logps, entropies, aux

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._tepo_rewards_per_func = rewards_per_func
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        wants_entropy = self._tepo_needs_old_entropy or "entropy" in self._tepo_estimator_needs
        self._tepo_captured_entropies = [] if wants_entropy else None
        try:
            output = super()._generate_and_score_completions(inputs)
            captured = self._tepo_captured_entropies
        finally:
            self._tepo_captured_entropies = None
        old_entropy = None
        if captured and output.get("old_per_token_logps") is not None:
            # TRL computes pi_old's log-probs before the reference model's, so the first capture is pi_old's.
            old_entropy = captured[0].detach()
            if self._tepo_needs_old_entropy:
                output[_OLD_ENTROPY] = old_entropy
        if self.advantage_estimator is not None or self.dynamic_sampling:
            self._apply_estimator_and_filter(output, old_entropy)
        if not self.model.training:
            self._annotate_counts([output], window_size=1)
        return output

    def _global_rewards(self) -> torch.Tensor:
        per_func = self._tepo_rewards_per_func
        unscorable = torch.isnan(per_func).all(dim=1)
        if bool(unscorable.any()):
            rows = unscorable.nonzero().flatten().tolist()
            raise ValueError(
                f"every reward function returned None for completion(s) {rows[:10]} of this batch; "
                "tepo's advantage estimators and group filter need a number for every completion"
            )
        return (per_func * self.reward_weights.to(per_func.device).unsqueeze(0)).nansum(dim=1)

    def _apply_estimator_and_filter(
        self, output: dict[str, Any], old_entropy: torch.Tensor | None = None
    ) -> None:
        rewards = self._global_rewards()  # [N_global], groups of G contiguous rows, all processes
        group_size = self.num_generations if self.model.training else self.num_generations_eval
        local = output["advantages"].shape[0]
        rows = slice(self.accelerator.process_index * local, (self.accelerator.process_index + 1) * local)
        mode = "train" if self.model.training else "eval"
        if self.advantage_estimator is not None:
            advantages = compute_advantages(
                self.advantage_estimator,
                rewards.float().cpu(),
                group_size,
                **self._global_estimator_inputs(output, old_entropy),
                **self.advantage_options,
            )
            # A token-level estimator's [N, T_max] advantages: this process's rows, cut to its own width.
            mine = (
                advantages[rows]
                if advantages.dim() == 1
                else advantages[rows, : output["completion_mask"].shape[1]]
            )
            output["advantages"] = mine.to(output["advantages"].device, output["advantages"].dtype)
        if self.dynamic_sampling:
            result = filter_groups(rewards.float().cpu(), group_size)
            output[KEEP] = result.keep_mask[rows].to(output["completion_mask"].device)
            for key, value in result.metrics.items():
                self._metrics[mode][f"tepo/dynamic_sampling/{key}"].append(float(value))

    def _global_estimator_inputs(self, output: dict[str, Any], old_entropy: torch.Tensor | None) -> dict:
        """The per-token tensors the estimator declared (mask, old / current / reference log-probs, entropies:
        `tepo.integrations.trl_token_inputs`), every process's rows in the order of the global rewards."""
        local = local_token_inputs(
            self,
            output,
            self._tepo_estimator_needs,
            old_entropy=old_entropy,
            reference=self._tepo_reference,
            forward_kwargs={key: output.get(key) for key in _MULTIMODAL_KEYS},
        )
        return gather_rows(self.accelerator, local)

    def _annotate_counts(self, slices: list[dict[str, Any]], window_size: int) -> None:
        """The exact counts of each optimizer window, into its slices (`tepo.integrations.trl_windows`)."""
        annotate_counts(self.accelerator, slices, window_size)

    def _prepare_inputs(self, generation_batch):
        before = self._buffered_inputs
        inputs = super()._prepare_inputs(generation_batch)
        if self.model.training and self._buffered_inputs is not before and self._tepo_exact_windows:
            self._annotate_counts(self._buffered_inputs, window_size=self.args.gradient_accumulation_steps)
        return inputs

    # ------------------------------------------------------------------------------------------------------
    # The loss.
    # ------------------------------------------------------------------------------------------------------

    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            completion_ids.size(1),
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            **{key: inputs.get(key) for key in _MULTIMODAL_KEYS},
        )
        mask = loss_mask(inputs)
        # TRL skips pi_old's pass when the update is on-policy (old == current policy): then old = sg[current],
        # and pi_old's entropy is sg[current entropy].
        old_logps = inputs.get("old_per_token_logps")
        old_logps = logps.detach() if old_logps is None else old_logps
        num_tokens, num_seqs = window_counts(self, inputs)
        options = dict(self.loss_options)
        options.setdefault("num_seqs", num_seqs)
        rollout_logp = self._behaviour_logp(inputs, old_logps)
        mode = "train" if self.model.training else "eval"
        tensors = dict(logp=logps, old_logp=old_logps, advantages=inputs["advantages"], mask=mask)
        batch_stats, entropy_keep = None, None
        if options.get("top_entropy_quantile") is not None:
            batch_stats, entropy_keep = self._trl_entropy_selection(tensors, entropies, rollout_logp, options)
        loss, metrics = compute_policy_loss(
            self.loss_name,
            **tensors,
            ref_logp=inputs.get("ref_per_token_logps"),
            entropy=entropies,
            old_entropy=self._old_entropy(inputs, entropies),
            num_tokens=num_tokens,
            is_weights=sampler_is_weights(inputs, logps),
            rollout_logp=rollout_logp,
            batch_stats=batch_stats,
            **options,
        )
        # Trainer sets current_gradient_accumulation_steps per window; a loss called outside its loop sees GA.
        accumulation = 1.0
        if mode == "train":
            accumulation = getattr(
                self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps
            )
        without_entropy = loss.detach() - metrics.get("entropy_bonus", 0.0)
        if self._entropy_bonus_enabled:  # GRPOConfig.entropy_coef != 0 or use_adaptive_entropy (TRL's flag)
            selected = mask if entropy_keep is None else entropy_keep
            loss = loss - entropy_coef_now(self) * entropy_mean(entropies, selected, accumulation)
            metrics["trl_entropy_bonus"] = float(loss.detach() - metrics["loss"])
            metrics["loss"] = float(loss.detach())
            if self.use_adaptive_entropy and mode == "train":
                adapt_entropy_coef(self, entropies, selected)
        log_trl_metrics(self, mode, tensors, inputs, entropies, without_entropy, accumulation)
        if self.aux_loss_enabled:
            # As TRL: the MoE router loss is a model term, scaled for gradient accumulation.
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(
                self.accelerator.gather_for_metrics(aux_loss).mean().item()
            )
        self._log_loss_metrics(mode, metrics)
        return loss

    def _old_entropy(self, inputs: dict[str, Any], entropies: torch.Tensor) -> torch.Tensor | None:
        """pi_old's entropy where TEPO's KL mask reads it: captured at generation, or on-policy the current one."""
        old_entropy = inputs.get(_OLD_ENTROPY)
        if old_entropy is None and self._tepo_needs_old_entropy:
            if inputs.get("old_per_token_logps") is not None:
                raise RuntimeError(
                    "tepo_kl_mask_coef needs pi_old's entropies, but TRL's pi_old pass was not captured"
                )
            old_entropy = entropies.detach()
        return old_entropy

    @staticmethod
    def _behaviour_logp(inputs: dict[str, Any], old_logps: torch.Tensor) -> torch.Tensor | None:
        """vLLM's own log-probs (TRL stores them with use_vllm): the "behaviour" policy of dppo_tv / dppo_kl,
        off_policy_mask and m2po_threshold. A token vLLM could not score is NaN there: no evidence of drift, so
        its behaviour is pi_old's."""
        rollout_logp = inputs.get("sampling_per_token_logps")
        if rollout_logp is not None:
            rollout_logp = torch.where(torch.isnan(rollout_logp), old_logps.detach(), rollout_logp)
        return rollout_logp

    def _trl_entropy_selection(self, tensors: dict, entropies, rollout_logp, options: dict) -> tuple:
        """``(batch_stats, kept tokens)`` of ``top_entropy_quantile`` by TRL's own selection (its
        get_high_entropy_mask: the quantile of this micro-batch's entropies over all processes, float32
        torch.quantile), not tepo's optimizer mini-batch (float64)."""
        threshold = entropy_threshold(self, entropies, tensors["mask"], options["top_entropy_quantile"])
        stats = mini_batch_stats(
            self.loss_name, **tensors, entropy=entropies, rollout_logp=rollout_logp, **options
        )
        selection = dataclasses.replace(stats.selection, entropy_threshold=threshold)
        return dataclasses.replace(stats, selection=selection), tensors["mask"] & (
            entropies.detach() >= threshold
        )

    def _log_loss_metrics(self, mode: str, metrics: dict[str, float]) -> None:
        """Average the loss's metrics over processes (one collective call) and hand them to TRL's logger."""
        names = sorted(metrics)
        values = torch.tensor(
            [metrics[n] for n in names], dtype=torch.float64, device=self.accelerator.device
        )
        gathered = self.accelerator.gather(values.unsqueeze(0)).view(-1, len(names))
        for name, column in zip(names, gathered.unbind(dim=1)):
            finite = column[torch.isfinite(column)]
            value = float(finite.mean().item()) if finite.numel() else math.nan
            self._metrics[mode][f"tepo/{name}"].append(value)
