"""What a TRL ``GRPOConfig`` asks of the loss, in `tepo.losses` terms: `plan_loss` (used by `TepoGRPOTrainer`).

Two ways to name the loss:

- ``loss_name=None``: the loss is the one ``GRPOConfig`` describes (``loss_type``, ``importance_sampling_level``,
  ``epsilon``, ``epsilon_high``, ``delta``, the ``sapo_*`` / ``vespo_*`` parameters), translated to the registry
  entry that computes the same value and gradient as TRL 1.16's builtin ``GRPOTrainer._compute_loss``
  (`TRL_LOSSES`; tested against it on the same batch). A combination with no equal is refused, naming it.
- ``loss_name="<registry name>"`` (default ``"tepo"``): the registry loss with ``loss_options``. TRL's loss fields
  are then not used, so they must be TRL's defaults or describe that same loss (TRL's ``sequence`` + ``dapo``
  with eps 0.2 *is* ``tepo``); anything else is refused, never silently ignored.

Either way the TRL features that are terms or token selections map to registry options, or to the adapter's own
TRL-normalised entropy bonus: ``beta`` -> ``kl_coef``, ``use_bias_correction_kl`` -> ``kl_estimator=k3_unbiased``,
``off_policy_mask_threshold`` -> ``off_policy_mask``, ``top_entropy_quantile < 1`` -> ``top_entropy_quantile``,
``delta`` -> ``dual_clip``, ``entropy_coef`` / ``use_adaptive_entropy`` -> TRL's own bonus and controller, run by
the adapter on TRL's state (`LossPlan.trl_entropy_coef` records the starting value). Setting one of these both in
``GRPOConfig`` and in ``loss_options`` is refused (two sources for one number).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from tepo.losses import get_policy_loss, valid_options

# TRL loss fields that only shape the policy term (what loss_name replaces).
LOSS_FIELDS = (
    "loss_type",
    "importance_sampling_level",
    "epsilon",
    "epsilon_high",
    "sapo_temperature_pos",
    "sapo_temperature_neg",
    "vespo_k_pos",
    "vespo_lambda_pos",
    "vespo_k_neg",
    "vespo_lambda_neg",
)

# (TRL loss_type, importance_sampling_level) -> (tepo loss, fixed options): the same per-token term and
# aggregation as TRL 1.16's _compute_loss. eps and the loss's own parameters are added by `_trl_loss`.
TRL_LOSSES: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {
    ("grpo", "token"): ("grpo", {}),
    ("bnpo", "token"): ("dapo", {}),
    ("dapo", "token"): ("dapo", {}),
    ("dr_grpo", "token"): ("dr_grpo", {}),
    ("luspo", "token"): ("grpo", {"agg": "seq-mean-token-sum"}),
    ("cispo", "token"): ("cispo", {}),
    ("cispo", "sequence"): ("cispo_seq", {}),
    ("sapo", "token"): ("sapo", {}),
    ("vespo", "token"): ("vespo", {}),
    ("grpo", "sequence"): ("gspo", {}),
    ("bnpo", "sequence"): ("tepo", {}),
    ("dapo", "sequence"): ("tepo", {}),
    ("dr_grpo", "sequence"): ("tepo", {"agg": "seq-mean-token-sum-norm"}),
    ("luspo", "sequence"): ("luspo", {}),
    # VESPO's weight reads the token log-ratios whatever the level (TRL warns and computes the same).
    ("vespo", "sequence"): ("vespo", {}),
}
# TRL's ratio-clipped loss types: their metrics clip_ratio/*, their delta (two-sided clipping).
CLIPPED_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# Loss types whose TRL policy_loss metric is logged before the division by gradient accumulation.
PER_MICRO_BATCH_TYPES = ("grpo", "sapo", "bnpo", "dr_grpo", "luspo")
# Registry losses whose ratio TRL's clip_ratio/* describe: the token ratio r, or the sequence ratio s_i.
TOKEN_CLIPPED = ("grpo", "dapo", "dr_grpo")
SEQUENCE_CLIPPED = ("tepo", "gspo", "luspo")

# Why TEPO is TRL's "sequence-level IS with a token-sum loss" (TRL warns on it at start, PR #6042).
TEPO_LENGTH_WEIGHTING = (
    "TRL warns that importance_sampling_level='sequence' with a token-sum loss 'effectively weights each "
    "sequence by its completion length'. For TEPO that is the method, not an accident: TEPO (2510.09369, Eq. 10) "
    "takes GSPO's sequence ratio s_i (the Markov likelihood) for stability and aggregates it as a token mean over "
    "the group, so every token of a response carries its sequence's group-level credit and a long reasoning "
    "chain weighs in proportion to its tokens (DAPO's argument against per-sequence averaging). The per-sequence "
    "objective TRL points to is loss_name='gspo'; LUSPO (loss_name='luspo') is TEPO up to a per-batch constant."
)


@dataclass
class LossPlan:
    """The loss `TepoGRPOTrainer` computes and the TRL-only parts around it."""

    name: str
    options: dict[str, Any]
    source: str  # "trl" (from GRPOConfig's loss fields) or "loss_name"
    trl_entropy_coef: float = 0.0  # GRPOConfig.entropy_coef: TRL's own normalisation (token mean / GA)
    # For TRL's metrics: how TRL would normalise policy_loss, and what its clip_ratio/* measure.
    policy_loss_per_micro_batch: bool = False
    clip_level: str | None = None  # "token" or "sequence" (clip_ratio/*), None when TRL logs none for it
    eps_low: float | None = None
    eps_high: float | None = None
    cispo_cap: float | None = None  # cispo_clip_ratio: ratio > cap with A > 0
    cispo_level: str = "token"  # the ratio cispo_clip_ratio reads: "token" (cispo) or "sequence" (cispo_seq)
    notes: list[str] = field(default_factory=list)


def trl_defaults() -> dict[str, Any]:
    """GRPOConfig's default for each of `LOSS_FIELDS` (read from the installed TRL, not copied)."""
    from trl import GRPOConfig

    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    return {name: fields[name].default for name in LOSS_FIELDS}


