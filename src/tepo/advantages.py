"""Advantage estimators (registry by name) and group filtering for dynamic sampling.

Every estimator maps the verifier rewards of a rollout batch to advantages. ``rewards`` is ``[N]`` with
``N = num_groups * group_size`` and the ``group_size`` (``G``) responses of one prompt in contiguous rows:
rows ``g*G .. g*G+G-1`` belong to prompt ``g``. Sequence-level estimators return ``A`` of shape ``[N]``
(the trainer broadcasts it over tokens); token-level estimators return ``A`` of shape ``[N, T]`` with
exact zeros at masked positions.

Advantages are targets, not functions of the parameters: every input is detached and no output
carries a gradient.

Reference: ``/work/shared/ALGORITHMS.md``, sections "Advantage estimators" and "Pipeline rules".
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "GroupFilterResult",
    "compute_advantages",
    "describe",
    "describe_table",
    "filter_groups",
    "list_advantage_estimators",
    "register_advantage_estimator",
    "select_rows",
]


# --------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registered estimator.

    ``fn(rewards, group_size, **options)`` receives validated, detached float rewards ``[N]`` and the
    group size; its keyword-only parameters (with defaults) are its options.
    """

    name: str
    fn: Callable[..., Tensor]
    token_level: bool
    paper: str
    defaults: dict[str, Any] = field(default_factory=dict)
    accepts_any_option: bool = False

    @property
    def options(self) -> list[str]:
        return sorted(self.defaults)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def register_advantage_estimator(
    name: str, *, token_level: bool = False, paper: str = "", overwrite: bool = False
) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator registering ``fn(rewards, group_size, *, option=default, ...) -> Tensor`` as ``name``.

    Options are the function's keyword-only parameters; ``compute_advantages`` rejects any other keyword
    unless the function takes ``**kwargs``. ``token_level`` estimators return ``[N, T]``, others ``[N]``.
    Registering an existing name raises unless ``overwrite=True``.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty string, got {name!r}")

    def decorator(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if name in ADVANTAGE_ESTIMATORS and not overwrite:
            raise ValueError(
                f"advantage estimator {name!r} is already registered; pass overwrite=True to replace it"
            )
        params = inspect.signature(fn).parameters.values()
        positional = [
            p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if len(positional) != 2 or any(p.kind == p.VAR_POSITIONAL for p in positional):
            raise TypeError(
                f"advantage estimator {name!r} must take exactly two positional parameters "
                f"(rewards, group_size) and keyword-only options, got signature {inspect.signature(fn)}"
            )
        defaults = {p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY}
        ADVANTAGE_ESTIMATORS[name] = AdvantageEstimator(
            name=name,
            fn=fn,
            token_level=token_level,
            paper=paper,
            defaults=defaults,
            accepts_any_option=any(p.kind == p.VAR_KEYWORD for p in params),
        )
        return fn

    return decorator


def list_advantage_estimators() -> list[str]:
    """Names of all registered estimators, sorted."""
    return sorted(ADVANTAGE_ESTIMATORS)


def _lookup(name: str) -> AdvantageEstimator:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid names: {', '.join(list_advantage_estimators())}"
        ) from None


def describe() -> list[dict[str, Any]]:
    """One row per estimator: ``name``, ``token_level``, ``defaults`` (option -> default), ``paper``."""
    rows = []
    for name in list_advantage_estimators():
        est = ADVANTAGE_ESTIMATORS[name]
        # Inputs a token-level estimator requires are not configuration: leave them out of "defaults".
        defaults = {k: v for k, v in est.defaults.items() if k not in _TOKEN_INPUTS}
        rows.append({"name": name, "token_level": est.token_level, "defaults": defaults, "paper": est.paper})
    return rows


def describe_table() -> str:
    """``describe()`` as a plain-text table for the CLI."""
    header = ("name", "level", "defaults", "paper")
    lines = [
        (
            r["name"],
            "token" if r["token_level"] else "sequence",
            ", ".join(f"{k}={v!r}" for k, v in r["defaults"].items()) or "-",
            r["paper"] or "-",
        )
        for r in describe()
    ]
    widths = [max(len(row[c]) for row in [header, *lines]) for c in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row).rstrip() for row in [header, *lines])


