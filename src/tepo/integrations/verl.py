"""Every `tepo.losses` registry loss inside verl (0.9.x), computed by `tepo.losses.compute_policy_loss`.

Names (``actor_rollout_ref.actor.policy_loss.loss_mode``)
--------------------------------------------------------
Every loss ``<name>`` of our registry is registered in verl's policy-loss registry as ``tepo.<name>``
(``tepo.tepo``, ``tepo.gspo``, ``tepo.cispo``, ...). It is *also* registered under its bare name when verl has
no builtin of that name (``tepo``, ``grpo``, ``dapo``, ``dr_grpo``, ``gmpo``, ``prefix_is``,
``reinforce_is``, ``cov_gauss`` in verl 0.9.1). Where verl has a builtin of the same name (``gspo``,
``clip_cov``, ``kl_cov``, ``cispo`` in 0.9.1) the bare name stays verl's: ours is only ``tepo.<name>``.
`registered_names()` returns the mapping actually made.

Options
-------
Select `TepoPolicyLossConfig` with ``actor_rollout_ref.actor.policy_loss._target_=
tepo.integrations.verl.TepoPolicyLossConfig`` and set options with ``+actor_rollout_ref.actor.policy_loss.eps=0.2``
etc. A field left at None means "the loss's own default". verl's existing ``clip_cov_ratio``, ``clip_cov_lb``,
``clip_cov_ub`` and ``kl_cov_ratio`` fields are our ``clip_cov`` / ``kl_cov`` options of the same names.
Without the ``_target_`` every loss runs with its defaults.

Global counts: verl's actor fills ``config.global_batch_info`` (``dp_size``, ``batch_num_tokens``,
``global_batch_size``, ``loss_scale_factor``) for each micro-batch; the loss passes
``num_tokens = batch_num_tokens / dp_size``, ``num_seqs = global_batch_size / dp_size`` and
``max_len = loss_scale_factor`` (when set), which is exactly what verl's own ``agg_loss`` does, so the result
is invariant to data-parallel and micro-batch splits. Aggregation: ``policy_loss.agg`` if set, else verl's
``actor.loss_agg_mode`` (verl applies the same mode to its entropy bonus and KL loss).

What verl does not hand a registered loss
-----------------------------------------
verl 0.9.1 calls a registered loss with log-probs, old log-probs, advantages, the mask, the aggregation mode,
the actor config and rollout-correction weights only. Per-token entropy is used by verl itself (its entropy
bonus) and pi_old's entropies are computed in ``_compute_old_log_prob`` and then dropped by the driver before
the update. Hence, refused with an error at config time and at call time (never silently dropped):

- ``tepo_kl_mask_coef`` (TEPO v2's mask needs H and H_old): not available in verl; use `tepo`'s trainer or
  the TRL adapter.
- ``entropy_coef``: use verl's ``actor.entropy_coeff``, which adds the same ``-coef * agg(H)``.
- ``kl_coef`` / ``kl_estimator``: use verl's ``actor.use_kl_loss=True``, ``kl_loss_coef``, ``kl_loss_type``
  (``low_var_kl`` is k3) — the same ``coef * agg(KL(pi || pi_ref))``.
- rollout-correction weights (``rollout_is_weights``, from verl's ``algorithm.rollout_correction``): no
  registry loss multiplies by them; turn rollout correction off or use a verl builtin.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.workers.config import PolicyLossConfig

from tepo.losses import POLICY_LOSSES, compute_policy_loss, get_policy_loss, valid_options

PREFIX = "tepo."

# verl's own PolicyLossConfig fields that are options of our losses under the same name.
_VERL_SHARED_FIELDS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio")
# Our options verl cannot feed, with the verl setting that computes the same term (None: no equivalent).
_REFUSED = {
    "tepo_kl_mask_coef": (
        "TEPO v2's KL mask needs per-token entropies of pi and pi_old; verl 0.9 passes neither to a registered "
        "loss (pi_old's entropies are dropped before the update). Use tepo's trainer or the TRL adapter"
    ),
    "entropy_coef": "use verl's actor_rollout_ref.actor.entropy_coeff, which adds the same -coef * agg(H)",
    "kl_coef": (
        "use verl's actor_rollout_ref.actor.use_kl_loss=True with kl_loss_coef and kl_loss_type (low_var_kl = k3),"
        " which add the same coef * agg(KL(pi || pi_ref))"
    ),
    "kl_estimator": "use verl's actor_rollout_ref.actor.kl_loss_type (low_var_kl = k3)",
}


@dataclass
class TepoPolicyLossConfig(PolicyLossConfig):
    """verl's `PolicyLossConfig` plus the options of the `tepo.losses` registry (None: the loss's default).

    ``eps`` sets eps_low = eps_high. ``agg`` overrides verl's ``loss_agg_mode`` for our losses only.
    ``entropy_coef``, ``kl_coef``, ``kl_estimator`` and ``tepo_kl_mask_coef`` exist only to be refused with a
    message naming what to use instead (see the module docstring).
    """

    eps: float | None = None
    eps_low: float | None = None
    eps_high: float | None = None
    agg: str | None = None
    seed: int | None = None
    kl_cov_coef: float | None = None
    entropy_coef: float | None = None
    kl_coef: float | None = None
    kl_estimator: str | None = None
    tepo_kl_mask_coef: float | None = None

    def __post_init__(self) -> None:
        name = tepo_loss_name(self.loss_mode)
        if name is not None:
            options_from_config(self, name)  # raises now, on the driver, rather than inside a worker


_OWN_FIELDS = tuple(
    f.name for f in fields(TepoPolicyLossConfig) if f.name not in {g.name for g in fields(PolicyLossConfig)}
)


def tepo_loss_name(loss_mode: str) -> str | None:
    """Our registry name behind a verl ``loss_mode`` (``tepo.<name>`` or an uncolliding bare name), else None."""
    if loss_mode.startswith(PREFIX) and loss_mode[len(PREFIX) :] in POLICY_LOSSES:
        return loss_mode[len(PREFIX) :]
    if _REGISTERED.get(loss_mode) == loss_mode:
        return loss_mode
    return None


def _get(config: Any, key: str) -> Any:
    if config is None:
        return None
    getter = getattr(config, "get", None)
    return getter(key, None) if callable(getter) else getattr(config, key, None)


def options_from_config(policy_loss: Any, name: str) -> dict[str, Any]:
    """The options of loss ``name`` set in verl's ``policy_loss`` config; ValueError for refused/foreign ones."""
    spec = get_policy_loss(name)
    accepted = set(valid_options(spec))
    options: dict[str, Any] = {}
    for key in _OWN_FIELDS:
        value = _get(policy_loss, key)
        if value is None:
            continue
        if key in _REFUSED and value not in (0, 0.0):
            raise ValueError(f"policy_loss.{key}={value!r} is not supported with verl: {_REFUSED[key]}")
        if key in _REFUSED:
            continue
        if key not in accepted:
            raise ValueError(
                f"policy_loss.{key} is not an option of loss {name!r}; its options: "
                f"{', '.join(o for o in valid_options(spec) if o not in _REFUSED and o not in ('num_seqs', 'max_len'))}"
            )
        options[key] = value
    for key in _VERL_SHARED_FIELDS:
        if key in spec.defaults and _get(policy_loss, key) is not None:
            options[key] = _get(policy_loss, key)
    return options


