"""`compute_policy_loss`: option checking, the registered loss, aggregation, regularizers and metrics."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import torch

from tepo.losses._common import DeferredValue, masked_max_value, masked_mean_value, scalar_value
from tepo.losses.aggregation import aggregate, check_agg_mode
from tepo.losses.inputs import prepare_inputs
from tepo.losses.registry import PolicyLossSpec, get_policy_loss
from tepo.losses.regularizers import (
    KL_ESTIMATORS,
    entropy_term,
    kl_ref_term,
    tepo_kl_mask_term,
)
from tepo.losses.token_selection import (
    SELECTION_OPTIONS,
    MiniBatchStats,
    SelectionStats,
    check_selection_options,
    select_tokens,
)

# Options every loss accepts, with their defaults (None: the loss's own default / the call's own count).
COMMON_OPTIONS: dict[str, Any] = {
    "agg": None,
    "num_seqs": None,
    "max_len": None,
    "entropy_coef": 0.0,
    "kl_coef": 0.0,
    "kl_estimator": "k3",
    "tepo_kl_mask_coef": 0.0,
    "tepo_kl_mask_estimator": "k3",
    **SELECTION_OPTIONS,  # off_policy_mask, top_entropy_quantile, m2po_threshold (tepo.losses.token_selection)
}


def valid_options(spec: PolicyLossSpec) -> list[str]:
    """Every option name ``compute_policy_loss`` accepts for this loss."""
    return list(spec.defaults) + (["eps"] if spec.has_clip_pair else []) + list(COMMON_OPTIONS)


def _is_finite_number(value: Any) -> bool:
    # bool is an int subclass; "0.2" strings and NaN are caught here rather than deep inside a loss.
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)


def _split_options(spec: PolicyLossSpec, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    unknown = sorted(set(options) - set(valid_options(spec)))
    if unknown:
        # An option of other losses (dual_clip on tepo, say) is refused naming the losses it applies to.
        scopes = [(key, _losses_with_option(key)) for key in unknown]
        where = "".join(
            f"; {key} applies only to policy losses {', '.join(names)}" for key, names in scopes if names
        )
        raise ValueError(
            f"unknown option(s) {', '.join(unknown)} for policy loss {spec.name!r}{where}; "
            f"valid options: {', '.join(valid_options(spec))}"
        )
    own = {k: v for k, v in options.items() if k in spec.defaults}
    if "eps" in options:
        given = [k for k in ("eps_low", "eps_high") if k in options]
        if given:
            raise ValueError(f"policy loss {spec.name!r}: pass either eps or {' and '.join(given)}, not both")
        own["eps_low"] = own["eps_high"] = options["eps"]
    for key, value in own.items():
        if value is None and key in spec.nullable:
            continue
        if isinstance(spec.defaults[key], float) and not _is_finite_number(value):
            off = " or None (off)" if key in spec.nullable else ""
            raise ValueError(
                f"option {key} of policy loss {spec.name!r} must be a finite number{off}, got {value!r}"
            )
    common = {**COMMON_OPTIONS, **{k: v for k, v in options.items() if k in COMMON_OPTIONS}}
    for key in ("entropy_coef", "kl_coef", "tepo_kl_mask_coef"):
        if not _is_finite_number(common[key]):
            raise ValueError(f"{key} must be a finite number, got {common[key]!r}")
    for key in ("kl_coef", "tepo_kl_mask_coef"):
        if common[key] < 0:
            raise ValueError(f"{key} must be >= 0, got {common[key]}")
    for key in ("kl_estimator", "tepo_kl_mask_estimator"):
        if common[key] not in KL_ESTIMATORS:
            raise ValueError(f"unknown {key} {common[key]!r}; expected one of: {', '.join(KL_ESTIMATORS)}")
    if common["agg"] is not None:
        check_agg_mode(common["agg"])
    check_selection_options(common)
    return own, common


def _losses_with_option(key: str) -> list[str]:
    """The registered losses that take option ``key`` (for the message refusing it on the others)."""
    from tepo.losses.registry import POLICY_LOSSES

    return [name for name, spec in POLICY_LOSSES.items() if key in valid_options(spec)]


def _split_batch_stats(batch_stats: Any) -> tuple[Any, SelectionStats | None]:
    """``(the loss's statistics, the selection options' statistics)`` out of a ``batch_stats`` argument."""
    if isinstance(batch_stats, MiniBatchStats):
        return batch_stats.loss, batch_stats.selection
    if isinstance(batch_stats, SelectionStats):
        return None, batch_stats
    return batch_stats, None


def _require(name: str, present: bool, why: str) -> None:
    if not present:
        raise ValueError(f"{why} needs {name}, which was not given (pass {name}=<[N, T] tensor>)")


def compute_policy_loss(
    name: str,
    *,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    old_entropy: torch.Tensor | None = None,
    num_tokens: float | int | torch.Tensor | None = None,
    is_weights: torch.Tensor | None = None,
    batch_stats: Any = None,
    rollout_logp: torch.Tensor | None = None,
    **options: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Policy loss ``name`` plus the active regularizers, aggregated into a 0-dim tensor; and its metrics.

    ``logp``, ``old_logp``, ``mask`` (and ``ref_logp``, ``entropy``, ``old_entropy`` when given) are [N, T];
    ``advantages`` is [N] (broadcast over tokens) or [N, T]. ``num_tokens`` is the global masked-token count of
    the mini-batch (default: this call's count); options ``num_seqs`` and ``max_len`` are the global sequence
    count and the L_max constant (defaults N and T). With global counts, the sum of micro-batch losses equals
    the mini-batch loss. Masked positions may hold anything, NaN and inf included.

    ``is_weights`` ([N, T], optional) are rollout-correction importance weights (`tepo.losses.
    rollout_correction_weights`): detached constants multiplied into the loss's per-token term before
    aggregation, ``agg(w * l)``, the same one path for every registered loss. They weight the policy term only,
    not the regularizers (entropy, KL to the reference, TEPO's KL mask), as verl applies ``rollout_is_weights``
    to ``pg_losses`` alone. None computes exactly what a call without them computes.

    ``batch_stats`` is this call's slice of `tepo.losses.mini_batch_stats` (``stats.rows(rows, cols)``), handed
    to the statistics option of a loss with ``spec.needs_batch_stats``; it also carries the mini-batch selections
    of ``top_entropy_quantile`` / ``m2po_threshold`` (without it, a call selects among its own tokens).
    ``rollout_logp`` ([N, T], optional, detached) is the sampler's log-prob of each token, the "behaviour"
    policy of dppo_tv / dppo_kl, ``off_policy_mask`` and ``m2po_threshold``; without it they use ``old_logp``.

    Options: the loss's own (see `POLICY_LOSSES[name].defaults`; ``eps`` sets eps_low = eps_high), ``agg``,
    ``entropy_coef`` (adds -coef*agg(H), needs ``entropy``), ``kl_coef`` with ``kl_estimator`` in k1/k2/k3
    (adds coef*agg(KL(pi_theta||pi_ref)), needs ``ref_logp``), ``tepo_kl_mask_coef`` (TEPO v2, adds
    coef*sum_M k(pi_theta||pi_old)/T_tot with ``tepo_kl_mask_estimator`` k (default k3), needs ``entropy`` and
    ``old_entropy``). Token selections, any loss
    (`tepo.losses.token_selection`, each None = off): ``off_policy_mask=delta`` (DeepSeek-V3.2: drop a sequence
    with A_i < 0 whose mean of behaviour - logp exceeds delta), ``top_entropy_quantile=rho`` (keep tokens with
    entropy >= the (1 - rho) quantile over the mini-batch's valid tokens; needs ``entropy``),
    ``m2po_threshold=tau`` (M2PO: drop the largest (logp - behaviour)^2 until their kept mean is <= tau). A
    dropped token's policy term is 0 and it stays in the token count.

    Metrics (python floats over this call's valid tokens; under ``deferred_metrics()`` device values read in one
    transfer by ``resolve_values``): ``policy_loss``, ``loss``, ``clip_frac_low``, ``clip_frac_high`` (plus
    ``seq_clip_frac_*`` for sequence ratios), ``approx_kl`` (k3 of KL(pi_old || pi_theta): r - 1 - log r),
    ``ratio_mean``, ``ratio_max``, ``entropy`` (when given), each active regularizer's value (``entropy_bonus``,
    ``kl_ref``, ``tepo_kl_mask``, ``tepo_kl_mask_frac``).
    """
    bound = bind_policy_loss(name, **options)
    return bound(
        logp=logp,
        old_logp=old_logp,
        advantages=advantages,
        mask=mask,
        ref_logp=ref_logp,
        entropy=entropy,
        old_entropy=old_entropy,
        num_tokens=num_tokens,
        is_weights=is_weights,
        batch_stats=batch_stats,
        rollout_logp=rollout_logp,
    )