# --------------------------------------------------------------------------------------------------------
# Entry point and validation
# --------------------------------------------------------------------------------------------------------

# Keyword options that carry per-token tensors rather than configuration.
_TOKEN_INPUTS = frozenset({"entropy", "mask", "logp", "ref_logp", "old_logp"})


def _validate_rewards(rewards: Any, group_size: Any) -> tuple[Tensor, int]:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if not isinstance(rewards, Tensor):
        try:
            rewards = torch.as_tensor(rewards)
        except Exception as exc:
            raise ValueError(f"rewards must be a 1-D tensor of floats, got {type(rewards).__name__}") from exc
    rewards = rewards.detach()
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if n == 0:
        raise ValueError("rewards is empty: need at least one group")
    if n % group_size != 0:
        raise ValueError(
            f"rewards has N={n} rows, not a multiple of group_size={group_size} "
            f"(rows of one prompt must be contiguous, N = num_groups * group_size)"
        )
    if rewards.is_complex():
        raise ValueError(f"rewards must be real, got dtype {rewards.dtype}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.float32)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        idx = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"rewards must be finite; non-finite at rows {idx[:10]}{' ...' if len(idx) > 10 else ''}"
        )
    return rewards, group_size


def compute_advantages(name: str, rewards: Tensor, group_size: int, **options: Any) -> Tensor:
    """Advantages of estimator ``name`` for ``rewards`` ``[N]`` grouped by ``group_size``.

    Returns ``[N]`` (sequence-level) or ``[N, T]`` (token-level), detached, in float32 unless rewards are
    float64. Unknown names or options raise ``ValueError`` listing the valid ones.
    """
    est = _lookup(name)
    if not est.accepts_any_option:
        unknown = sorted(set(options) - set(est.defaults))
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for advantage estimator {name!r}; "
                f"valid options: {', '.join(est.options) or '(none)'}"
            )
    rewards, group_size = _validate_rewards(rewards, group_size)
    out_dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    adv = est.fn(rewards.to(torch.float64), group_size, **options)
    if not isinstance(adv, Tensor):
        raise TypeError(f"advantage estimator {name!r} returned {type(adv).__name__}, expected a Tensor")
    n = rewards.shape[0]
    expected = "[N, T]" if est.token_level else "[N]"
    if adv.shape[:1] != (n,) or adv.dim() != (2 if est.token_level else 1):
        raise ValueError(
            f"advantage estimator {name!r} returned shape {tuple(adv.shape)}, expected {expected} with N={n}"
        )
    return adv.detach().to(out_dtype)


# --------------------------------------------------------------------------------------------------------
# Group statistics helpers
# --------------------------------------------------------------------------------------------------------


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    return rewards.view(-1, group_size)


def _zero_variance(groups: Tensor) -> Tensor:
    """[num_groups, 1] bool: all rewards of the group exactly equal.

    Such groups get exactly zero advantage by construction, so the result never depends on the float mean of
    equal values rounding back to that value (a residue divided by std + 1e-6 = 1e-6 would be amplified 1e6x).
    """
    return groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)


# --------------------------------------------------------------------------------------------------------
# Sequence-level estimators
# --------------------------------------------------------------------------------------------------------


