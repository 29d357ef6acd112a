"""Rollout correction: importance weights and rejections for a sampler that is not the trainer's policy.

The rollout engine (vLLM in bf16, say) samples ``y ~ pi_s`` while the loss treats the samples as drawn from
``pi_old``, the trainer's own float32 scoring of the same weights. Every policy-gradient estimator then carries
the factor ``rho_t = pi_old(y_t | y_<t) / pi_s(y_t | y_<t)`` that nothing accounts for (Yao et al., "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training", 2025; Liu, Li et al., "When Speed Kills
Stability: Demystifying RL Collapse from the Training-Inference Mismatch", 2025). With ``log rho_t = old_logp -
rollout_logp`` on valid tokens, `rollout_correction_weights` returns per-token weights ``w`` (multiplied into the
policy loss's per-token term by ``compute_policy_loss(..., is_weights=w)``) and a ``keep`` mask (tokens to train
on at all), for these modes:

``none``
    ``w = 1``, ``keep = mask``.
``tis`` (token-level truncated IS; Yao et al.; verl ``rollout_is="token"``)
    ``w_t = min(rho_t, C)``, ``C = cap`` (default 2.0: verl's ``rollout_is_threshold`` default and Yao et al.'s
    C). No lower truncation (as verl: a small weight is unbiased, only large ones are capped). ``keep = mask``.
``mis`` (token-level masked IS; TRL ``vllm_importance_sampling_mode="token_mask"``, verl token IS with
``rollout_rs="token_k1"``)
    ``keep_t = [c_low <= rho_t <= c_high]``, ``w_t = rho_t`` on kept tokens and 0 on dropped ones (the kept
    tokens keep their ratio, as in TRL's token_mask and the MIS estimator of Liu, Li et al.). Defaults [0.5, 2.0]:
    verl's ``token_k1`` with a single threshold 2.0, whose lower bound is its reciprocal. verl's ``token_k1``
    bounds ``-log rho``, i.e. ``pi_s / pi_old``: its ``"lower_upper"`` keeps ``1/upper <= rho_t <= 1/lower``;
    ``verl_threshold`` takes verl's string and applies that mapping (as for ``seq_mask`` below).
``seq_tis`` (sequence-level truncated IS; verl ``rollout_is="sequence"``)
    ``w_i = min(prod_t rho_t, C) = exp(min(sum_t log rho_t, log C))`` on every token of row i: the product ratio,
    as verl and TRL's ``sequence_truncate`` (not the geometric mean). Default ``C = 2.0`` (verl).
``seq_mask`` (sequence-level geometric-mean rejection; verl ``rollout_rs="seq_mean_k1"``, "Geo-RS")
    ``g_i = exp(mean_t log rho_t)``, the geometric-mean ratio (the same length normalisation as TEPO's sequence
    ratio, ``log rho_t`` clamped to [-20, 20] first, as verl); ``keep_i = [c_low <= g_i <= c_high]`` drops the
    whole row, ``w = 1`` on kept rows (verl's Geo-RS presets apply no IS weight) and 0 on dropped ones.
    **verl's bounds are on the reciprocal.** verl's statistic is the mean of ``k1 = -log rho_t`` =
    ``log(pi_s / pi_old)``, kept in ``[log lower, log upper]``: its ``rollout_rs_threshold="lower_upper"`` keeps
    ``1/upper <= g_i <= 1/lower``, so tepo's ``(c_low, c_high)`` = verl's ``(1/upper, 1/lower)``; the same
    numbers in both keep mirror-image rows (on mean log-ratios -0.0010003, -0.0009998, +0.0009998, +0.0010003,
    tepo's [0.999, 1.001] keeps the first two and verl's ``"0.999_1.001"`` the last two).
    ``verl_threshold="lower_upper"`` (a string, verl's own spelling; one number ``u`` means ``1/u_u``, as verl)
    applies this mapping, so a verl threshold can be pasted as it is. Defaults ``c_low = 1/1.001``,
    ``c_high = 1/0.999`` (0.999001, 1.001001): verl's ``decoupled_geo_rs()`` preset, ``"0.999_1.001"``, mapped.
    Tested equal to verl's ``compute_rollout_rejection_mask`` (tests/integrations/test_integration_verl_rollout_rs.py).
``seq_k3`` (sequence-level k3 rejection; verl ``rollout_rs="seq_mean_k3"``, "K3-RS")
    ``K3_i = mean_t (rho_t - 1 - log rho_t)``, the mean per-token k3 estimate of KL(pi_s || pi_old) over the
    row's valid tokens; ``keep_i = [K3_i <= threshold]``, ``w = 1`` on kept rows. Default threshold 0.01:
    verl's ``decoupled_k3_rs``.
``seq_max_k2`` (sequence-level k2 veto; verl ``rollout_rs="seq_max_k2"``)
    ``K2max_i = max_t (log rho_t)^2 / 2``; ``keep_i = [K2max_i <= threshold]``: one token far off the sampler
    drops its whole row even when the rest is clean. ``w = 1`` on kept rows. Default threshold 2.5 (verl ships no
    preset for it; 2.5 is the value of its documented example, ``docs/algo/rollout_corr.md`` Example 7).
    For both, verl first clamps ``log rho`` to [-20, 20] (its SAFETY_BOUND); so do we, so the statistics equal
    verl's on every input. An empty row has statistic 0 (kept), as in verl.

**Normalisation** (``normalize=true``, for the IS-weight modes tis, mis, seq_tis; verl
``rollout_is_batch_normalize``): after truncation, the weights are divided by their mean, so they average 1 over
the batch given to this call (the trainer passes the whole rollout batch, as verl normalises the batch of a step
before splitting it into mini-batches; the weights are then constants, so micro-batching cannot change them).
Token modes (tis, mis): ``w_t / mean_{kept t} w_t``, the mean over the tokens the loss counts; verl's token
mean is over ``response_mask``, which for tis is the same set, and for its IcePop weights (verl's analogue of
mis, which zeroes out-of-range weights but keeps those tokens in the loss) includes the zeros. Either way the
weights then sum to the loss's token count. Sequence mode (seq_tis), as verl: ``w_i / mean_i w_i`` over the
non-empty rows (one weight per sequence, not length-weighted). A mean <= 1e-8 leaves the weights unchanged (verl).
The rejection modes have no IS weights to normalise and refuse the option.

**Dropped tokens** (``keep`` False) must leave the loss entirely: the caller ANDs ``keep`` into the loss mask
*before* counting the global ``num_tokens``, so they leave the denominator too (verl replaces ``response_mask``;
TRL instead zeroes the weight and keeps them in the denominator). ``w`` is also 0 there, so a caller that only
passes the weights gets TRL's reading. The weights are constants (computed from detached log-probs): IS weights
change the measure, not the objective (verl ``rollout_corr_math.md`` sec. 3.2.2).

`rollout_mismatch_metrics` measures the gap itself (KL(pi_s || pi_old), |log rho|, out-of-range shares). Turning
the config's ``auto`` into a mode, and deciding which pass computes the weights, is the trainer's
(``tepo.training.plan``): this module holds tensor functions only.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

import torch

ROLLOUT_CORRECTIONS: tuple[str, ...] = ("none", "tis", "mis", "seq_tis", "seq_mask", "seq_k3", "seq_max_k2")
AUTO = "auto"
# Modes that drop tokens (keep may be False on a valid token): the dropped tokens leave the loss's token counts,
# so a trainer must know them before a mini-batch's counts are taken, i.e. from a pass before the update.
DROPPING_CORRECTIONS: tuple[str, ...] = ("mis", "seq_mask", "seq_k3", "seq_max_k2")
# Modes whose weights ``normalize=true`` can rescale (the rejection modes' weights are all 1).
NORMALIZABLE_CORRECTIONS: tuple[str, ...] = ("tis", "mis", "seq_tis")
# verl's bound on log rho before any exp or divergence statistic (rollout_corr_helper.SAFETY_BOUND).
_SAFETY_BOUND = 20.0
# What ``auto`` turns on where the sampler is another engine (vLLM): token-level TIS with C = 2, the correction
# of Yao et al. and verl's ``decoupled_token_is()`` preset.
AUTO_ROLLOUT_CORRECTION = "tis"

# Each mode's options and their defaults (see the module docstring for the anchors they come from).
MODE_OPTIONS: dict[str, dict[str, float]] = {
    "none": {},
    "tis": {"cap": 2.0},
    "mis": {"c_low": 0.5, "c_high": 2.0},
    "seq_tis": {"cap": 2.0},
    # verl's decoupled_geo_rs() preset "0.999_1.001" in tepo's orientation (see seq_mask in the module docstring).
    "seq_mask": {"c_low": 1.0 / 1.001, "c_high": 1.0 / 0.999},
    "seq_k3": {"threshold": 0.01},
    "seq_max_k2": {"threshold": 2.5},
}
# The true/false option every mode with IS weights takes (see "Normalisation" in the module docstring).
NORMALIZE = "normalize"
# verl's k1 threshold string ("lower_upper", or one number u for "1/u_u"), instead of c_low / c_high, for the modes
# whose bounds are verl's k1 bounds mirrored: c_low = 1/upper, c_high = 1/lower (see seq_mask above).
VERL_THRESHOLD = "verl_threshold"
VERL_THRESHOLD_MODES: tuple[str, ...] = ("mis", "seq_mask")


def verl_k1_bounds(spec: Any) -> tuple[float, float]:
    """``(c_low, c_high)`` for verl's ``rollout_rs_threshold`` ``spec`` of a k1 option (``token_k1``,
    ``seq_mean_k1``): ``"lower_upper"`` or one number ``upper`` (lower = 1/upper), parsed as verl 0.9.1's
    ``_parse_rollout_rs_thresholds``. verl keeps ``log lower <= mean(-log rho) <= log upper``, i.e.
    ``1/upper <= exp(mean log rho) <= 1/lower``, so ``c_low = 1/upper`` and ``c_high = 1/lower``.
    Raises ValueError for anything else, or for bounds that are not ``0 < lower <= upper``."""
    if isinstance(spec, bool) or not isinstance(spec, (str, numbers.Real)):
        raise ValueError(f"must be verl's threshold string 'lower_upper' (or one number), got {spec!r}")
    text = str(spec).strip()
    lower_text, sep, upper_text = text.partition("_")
    try:
        upper = float(upper_text if sep else text)
        lower = float(lower_text) if sep else 1.0 / upper
    except (ValueError, ZeroDivisionError):
        raise ValueError(
            f"must be verl's threshold string 'lower_upper' (or one number), got {spec!r}"
        ) from None
    if not (math.isfinite(lower) and math.isfinite(upper) and 0 < lower <= upper):
        hint = (
            " (YAML reads an unquoted 0.5_2 as the number 0.52: quote the string, '0.5_2')"
            if not isinstance(spec, str)
            else ""
        )
        raise ValueError(f"must give verl bounds 0 < lower <= upper, got {spec!r}{hint}")
    return 1.0 / upper, 1.0 / lower


def rollout_correction_option_errors(mode: str, options: dict[str, Any]) -> list[str]:
    """Problems with ``options`` for ``mode``, one message each, each starting with the option's name."""
    if mode not in MODE_OPTIONS:
        return [f"unknown rollout correction {mode!r} (valid: {', '.join((AUTO, *ROLLOUT_CORRECTIONS))})"]
    if not isinstance(options, dict):
        return [f"must be a mapping of option names to numbers, got {type(options).__name__}"]
    valid = MODE_OPTIONS[mode]
    extra = [NORMALIZE] if mode in NORMALIZABLE_CORRECTIONS else []
    extra += [VERL_THRESHOLD] if mode in VERL_THRESHOLD_MODES else []
    accepted = ", ".join([*valid, *extra]) or "none"
    errors = []
    for key, value in options.items():
        if key == VERL_THRESHOLD and mode in VERL_THRESHOLD_MODES:
            try:
                verl_k1_bounds(value)
            except ValueError as exc:
                errors.append(f"{key}: {exc}")
            both = [name for name in ("c_low", "c_high") if name in options]
            if both:
                errors.append(f"{key}: sets c_low and c_high itself; drop {' and '.join(both)}")
        elif key == NORMALIZE and mode in MODE_OPTIONS and mode not in NORMALIZABLE_CORRECTIONS:
            errors.append(
                f"{key}: rollout correction {mode!r} has no IS weights to normalise (it only keeps or drops "
                f"tokens, with weight 1); normalize applies to {', '.join(NORMALIZABLE_CORRECTIONS)}"
            )
        elif key == NORMALIZE:
            if not isinstance(value, bool):
                errors.append(f"{key}: must be true or false, got {value!r}")
        elif key not in valid:
            errors.append(f"{key}: not an option of rollout correction {mode!r} (its options: {accepted})")
        elif isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            errors.append(f"{key}: must be a finite number, got {value!r}")
        elif not value > 0:
            errors.append(f"{key}: must be > 0, got {value}")
    if not errors and "c_low" in valid:
        low = options.get("c_low", valid["c_low"])
        high = options.get("c_high", valid["c_high"])
        if low > high:
            errors.append(f"c_low: must be <= c_high, got c_low={low} > c_high={high}")
    return errors