@dataclass(frozen=True)
class BoundPolicyLoss:
    """A policy loss with its options checked and split once (:func:`bind_policy_loss`): calling it computes what
    ``compute_policy_loss(name, ..., **options)`` computes, with ``num_seqs`` given per call where a caller's
    sequence count changes between calls (a mini-batch's rows)."""

    spec: PolicyLossSpec
    own: dict[str, Any]
    common: dict[str, Any]

    def __call__(
        self,
        *,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        old_entropy: torch.Tensor | None = None,
        num_tokens: float | int | torch.Tensor | None = None,
        num_seqs: float | int | None = None,
        is_weights: torch.Tensor | None = None,
        batch_stats: Any = None,
        rollout_logp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        spec, own, common = self.spec, dict(self.own), self.common
        if num_seqs is not None:
            common = {**common, "num_seqs": num_seqs}
        selection_stats = _hand_batch_stats(spec, own, batch_stats)
        inputs = prepare_inputs(
            logp=logp,
            old_logp=old_logp,
            advantages=advantages,
            mask=mask,
            ref_logp=ref_logp,
            entropy=entropy,
            old_entropy=old_entropy,
            num_tokens=num_tokens,
            num_seqs=common["num_seqs"],
            max_len=common["max_len"],
            is_weights=is_weights,
            rollout_logp=rollout_logp,
        )
        _check_required_inputs(spec, common, inputs)
        agg = common["agg"] or spec.default_agg
        policy_loss, metrics = _policy_term(spec, inputs, own, common, selection_stats, agg)
        regularizers, regularizer_metrics = _regularizers(inputs, common, agg)
        total = policy_loss
        for term in regularizers:  # one by one, in their order: the same float sums as one expression
            total = total + term
        metrics.update(regularizer_metrics)
        metrics["policy_loss"] = scalar_value(policy_loss)
        metrics["loss"] = scalar_value(total)
        return total, metrics


def bind_policy_loss(name: str, **options: Any) -> BoundPolicyLoss:
    """Policy loss ``name`` with ``options`` (those of :func:`compute_policy_loss`) checked once: unknown or
    invalid options raise ValueError here, not at the first micro-batch. A trainer binds its loss when it plans
    its updates, as verl binds a loss's config once."""
    spec = get_policy_loss(name)
    own, common = _split_options(spec, options)
    return BoundPolicyLoss(spec, own, common)


def _hand_batch_stats(spec: PolicyLossSpec, own: dict[str, Any], batch_stats: Any) -> SelectionStats | None:
    """Put the loss's share of ``batch_stats`` into its own options (``spec.batch_stats_option``); returns the
    selection options' share."""
    loss_stats, selection_stats = _split_batch_stats(batch_stats)
    if loss_stats is not None:
        if not spec.needs_batch_stats:
            raise ValueError(
                f"policy loss {spec.name!r} takes no batch_stats (its spec.needs_batch_stats is False)"
            )
        if spec.batch_stats_option in own:
            raise ValueError(f"pass either batch_stats or {spec.batch_stats_option}, not both")
        own[spec.batch_stats_option] = loss_stats
    return selection_stats


def _check_required_inputs(spec: PolicyLossSpec, common: dict[str, Any], inputs) -> None:
    """A clear error for every tensor the loss or an active option reads that was not given."""
    for tensor_name in spec.requires:
        _require(tensor_name, getattr(inputs, tensor_name) is not None, f"policy loss {spec.name!r}")
    if common["entropy_coef"] != 0:
        _require("entropy", inputs.entropy is not None, "entropy_coef != 0")
    if common["kl_coef"] != 0:
        _require("ref_logp", inputs.ref_logp is not None, "kl_coef != 0")
    if common["tepo_kl_mask_coef"] != 0:
        _require("entropy", inputs.entropy is not None, "tepo_kl_mask_coef != 0")
        _require("old_entropy", inputs.old_entropy is not None, "tepo_kl_mask_coef != 0")
    if common["top_entropy_quantile"] is not None:
        _require("entropy", inputs.entropy is not None, "top_entropy_quantile")


def _policy_term(
    spec: PolicyLossSpec,
    inputs,
    own: dict[str, Any],
    common: dict[str, Any],
    selection_stats: SelectionStats | None,
    agg: str,
) -> tuple[torch.Tensor, dict]:
    """The registered loss's per-token term, less the tokens a selection drops, times the importance weights,
    aggregated; and its metrics with the ratio's (over the call's valid tokens)."""
    loss_mat, loss_metrics = spec.fn(inputs, **own)
    if not isinstance(loss_mat, torch.Tensor) or loss_mat.shape != inputs.logp.shape:
        got = tuple(loss_mat.shape) if isinstance(loss_mat, torch.Tensor) else type(loss_mat).__name__
        raise ValueError(
            f"policy loss {spec.name!r} must return a per-token loss of shape {tuple(inputs.logp.shape)}, "
            f"got {got}"
        )
    keep, selection_metrics = select_tokens(inputs, common, selection_stats)
    if keep is not None:
        loss_mat = torch.where(keep, loss_mat, torch.zeros((), dtype=loss_mat.dtype, device=loss_mat.device))
    if inputs.is_weights is not None:
        loss_mat = loss_mat * inputs.is_weights
    counts = {"num_tokens": inputs.num_tokens, "num_seqs": inputs.num_seqs, "max_len": inputs.max_len}
    policy_loss = aggregate(loss_mat, inputs.mask, agg, **counts)
    valid = inputs.mask
    log_ratio = (inputs.logp - inputs.old_logp).detach()
    ratio = torch.exp(log_ratio)
    metrics: dict[str, float] = {
        "clip_frac_low": 0.0,
        "clip_frac_high": 0.0,
        **{k: _metric_value(v) for k, v in loss_metrics.items()},
        **selection_metrics,
        "approx_kl": masked_mean_value(ratio - 1.0 - log_ratio, valid),
        "ratio_mean": masked_mean_value(ratio, valid, empty=1.0),
        "ratio_max": masked_max_value(ratio, valid, empty=1.0),
    }
    if inputs.entropy is not None:
        metrics["entropy"] = masked_mean_value(inputs.entropy, valid)
    return policy_loss, metrics


def _regularizers(inputs, common: dict[str, Any], agg: str) -> tuple[list[torch.Tensor], dict]:
    """The active regularizers' terms, in the order they are added to the policy term (entropy bonus, KL to the
    reference, TEPO's KL mask), and their metrics (``kl_ref`` whenever ``ref_logp`` is given)."""
    terms, metrics = [], {}
    if common["entropy_coef"] != 0:
        bonus = -common["entropy_coef"] * entropy_term(inputs, agg)
        terms.append(bonus)
        metrics["entropy_bonus"] = scalar_value(bonus)
    if inputs.ref_logp is not None:
        kl_ref = kl_ref_term(inputs, agg, common["kl_estimator"])
        metrics["kl_ref"] = scalar_value(kl_ref)
        if common["kl_coef"] != 0:
            terms.append(common["kl_coef"] * kl_ref)
    if common["tepo_kl_mask_coef"] != 0:
        term, in_set = tepo_kl_mask_term(inputs, common["tepo_kl_mask_estimator"])
        terms.append(common["tepo_kl_mask_coef"] * term)
        metrics["tepo_kl_mask"] = scalar_value(term)
        metrics["tepo_kl_mask_frac"] = masked_mean_value(in_set.float(), inputs.mask)
    return terms, metrics


def _metric_value(value: Any):
    """A loss's metric as a python float, or kept on the device under ``deferred_metrics`` (a tensor or a
    :class:`DeferredValue` then; :func:`tepo.losses._common.resolve_values` reads them)."""
    if isinstance(value, DeferredValue):
        return value
    if isinstance(value, torch.Tensor):
        return scalar_value(value)
    return float(value)