@register_advantage_estimator("grpo", paper="DeepSeekMath 2402.03300; TEPO 2510.09369 Eq. 5")
def grpo_advantages(rewards: Tensor, group_size: int, *, eps: float = 1e-6, std: str = "unbiased") -> Tensor:
    r"""GRPO group-normalised advantage (DeepSeekMath 2402.03300 Sec. 4.1.2; TEPO 2510.09369 Eq. 5).

    .. math:: A_i = \frac{R_i - \operatorname{mean}_g R}{\operatorname{std}_g R + \epsilon}, \quad \epsilon = 10^{-6}

    Reading of "std": neither paper says which. The default ``std="unbiased"`` is the sample standard
    deviation with Bessel's correction, ``sqrt(sum (R_j - mean)^2 / (G - 1))``, as ``torch.std`` computes
    it in verl (``compute_grpo_outcome_advantage``) and TRL's ``GRPOTrainer``; ``std="population"`` divides by
    ``G`` instead. Example, G = 4, R = (1, 0, 0, 0): mean 0.25, unbiased std 0.5, A = (1.5, -0.5, -0.5, -0.5).

    Groups whose rewards are all equal (including every group when G = 1) get exactly 0 — never NaN.
    verl instead uses mean 0 and std 1 when G = 1 (A = R); we follow the group-relative definition, in which a
    lone response has no baseline to beat.
    """
    if std not in ("unbiased", "population"):
        raise ValueError(f"grpo option std must be 'unbiased' or 'population', got {std!r}")
    _check_nonnegative("grpo", "eps", eps)
    groups = _grouped(rewards, group_size)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if group_size == 1:
        return torch.zeros_like(rewards)
    dof = group_size - 1 if std == "unbiased" else group_size
    sd = (centred.square().sum(dim=1, keepdim=True) / dof).sqrt()
    adv = centred / (sd + eps)
    return torch.where(_zero_variance(groups), 0.0, adv).flatten()