def _eps_pair(args: Any) -> tuple[float, float]:
    high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    return float(args.epsilon), float(high)


def _trl_loss(args: Any, problems: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The registry loss equal to TRL's loss fields, or None (the reason appended to ``problems``)."""
    loss_type, level = args.loss_type, args.importance_sampling_level
    entry = TRL_LOSSES.get((loss_type, level))
    if entry is None:
        problems.append(
            f"loss_type={loss_type!r} with importance_sampling_level={level!r}: no registry loss computes it "
            f"(TRL's {loss_type} of the sequence ratio); mapped combinations: "
            + ", ".join(f"{t}/{lv}" for t, lv in TRL_LOSSES)
        )
        return None
    name, options = entry[0], dict(entry[1])
    eps_low, eps_high = _eps_pair(args)
    if loss_type == "cispo":
        # TRL's cispo caps the IS weight at epsilon_high itself (clamp(r, max=epsilon_high)), any value > 0 (0.2,
        # its epsilon, when unset): the registry cispo / cispo_seq take that ceiling as cap, exactly.
        options["cap"] = eps_high
    elif loss_type == "sapo":
        options.update(tau_pos=float(args.sapo_temperature_pos), tau_neg=float(args.sapo_temperature_neg))
    elif loss_type == "vespo":
        options.update(
            k_pos=float(args.vespo_k_pos),
            lam_pos=float(args.vespo_lambda_pos),
            k_neg=float(args.vespo_k_neg),
            lam_neg=float(args.vespo_lambda_neg),
        )
    else:
        options.update(eps_low=eps_low, eps_high=eps_high)
    return name, options


# Losses whose own ``delta`` option is TRL's ``delta`` (the cap on the unclipped ratio); dppo_kl's delta is another
# quantity (a KL threshold).
TRL_DELTA_LOSSES = ("up", "stare", "dapo_zv")


def _effective(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The loss's own options with their defaults filled in (``eps`` expanded), and its aggregation."""
    spec = get_policy_loss(name)
    own = {**spec.defaults, **{k: v for k, v in options.items() if k in spec.defaults}}
    if "eps" in options:
        own["eps_low"] = own["eps_high"] = options["eps"]
    own["agg"] = options.get("agg") or spec.default_agg
    return own


def _same_loss(name: str, options: dict[str, Any], trl_name: str, trl_options: dict[str, Any]) -> bool:
    if name != trl_name:
        return False
    ours, theirs = _effective(name, options), _effective(trl_name, trl_options)
    return all(ours.get(key) == value for key, value in theirs.items())


def _set_once(options: dict[str, Any], key: str, value: Any, trl_field: str, problems: list[str]) -> None:
    if key in options and options[key] != value:
        problems.append(
            f"{key}={options[key]!r} in loss_options and GRPOConfig.{trl_field} (which maps to {key}={value!r}) "
            f"both set it: keep one"
        )
    options[key] = value


# TRL's scale_rewards -> the tepo estimator computing the same advantages (grpo_batch_std with eps 1e-4 is TRL's
# "batch" exactly; tests/integrations/test_parity_trl_estimators.py).
SCALE_REWARDS_ESTIMATORS = {"group": "grpo", "batch": "grpo_batch_std", "none": "dr_grpo"}


def check_advantage_settings(args: Any, advantage_estimator: str | None) -> None:
    """``advantage_estimator`` replaces TRL's advantages, so TRL's ``scale_rewards`` would be silently unused:
    refuse it unless it is TRL's default ("group")."""
    if advantage_estimator is None:
        return
    scale = getattr(args, "scale_rewards", "group")
    scale = {True: "group", False: "none"}.get(scale, scale)
    if scale != "group":
        hint = SCALE_REWARDS_ESTIMATORS.get(scale)
        raise ValueError(
            f"TepoGRPOTrainer cannot honour: scale_rewards={scale!r} is TRL's advantage normalisation, which "
            f"advantage_estimator={advantage_estimator!r} replaces; leave scale_rewards at 'group'"
            + (f" (TRL's {scale!r} is advantage_estimator={hint!r})" if hint else "")
        )


def plan_loss(args: Any, loss_name: str | None, loss_options: dict[str, Any]) -> LossPlan:
    """Translate ``args`` (a ``GRPOConfig``) plus the adapter's loss arguments into a `LossPlan`.

    Raises ValueError listing everything that cannot be honoured, each with what to change.
    """
    problems: list[str] = []
    notes: list[str] = []
    options = dict(loss_options)
    if "kl_coef" in options:
        problems.append(
            "kl_coef in loss_options: set GRPOConfig(beta=...) instead (beta is what makes TRL load the reference "
            "model; the adapter passes it to the loss as kl_coef)"
        )
    if getattr(args, "use_liger_kernel", False):
        problems.append("use_liger_kernel=True bypasses the loss hook this adapter overrides")
    trl_loss = _trl_loss(args, problems if loss_name is None else [])
    if loss_name is None:
        name, source = _trls_loss(args, trl_loss, options, problems, notes), "trl"
    else:
        name, source = loss_name, "loss_name"
        _check_loss_fields(args, name, loss_options, options, trl_loss, problems, notes)
    spec = get_policy_loss(name)
    _map_trl_fields(args, name, source, options, problems)
    trl_entropy_coef = float(getattr(args, "entropy_coef", 0.0))
    trl_bonus = trl_entropy_coef != 0.0 or getattr(args, "use_adaptive_entropy", False)
    if trl_bonus and float(options.get("entropy_coef", 0.0)) != 0.0:
        problems.append(
            "entropy_coef in both GRPOConfig (TRL's token mean, or its adaptive controller) and loss_options (the "
            "loss's aggregation): keep one"
        )
    unknown = sorted(set(options) - set(valid_options(spec)))
    if unknown:
        problems.append(
            f"unknown loss_options {', '.join(unknown)} for policy loss {name!r}; valid options: "
            f"{', '.join(o for o in valid_options(spec) if o not in ('kl_coef', 'num_seqs'))}"
        )
    if problems:
        raise ValueError("TepoGRPOTrainer cannot honour: " + "; ".join(problems))
    if name in ("tepo", "tepo_token"):
        notes.append(TEPO_LENGTH_WEIGHTING)
    plan = LossPlan(name=name, options=options, source=source, trl_entropy_coef=trl_entropy_coef, notes=notes)
    _describe_clip(plan, args.loss_type)
    return plan


def _trls_loss(args: Any, trl_loss, options: dict[str, Any], problems: list[str], notes: list[str]) -> str:
    """``loss_name=None``: the registry loss GRPOConfig describes, its fixed options into ``options``."""
    loss_type = args.loss_type
    if trl_loss is None:
        raise ValueError("TepoGRPOTrainer cannot honour: " + "; ".join(problems))
    name, fixed = trl_loss
    for key, value in fixed.items():
        if key in options and options[key] != value:
            problems.append(
                f"{key}={options[key]!r} in loss_options conflicts with GRPOConfig's loss "
                f"(loss_type={loss_type!r} gives {key}={value!r}): set it in GRPOConfig, or pass loss_name"
            )
    if "eps" in options:
        problems.append(
            "eps in loss_options: with loss_name=None the clip range is GRPOConfig.epsilon(_high)"
        )
    options.update(fixed)
    if loss_type == "bnpo":
        notes.append(
            "loss_type='bnpo' divides each micro-batch by its own token count; the adapter divides by the "
            "optimizer window's (the exact token mean): equal with one micro-batch per window"
        )
    if loss_type == "vespo" and args.use_vllm and args.vllm_importance_sampling_correction:
        problems.append(
            "loss_type='vespo' with vLLM's importance-sampling correction: TRL folds the sampler ratio into "
            "VESPO's sequence weight, the registry's vespo multiplies it into the loss; set "
            "vllm_importance_sampling_correction=False"
        )
    return name


def _check_loss_fields(
    args, name, loss_options, options, trl_loss, problems: list[str], notes: list[str]
) -> None:
    """``loss_name`` given: GRPOConfig's loss fields must be TRL's defaults or describe the same loss."""
    defaults = trl_defaults()
    changed = [k for k in LOSS_FIELDS if getattr(args, k, defaults[k]) != defaults[k]]
    if changed and not (trl_loss is not None and _same_loss(name, options, *trl_loss)):
        described = f" (TRL's loss is registry {trl_loss[0]!r} with {trl_loss[1]})" if trl_loss else ""
        problems.append(
            f"GRPOConfig sets {', '.join(f'{k}={getattr(args, k)!r}' for k in changed)}{described}, which is "
            f"not loss_name={name!r} with loss_options {loss_options or {}}: pass loss_name=None to train "
            "TRL's loss, or leave those fields at TRL's defaults (loss_name and loss_options set the loss)"
        )
    elif not changed:
        notes.append(
            f"GRPOConfig's loss fields are TRL's defaults and not used: the loss is {name!r} (loss_name)"
        )


def _map_trl_fields(args: Any, name: str, source: str, options: dict[str, Any], problems: list[str]) -> None:
    """GRPOConfig's delta, KL bias correction, off-policy mask and entropy selection as the loss's options."""
    spec, loss_type = get_policy_loss(name), args.loss_type
    effective = _effective(name, options)
    # delta: TRL clamps the unclipped ratio at delta inside the PPO min. For A < 0 that is dual-clip with
    # c = delta; for A > 0 it changes nothing while delta > 1 + eps_high (the clipped term is the smaller).
    delta = getattr(args, "delta", None)
    if delta is not None:
        if source == "trl" and loss_type not in CLIPPED_TYPES:
            problems.append(f"delta={delta}: TRL ignores delta for loss_type={loss_type!r}; unset it")
        elif name in TRL_DELTA_LOSSES:
            _set_once(options, "delta", float(delta), "delta", problems)
        elif "dual_clip" not in valid_options(spec):
            problems.append(
                f"delta={delta} (TRL's two-sided clipping) maps to dual_clip, which loss {name!r} does not take "
                "(only the token-ratio losses grpo, dapo, dr_grpo; TRL's delta on a sequence ratio has no equal)"
            )
        elif not delta > 1.0 + effective["eps_high"]:
            problems.append(
                f"delta={delta} <= 1 + eps_high={1.0 + effective['eps_high']}: TRL's delta then also caps the "
                "positive-advantage ratio below the clip range, which dual_clip (A < 0 only) does not; set "
                "delta > 1 + epsilon_high"
            )
        else:
            _set_once(options, "dual_clip", float(delta), "delta", problems)
    beta = float(getattr(args, "beta", 0.0))
    if beta != 0.0 and getattr(args, "use_bias_correction_kl", False):
        if args.importance_sampling_level == "sequence" and source == "trl":
            problems.append(
                "beta > 0 with use_bias_correction_kl=True and importance_sampling_level='sequence': TRL weights "
                "k3 by the sequence ratio, k3_unbiased by the token ratio (no equal); set "
                "use_bias_correction_kl=False (k3) or pass loss_name"
            )
        else:
            _set_once(options, "kl_estimator", "k3_unbiased", "use_bias_correction_kl=True", problems)
    threshold = getattr(args, "off_policy_mask_threshold", None)
    if threshold is not None:
        _set_once(options, "off_policy_mask", float(threshold), "off_policy_mask_threshold", problems)
    rho = float(getattr(args, "top_entropy_quantile", 1.0))
    if rho < 1.0:
        _set_once(options, "top_entropy_quantile", rho, "top_entropy_quantile", problems)


def _describe_clip(plan: LossPlan, loss_type: str) -> None:
    """What TRL's own metrics need to know of the loss: its clip range and level, CISPO's cap."""
    name = plan.name
    effective = _effective(name, plan.options)
    if plan.source == "trl":
        plan.policy_loss_per_micro_batch = loss_type in PER_MICRO_BATCH_TYPES
    else:
        plan.policy_loss_per_micro_batch = effective["agg"] != "token-mean"
    if name in TOKEN_CLIPPED or name in SEQUENCE_CLIPPED:
        plan.clip_level = "token" if name in TOKEN_CLIPPED else "sequence"
        plan.eps_low, plan.eps_high = float(effective["eps_low"]), float(effective["eps_high"])
    elif name in ("cispo", "cispo_seq"):
        cap = effective.get("cap")
        plan.cispo_cap = float(cap) if cap is not None else 1.0 + float(effective["eps_high"])
        plan.cispo_level = "sequence" if name == "cispo_seq" else "token"