def _resolved_options(mode: str, options: dict[str, Any]) -> dict[str, Any]:
    errors = rollout_correction_option_errors(mode, options)
    if errors:
        raise ValueError("rollout correction options: " + "; ".join(errors))
    numbers_ = {k: float(v) for k, v in options.items() if k not in (NORMALIZE, VERL_THRESHOLD)}
    if VERL_THRESHOLD in options:
        numbers_["c_low"], numbers_["c_high"] = verl_k1_bounds(options[VERL_THRESHOLD])
    return {**MODE_OPTIONS[mode], NORMALIZE: bool(options.get(NORMALIZE, False)), **numbers_}


def _masked_mean(values: torch.Tensor, valid: torch.Tensor, empty: float) -> float:
    count = int(valid.sum().item())
    if count == 0:
        return empty
    return float(torch.where(valid, values, 0.0).sum().item() / count)


def _row_log_ratios(log_ratio: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum_t log rho, mean_t log rho) per row over valid tokens; an empty row has 0 and 0."""
    total = log_ratio.sum(dim=-1)
    return total, total / valid.sum(dim=-1).clamp(min=1).to(log_ratio.dtype)


def _log_ratio(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor):
    if old_logp.dim() != 2 or old_logp.shape != rollout_logp.shape or old_logp.shape != mask.shape:
        raise ValueError(
            "old_logp, rollout_logp and mask must all be [N, T] of one shape, got "
            f"{tuple(old_logp.shape)}, {tuple(rollout_logp.shape)} and {tuple(mask.shape)}"
        )
    valid = mask.bool()
    dtype = torch.promote_types(torch.promote_types(old_logp.dtype, rollout_logp.dtype), torch.float32)
    diff = old_logp.detach().to(dtype) - rollout_logp.detach().to(dtype)
    if bool(torch.isnan(diff[valid]).any()):
        raise ValueError(
            "old_logp - rollout_logp is NaN on a valid token (a log-probability is NaN or both are inf)"
        )
    return torch.where(valid, diff, torch.zeros((), dtype=dtype, device=diff.device)), valid


def rollout_correction_weights(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    **options: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """``(weights [N, T], keep [N, T] bool, metrics)`` for ``mode``; equations in the module docstring.

    ``old_logp``: the trainer's log-probabilities of the sampled tokens (pi_old); ``rollout_logp``: the sampler's
    (pi_s); ``mask``: the valid response tokens. Masked positions may hold anything and get weight 0, keep False.
    Options: ``cap`` (tis, seq_tis), ``c_low`` / ``c_high`` or verl's ``verl_threshold`` string (mis,
    seq_mask; `verl_k1_bounds`), ``threshold`` (seq_k3, seq_max_k2), ``normalize`` (tis, mis, seq_tis; the mean
    is over the rows given here, so pass the whole batch); see `MODE_OPTIONS` for defaults. The weights are detached. Metrics (python floats):
    ``is_weight_mean`` / ``_min`` / ``_max`` over kept tokens (after normalisation), ``is_truncated_frac``
    (valid tokens whose weight was capped), ``is_dropped_frac`` (valid tokens dropped),
    ``is_dropped_seq_frac`` (non-empty rows with a dropped token) and, with ``normalize``,
    ``is_batch_norm_factor`` (the mean the weights were divided by; 1.0 when it was <= 1e-8).

    The two halves are public for a caller that computes the weights in parts (the trainer's update, micro-batch
    by micro-batch) and the metrics once over the whole batch: `rollout_correction_tokens`, then
    `rollout_correction_metrics` on the parts put back together.
    """
    tokens = rollout_correction_tokens(old_logp, rollout_logp, mask, mode=mode, **options)
    metrics = rollout_correction_metrics(tokens, mask)
    return tokens.weights, tokens.keep, metrics


class CorrectionTokens(NamedTuple):
    """Per-token results of a rollout correction, ``[N, T]`` each: the weights (0 where not kept), ``keep``
    (bool), ``truncated`` (bool: valid tokens whose weight was capped), and ``norm_factor`` (the mean the
    weights were divided by under ``normalize``, else None)."""

    weights: torch.Tensor
    keep: torch.Tensor
    truncated: torch.Tensor
    norm_factor: float | None = None


def rollout_correction_tokens(
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str,
    **options: float,
) -> CorrectionTokens:
    """The per-token half of `rollout_correction_weights` (same arguments), without its metrics."""
    if mode not in ROLLOUT_CORRECTIONS:
        raise ValueError(
            f"unknown rollout correction mode {mode!r}; expected one of: {', '.join(ROLLOUT_CORRECTIONS)}"
        )
    opts = _resolved_options(mode, options)
    log_ratio, valid = _log_ratio(old_logp, rollout_logp, mask)
    dtype = log_ratio.dtype
    ones = torch.ones_like(log_ratio)
    truncated = torch.zeros_like(valid)
    keep = valid

    if mode == "tis":
        log_cap = math.log(opts["cap"])
        truncated = valid & (log_ratio > log_cap)
        weights = torch.exp(log_ratio.clamp(max=log_cap))
    elif mode == "seq_tis":
        log_cap = math.log(opts["cap"])
        row_sum, _ = _row_log_ratios(log_ratio, valid)
        truncated = valid & (row_sum > log_cap).unsqueeze(-1)
        weights = torch.exp(row_sum.clamp(max=log_cap)).unsqueeze(-1).expand_as(log_ratio)
    elif mode == "mis":
        inside = (log_ratio >= math.log(opts["c_low"])) & (log_ratio <= math.log(opts["c_high"]))
        keep = valid & inside
        # exp only where kept (bounded by c_high): no overflow from a dropped token's huge ratio.
        weights = torch.exp(
            torch.where(keep, log_ratio, torch.zeros((), dtype=dtype, device=log_ratio.device))
        )
    elif mode == "seq_mask":
        # verl's SAFETY_BOUND clamp before the row mean (masked positions hold 0, unchanged by it).
        _, row_mean = _row_log_ratios(log_ratio.clamp(min=-_SAFETY_BOUND, max=_SAFETY_BOUND), valid)
        inside = (row_mean >= math.log(opts["c_low"])) & (row_mean <= math.log(opts["c_high"]))
        keep = valid & inside.unsqueeze(-1)
        weights = ones
    elif mode in ("seq_k3", "seq_max_k2"):
        keep = valid & (_row_divergence(log_ratio, valid, mode) <= opts["threshold"]).unsqueeze(-1)
        weights = ones
    else:
        weights = ones
    zero = torch.zeros((), dtype=dtype, device=log_ratio.device)
    weights = torch.where(keep, weights, zero).detach()
    factor = None
    if opts.get(NORMALIZE):
        weights, factor = _batch_normalized(weights, keep, per_sequence=mode == "seq_tis")
    return CorrectionTokens(weights, keep, truncated, factor)


def rollout_correction_metrics(tokens: CorrectionTokens, mask: torch.Tensor) -> dict[str, float]:
    """The metrics of `rollout_correction_weights` (python floats) from its per-token results ``tokens`` over the
    valid tokens ``mask``: means over the tokens and rows given here, so give it the whole batch."""
    weights, keep, truncated = tokens.weights, tokens.keep, tokens.truncated
    valid = mask.bool()
    dtype = weights.dtype
    rows = valid.any(dim=-1)
    dropped = valid & ~keep
    kept_weights = weights[keep]
    return {
        "is_weight_mean": _masked_mean(weights, keep, empty=1.0),
        "is_weight_min": float(kept_weights.min().item()) if kept_weights.numel() else 1.0,
        "is_weight_max": float(kept_weights.max().item()) if kept_weights.numel() else 1.0,
        "is_truncated_frac": _masked_mean(truncated.to(dtype), valid, empty=0.0),
        "is_dropped_frac": _masked_mean(dropped.to(dtype), valid, empty=0.0),
        "is_dropped_seq_frac": _masked_mean(dropped.any(dim=-1).to(dtype), rows, empty=0.0),
        **({"is_batch_norm_factor": tokens.norm_factor} if tokens.norm_factor is not None else {}),
    }


def _row_divergence(log_ratio: torch.Tensor, valid: torch.Tensor, mode: str) -> torch.Tensor:
    """Per row, verl's ``seq_mean_k3`` (mode seq_k3) or ``seq_max_k2`` statistic of ``log rho``; 0 on empty rows.

    As verl's ``compute_rollout_rejection_mask``: ``log rho`` clamped to [-20, 20] first, k3 = rho - 1 - log rho,
    k2 = (log rho)^2 / 2.
    """
    safe = log_ratio.clamp(min=-_SAFETY_BOUND, max=_SAFETY_BOUND)
    zero = torch.zeros((), dtype=safe.dtype, device=safe.device)
    if mode == "seq_k3":
        k3 = torch.where(valid, torch.exp(safe) - 1.0 - safe, zero)
        return k3.sum(dim=-1) / valid.sum(dim=-1).clamp(min=1).to(safe.dtype)
    k2 = torch.where(valid, 0.5 * safe**2, zero)  # >= 0, so the padding's 0 never wins a non-empty row's max
    return k2.amax(dim=-1)


def _batch_normalized(
    weights: torch.Tensor, keep: torch.Tensor, *, per_sequence: bool
) -> tuple[torch.Tensor, float]:
    """``weights / mean`` (verl ``rollout_is_batch_normalize``) and the mean; see "Normalisation" above.

    Token level: the mean over kept tokens. Sequence level: the mean of the per-row weight over rows with a kept
    token (every kept token of a row holds the row's weight). A mean <= 1e-8 leaves the weights as they are.
    """
    if per_sequence:
        rows = keep.any(dim=-1)
        values, count = weights.amax(dim=-1)[rows], rows.sum()  # a row's weight: every kept token holds it
    else:
        values, count = weights[keep], keep.sum()
    mean = values.sum() / count.clamp(min=1).to(weights.dtype)
    if not float(mean) > 1e-8:
        return weights, 1.0
    return weights / mean, float(mean)


def rollout_mismatch_metrics(
    trainer_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    threshold_c: float = 2.0,
) -> dict[str, float]:
    """How far the sampler pi_s is from the trainer's policy pi_t on the sampled tokens (python floats).

    With ``d_t = log pi_t(y_t) - log pi_s(y_t)`` on valid tokens (the samples come from pi_s):

    - ``mismatch_kl_k1`` = mean_t(-d_t) = mean(log pi_s - log pi_t), the plain estimator of KL(pi_s || pi_t);
    - ``mismatch_kl_k3`` = mean_t(exp(d_t) - 1 - d_t) >= 0, Schulman's k3 estimator of the same KL (unbiased
      since E_s[pi_t/pi_s] = 1; verl's ``rollout_corr/k3_kl``);
    - ``mismatch_abs_log_ratio_mean`` / ``_max`` = mean / max of |d_t|;
    - ``mismatch_token_out_frac``: share of valid tokens with pi_t/pi_s outside [1/C, C] (C = ``threshold_c``);
    - ``mismatch_seq_token_out_frac``: share of non-empty rows holding at least one such token;
    - ``mismatch_seq_out_frac``: share of non-empty rows whose geometric-mean ratio g_i = exp(mean_t d_t) is
      outside [1/C, C];
    - ``mismatch_seq_ratio_mean`` / ``_std`` (population, ddof 0) / ``_min`` / ``_max`` of g_i over non-empty rows.

    Equal inputs give exactly 0 for the KLs, |d|, the shares and the std, and exactly 1 for g's mean, min, max.
    """
    if isinstance(threshold_c, bool) or not isinstance(threshold_c, numbers.Real) or not threshold_c >= 1:
        raise ValueError(f"threshold_c must be a number >= 1 (the range is [1/C, C]), got {threshold_c!r}")
    log_ratio, valid = _log_ratio(trainer_logp, rollout_logp, mask)
    dtype = log_ratio.dtype
    log_c = math.log(threshold_c)
    out = valid & (log_ratio.abs() > log_c)
    rows = valid.any(dim=-1)
    _, row_mean = _row_log_ratios(log_ratio, valid)
    seq_ratio = torch.exp(row_mean[rows])
    abs_log = log_ratio.abs()
    if seq_ratio.numel():
        seq_mean = seq_ratio.mean()
        seq_std = float(((seq_ratio - seq_mean) ** 2).mean().sqrt().item())
        seq_stats = (
            float(seq_mean.item()),
            seq_std,
            float(seq_ratio.min().item()),
            float(seq_ratio.max().item()),
        )
    else:
        seq_stats = (1.0, 0.0, 1.0, 1.0)
    return {
        "mismatch_kl_k1": _masked_mean(-log_ratio, valid, empty=0.0),
        "mismatch_kl_k3": _masked_mean(torch.exp(log_ratio) - 1.0 - log_ratio, valid, empty=0.0),
        "mismatch_abs_log_ratio_mean": _masked_mean(abs_log, valid, empty=0.0),
        "mismatch_abs_log_ratio_max": float(abs_log[valid].max().item()) if bool(valid.any()) else 0.0,
        "mismatch_token_out_frac": _masked_mean(out.to(dtype), valid, empty=0.0),
        "mismatch_seq_token_out_frac": _masked_mean(out.any(dim=-1).to(dtype), rows, empty=0.0),
        "mismatch_seq_out_frac": _masked_mean((row_mean.abs() > log_c).to(dtype), rows, empty=0.0),
        "mismatch_seq_ratio_mean": seq_stats[0],
        "mismatch_seq_ratio_std": seq_stats[1],
        "mismatch_seq_ratio_min": seq_stats[2],
        "mismatch_seq_ratio_max": seq_stats[3],
    }