@register_advantage_estimator("dr_grpo", paper="Dr. GRPO 2503.20783")
def dr_grpo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""Dr. GRPO advantage (Liu et al. 2503.20783, "Understanding R1-Zero-Like Training", Sec. 3.2).

    .. math:: A_i = R_i - \operatorname{mean}_g R

    The std normalisation of GRPO is dropped (it up-weights groups of low reward variance, a question-level
    difficulty bias). Example, R = (1, 0, 0, 0): A = (0.75, -0.25, -0.25, -0.25). All-equal groups give 0.
    """
    groups = _grouped(rewards, group_size)
    adv = groups - groups.mean(dim=1, keepdim=True)
    return torch.where(_zero_variance(groups), 0.0, adv).flatten()


@register_advantage_estimator("rloo", paper="RLOO, Kool et al. 2019; Ahmadian et al. 2402.14740")
def rloo_advantages(rewards: Tensor, group_size: int) -> Tensor:
    r"""REINFORCE leave-one-out advantage (Kool et al. 2019; Ahmadian et al. 2402.14740 Eq. 4).

    .. math:: A_i = R_i - \frac{1}{G - 1} \sum_{j \ne i} R_j = \frac{G}{G - 1} (R_i - \operatorname{mean}_g R)

    Example, R = (1, 0, 0, 0): A_1 = 1 - 0 = 1, A_2 = 0 - 1/3 = -1/3 (twice more). With G = 1 there are no
    other samples to form a baseline: A = 0 (not NaN). All-equal groups give 0.
    """
    if group_size == 1:
        return torch.zeros_like(rewards)
    groups = _grouped(rewards, group_size)
    others_mean = (groups.sum(dim=1, keepdim=True) - groups) / (group_size - 1)
    adv = groups - others_mean
    return torch.where(_zero_variance(groups), 0.0, adv).flatten()


# --------------------------------------------------------------------------------------------------------
# Token-level helpers
# --------------------------------------------------------------------------------------------------------


def _check_nonnegative(estimator: str, option: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{estimator} option {option} must be a number >= 0, got {value!r}")


def _token_mask(estimator: str, mask: Any, n: int) -> Tensor:
    if mask is None:
        raise ValueError(f"advantage estimator {estimator!r} is token-level and needs mask=[N, T] (got none)")
    if not isinstance(mask, Tensor):
        raise ValueError(f"{estimator}: mask must be a Tensor [N, T], got {type(mask).__name__}")
    mask = mask.detach()
    if mask.dim() != 2 or mask.shape[0] != n:
        raise ValueError(f"{estimator}: mask must have shape [N={n}, T], got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if not ((mask == 0) | (mask == 1)).all():
            raise ValueError(f"{estimator}: mask must hold only 0/1 (or bool) values")
        mask = mask != 0
    return mask


def _token_input(estimator: str, label: str, value: Any, mask: Tensor) -> Tensor:
    """Detached float64 copy of a per-token input, zeroed where ``mask`` is 0.

    Padding is allowed to hold anything (NaN, inf); a non-finite value at a valid position is an error.
    """
    if value is None:
        raise ValueError(
            f"advantage estimator {estimator!r} needs {label}=[N, T] (same shape as mask) but it was not given"
        )
    if not isinstance(value, Tensor):
        raise ValueError(f"{estimator}: {label} must be a Tensor [N, T], got {type(value).__name__}")
    value = value.detach()
    if value.shape != mask.shape:
        raise ValueError(
            f"{estimator}: {label} has shape {tuple(value.shape)}, expected the mask's shape {tuple(mask.shape)}"
        )
    value = value.to(torch.float64)
    bad = mask & ~torch.isfinite(value)
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        raise ValueError(
            f"{estimator}: {label} has {int(bad.sum())} non-finite value(s) at valid (mask=1) positions, "
            f"first at (row, token) = {first}"
        )
    return torch.where(mask, value, 0.0)


def _base_advantages(
    estimator: str, base: str, base_options: dict | None, rewards: Tensor, group_size: int
) -> Tensor:
    base_est = _lookup(base)
    if base_est.token_level:
        seq_names = [n for n in list_advantage_estimators() if not ADVANTAGE_ESTIMATORS[n].token_level]
        raise ValueError(
            f"{estimator}: base estimator must be sequence-level, {base!r} is token-level; "
            f"valid bases: {', '.join(seq_names)}"
        )
    return compute_advantages(base, rewards, group_size, **(base_options or {})).to(torch.float64)


def _masked_zscore(values: Tensor, mask: Tensor, eps: float) -> Tensor:
    """Z-score of ``values[k, :]`` over its masked entries, row by row (rows = groups of entries).

    Population std (divide by the count); rows with fewer than two entries, or with zero spread, give 0.
    Unmasked entries come out 0.
    """
    count = mask.sum(dim=1, keepdim=True).to(values.dtype)
    safe = count.clamp(min=1)
    v = torch.where(mask, values, 0.0)
    mean = v.sum(dim=1, keepdim=True) / safe
    centred = torch.where(mask, v - mean, 0.0)
    sd = (centred.square().sum(dim=1, keepdim=True) / safe).sqrt()
    z = centred / (sd + eps)
    return torch.where(mask & (count >= 2) & (sd > 0), z, 0.0)


# --------------------------------------------------------------------------------------------------------
# Token-level estimators
# --------------------------------------------------------------------------------------------------------


@register_advantage_estimator(
    "entropy_adv", token_level=True, paper="Cheng et al. 2506.14758; TEPO 2510.09369 Table 1"
)
def entropy_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    alpha: float = 4e-4,
    kappa: float = 2.0,
    base: str = "grpo",
    base_options: dict | None = None,
) -> Tensor:
    r"""Entropy-based advantage shaping (Cheng et al. 2506.14758; TEPO 2510.09369 Table 1 "Entropy-based Term").

    .. math:: A_{i,t} = A_i + \min\!\big(\alpha\, \mathrm{sg}[H_{i,t}],\ |A_i| / \kappa\big)

    ``A_i`` comes from the sequence-level ``base`` estimator (default ``grpo``, options in ``base_options``);
    ``H_{i,t}`` is the policy's token entropy (``entropy`` ``[N, T]``), stop-gradient. The bonus is clipped at
    ``|A_i| / kappa`` so it never flips the sign of a negative advantage (for ``kappa >= 1``) and vanishes when
    ``A_i = 0``. Defaults alpha = 4e-4, kappa = 2 are the values TEPO Sec. 4.1 states for this baseline.

    Example: A_i = 1.5, H = (0, 1000), alpha 4e-4, kappa 2 -> bonus (0, min(0.4, 0.75)) -> A = (1.5, 1.9).
    Masked positions are exactly 0 whatever ``entropy`` holds there (NaN / inf padding is fine).
    """
    _check_nonnegative("entropy_adv", "alpha", alpha)
    if isinstance(kappa, bool) or not isinstance(kappa, (int, float)) or not kappa > 0:
        raise ValueError(f"entropy_adv option kappa must be a number > 0, got {kappa!r}")
    m = _token_mask("entropy_adv", mask, rewards.shape[0])
    h = _token_input("entropy_adv", "entropy", entropy, m)
    a = _base_advantages("entropy_adv", base, base_options, rewards, group_size).unsqueeze(1)
    bonus = torch.minimum(alpha * h, a.abs() / kappa)
    return torch.where(m, a + bonus, 0.0)


_ERPO_GATES = ("relu", "hard", "none")
_ERPO_BASELINES = ("ref", "old")


@register_advantage_estimator("erpo", token_level=True, paper="ERPO 2603.28204 (reading from abstract)")
def erpo_advantages(
    rewards: Tensor,
    group_size: int,
    *,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    lam: float = 0.1,
    num_buckets: int = 4,
    gate: str = "relu",
    gate_threshold: float = 0.0,
    progress_baseline: str = "ref",
    eps: float = 1e-6,
    base: str = "grpo",
    base_options: dict | None = None,
) -> Tensor:
    r"""Entropy-Regulated Policy Optimization token advantage (ERPO, 2603.28204). OUR READING.

    Only the abstract and figure captions of ERPO are public (Fig. 2: ``Â = H ⊙ S ⊙ sgn(A)`` merged with the
    sequence-level baseline). This implements the reading written down in ALGORITHMS.md:

    .. math:: A_{i,t} = A_i + \lambda \, H^n_{i,t} \, S^n_{i,t} \, \operatorname{sgn}(A_i)

    * ``A_i``: sequence-level ``base`` estimator (default ``grpo``); ``sgn(0) = 0``, so groups with no reward
      spread get no token signal ("result-anchored").
    * ``H^n`` (entropy-aware gating): ``z = (H - mean) / (std + eps)`` over all valid tokens of the G responses
      of the prompt (population std), then the gate: ``relu`` -> ``max(z - tau, 0)`` (default, tau = 0: only
      above-average-entropy tokens, the "critical decision pivots", are amplified); ``hard`` -> ``1[z > tau]``;
      ``none`` -> ``z``. ``tau`` = ``gate_threshold``.
    * ``S^n`` (bucket-based implicit normalisation): the implicit progress signal ``d = logp - ref_logp``
      (``progress_baseline="ref"``, default) or ``logp - old_logp`` (``"old"``; note that at rollout time the
      sampler's log-probs equal ``old_logp`` so this is identically 0 unless ``logp`` comes from a different
      policy). Valid token ``t`` of response ``i`` (0-based index ``p`` among its ``L_i`` valid tokens) falls
      in bucket ``b = floor(K p / L_i)`` (K = ``num_buckets``). ``S̄[i, b]`` = mean of ``d`` over the bucket;
      then for each bucket, ``S^n[i, b]`` = z-score of ``S̄[., b]`` over the responses of the group that have
      tokens in that bucket (population std; 0 when fewer than two do or they are all equal). Every token
      takes its bucket's value.

    Defaults lam = 0.1, K = 4, gate relu at 0 are ours (the paper's values are not public).
    Needs ``entropy``, ``mask``, ``logp`` and ``ref_logp`` (or ``old_logp``), all ``[N, T]``. Masked positions
    are exactly 0 and never NaN, whatever the inputs hold there.
    """
    if gate not in _ERPO_GATES:
        raise ValueError(f"erpo option gate must be one of {_ERPO_GATES}, got {gate!r}")
    if progress_baseline not in _ERPO_BASELINES:
        raise ValueError(
            f"erpo option progress_baseline must be one of {_ERPO_BASELINES}, got {progress_baseline!r}"
        )
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int) or num_buckets < 1:
        raise ValueError(f"erpo option num_buckets must be a positive int, got {num_buckets!r}")
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
        raise ValueError(f"erpo option lam must be a finite number, got {lam!r}")
    if isinstance(gate_threshold, bool) or not isinstance(gate_threshold, (int, float)):
        raise ValueError(f"erpo option gate_threshold must be a number, got {gate_threshold!r}")
    _check_nonnegative("erpo", "eps", eps)

    n = rewards.shape[0]
    m = _token_mask("erpo", mask, n)
    h = _token_input("erpo", "entropy", entropy, m)
    lp = _token_input("erpo", "logp", logp, m)
    base_label = "ref_logp" if progress_baseline == "ref" else "old_logp"
    base_lp = _token_input("erpo", base_label, ref_logp if progress_baseline == "ref" else old_logp, m)
    a = _base_advantages("erpo", base, base_options, rewards, group_size)

    num_groups, seq_len = n // group_size, m.shape[1]

    # Entropy weight: z-score over every valid token of the group, then the gate.
    z = _masked_zscore(h.view(num_groups, -1), m.view(num_groups, -1), eps).view(n, seq_len)
    if gate == "relu":
        hn = (z - gate_threshold).clamp(min=0)
    elif gate == "hard":
        hn = (z > gate_threshold).to(z.dtype)
    else:
        hn = z
    hn = torch.where(m, hn, 0.0)

    # Progress signal: bucket means of d per response, z-scored per bucket across the group.
    d = lp - base_lp
    length = m.sum(dim=1, keepdim=True)
    pos = torch.cumsum(m.long(), dim=1) - 1  # 0-based index among valid tokens
    bucket = torch.div(pos * num_buckets, length.clamp(min=1), rounding_mode="floor").clamp(
        0, num_buckets - 1
    )
    bucket = torch.where(m, bucket, 0)
    onehot = torch.nn.functional.one_hot(bucket, num_buckets).to(d.dtype) * m.unsqueeze(-1)  # [N, T, K]
    bucket_count = onehot.sum(dim=1)  # [N, K]
    bucket_mean = (onehot * d.unsqueeze(-1)).sum(dim=1) / bucket_count.clamp(min=1)
    present = bucket_count > 0
    # Z-score across the G responses of each group, bucket by bucket: rows (group, bucket), columns responses.
    sbar = bucket_mean.view(num_groups, group_size, num_buckets).transpose(1, 2).reshape(-1, group_size)
    pres = present.view(num_groups, group_size, num_buckets).transpose(1, 2).reshape(-1, group_size)
    sn_bucket = (
        _masked_zscore(sbar, pres, eps)
        .view(num_groups, num_buckets, group_size)
        .transpose(1, 2)
        .reshape(n, num_buckets)
    )
    sn = torch.gather(sn_bucket, 1, bucket)

    adv = a.unsqueeze(1) + lam * hn * sn * torch.sign(a).unsqueeze(1)
    return torch.where(m, adv, 0.0)


# --------------------------------------------------------------------------------------------------------
# Dynamic sampling (group filter)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupFilterResult:
    """Which groups survive dynamic sampling.

    ``keep_mask``: ``[N]`` bool, whole groups. ``kept_group_indices``: ``[num_kept]`` long.
    ``metrics``: ``groups_total``, ``groups_kept``, ``groups_dropped_all_correct``, ``groups_dropped_all_wrong``,
    ``groups_dropped_all_equal`` (all dropped groups, including the two kinds before), ``frac_groups_dropped``.
    """

    keep_mask: Tensor
    kept_group_indices: Tensor
    group_size: int
    metrics: dict[str, float]

    def select(self, rows: Any) -> Any:
        """Kept rows of ``rows`` (a tensor ``[N, ...]`` or a sequence of length ``N``), same type back."""
        return select_rows(self.keep_mask, rows)


def select_rows(keep_mask: Tensor, rows: Any) -> Any:
    """Rows of ``rows`` where ``keep_mask`` ``[N]`` is True: a tensor ``[N, ...]`` or a list/tuple of length N."""
    keep_mask = torch.as_tensor(keep_mask, dtype=torch.bool)
    if keep_mask.dim() != 1:
        raise ValueError(f"keep_mask must be 1-D [N], got shape {tuple(keep_mask.shape)}")
    n = keep_mask.shape[0]
    if isinstance(rows, Tensor):
        if rows.dim() == 0 or rows.shape[0] != n:
            raise ValueError(
                f"cannot select rows: tensor has shape {tuple(rows.shape)}, expected first dim N={n}"
            )
        return rows[keep_mask.to(rows.device)]
    if isinstance(rows, (list, tuple)):
        if len(rows) != n:
            raise ValueError(f"cannot select rows: sequence has length {len(rows)}, expected N={n}")
        kept = [r for r, k in zip(rows, keep_mask.tolist()) if k]
        return type(rows)(kept) if isinstance(rows, tuple) else kept
    raise ValueError(f"cannot select rows of a {type(rows).__name__}; pass a Tensor [N, ...] or a list/tuple")


def filter_groups(
    rewards: Tensor, group_size: int, *, correct: Tensor | Sequence[bool] | None = None
) -> GroupFilterResult:
    r"""Dynamic sampling filter (DAPO 2503.14476 Sec. 3.2; TEPO 2510.09369 Eq. 10, ``0 < |correct| < G``).

    A group is dropped when all its G rewards are exactly equal: its group-relative advantage is zero for
    ``grpo``/``dr_grpo``/``rloo`` and it would only dilute the batch. With binary rewards this is exactly
    TEPO's constraint. Dropped groups are classified for the metrics by ``correct`` (``[N]`` bool, from the
    verifier); when ``correct`` is not given it is read as ``rewards > 0`` (binary 0/1 rewards). A dropped
    group that is neither all correct nor all wrong (equal shaped rewards, mixed correctness) counts only
    in ``groups_dropped_all_equal``. With G = 1 every group is dropped.
    """
    rewards, group_size = _validate_rewards(rewards, group_size)
    n = rewards.shape[0]
    num_groups = n // group_size
    if correct is None:
        correct_t = rewards > 0
    else:
        correct_t = torch.as_tensor(correct).detach().to(rewards.device)
        if correct_t.shape != (n,):
            raise ValueError(f"correct must have shape [N={n}], got {tuple(correct_t.shape)}")
        correct_t = correct_t.to(torch.bool)
    groups = _grouped(rewards, group_size)
    dropped = _zero_variance(groups).squeeze(1)
    corr = correct_t.view(num_groups, group_size)
    all_correct = dropped & corr.all(dim=1)
    all_wrong = dropped & ~corr.any(dim=1)
    keep_groups = ~dropped
    n_dropped = int(dropped.sum())
    metrics = {
        "groups_total": num_groups,
        "groups_kept": num_groups - n_dropped,
        "groups_dropped_all_correct": int(all_correct.sum()),
        "groups_dropped_all_wrong": int(all_wrong.sum()),
        "groups_dropped_all_equal": n_dropped,
        "frac_groups_dropped": n_dropped / num_groups,
    }
    return GroupFilterResult(
        keep_mask=keep_groups.repeat_interleave(group_size),
        kept_group_indices=keep_groups.nonzero().flatten(),
        group_size=group_size,
        metrics=metrics,
    )