def _count(info: dict, key: str) -> float | None:
    value = info.get(key)
    if value is None:
        return None
    return float(value.item() if hasattr(value, "item") else value)


def make_verl_loss(name: str):
    """A function with verl's registered-loss signature that computes ``compute_policy_loss(name, ...)``."""
    get_policy_loss(name)

    def tepo_verl_policy_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode: str = "token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        if rollout_is_weights is not None:
            raise ValueError(
                f"loss {name!r} received rollout-correction weights (verl's algorithm.rollout_correction): no tepo "
                "loss multiplies by them; disable rollout correction (or use a verl builtin loss)"
            )
        options = options_from_config(_get(config, "policy_loss"), name)
        info = dict(_get(config, "global_batch_info") or {})
        dp_size = _count(info, "dp_size") or 1.0
        tokens = _count(info, "batch_num_tokens")
        seqs = _count(info, "global_batch_size")
        scale = _count(info, "loss_scale_factor")
        options.setdefault("agg", loss_agg_mode)
        # verl's agg_loss divides by the global count and multiplies by dp_size (gradients are averaged over
        # data-parallel ranks): the same as dividing by global_count / dp_size.
        if seqs is not None:
            options["num_seqs"] = seqs / dp_size
        if scale is not None:
            options["max_len"] = scale
        loss, metrics = compute_policy_loss(
            name,
            logp=log_prob,
            old_logp=old_log_prob,
            advantages=advantages,
            mask=response_mask,
            num_tokens=None if tokens is None else tokens / dp_size,
            **options,
        )
        return loss, {f"actor/tepo/{key}": value for key, value in metrics.items()}

    tepo_verl_policy_loss.__name__ = f"tepo_{name}_policy_loss"
    tepo_verl_policy_loss.__doc__ = (
        f"verl policy loss computing tepo.losses.compute_policy_loss({name!r}, ...)."
    )
    return tepo_verl_policy_loss


# verl loss_mode -> our registry name, filled by register_with_verl().
_REGISTERED: dict[str, str] = {}


def register_with_verl() -> dict[str, str]:
    """Register every registry loss in verl (idempotent); returns {verl loss_mode: tepo loss name}."""
    if _REGISTERED:
        return dict(_REGISTERED)
    builtins = set(POLICY_LOSS_REGISTRY)
    for name in POLICY_LOSSES:
        fn = make_verl_loss(name)
        register_policy_loss(PREFIX + name)(fn)
        _REGISTERED[PREFIX + name] = name
        if name not in builtins:
            register_policy_loss(name)(fn)
            _REGISTERED[name] = name
    return dict(_REGISTERED)


def registered_names() -> dict[str, str]:
    """{verl loss_mode: tepo loss name} registered so far (empty before `register_with_verl`)."""
    return dict(_REGISTERED)
