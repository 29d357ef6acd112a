"""Every `tepo.losses` registry loss inside verl (0.9.x), computed by `tepo.losses.compute_policy_loss`.

Names (``actor_rollout_ref.actor.policy_loss.loss_mode``)
--------------------------------------------------------
Every loss ``<name>`` of our registry is registered in verl's policy-loss registry as ``tepo.<name>``
(``tepo.tepo``, ``tepo.gspo``, ``tepo.cispo``, ...). It is *also* registered under its bare name when verl has
no builtin of that name (``tepo``, ``grpo``, ``dapo``, ``dr_grpo``, ``gmpo``, ``prefix_is``,
``reinforce_is``, ``cov_gauss``, ``luspo``, ``vespo``, ``tepo_token``, ``gspo_token`` in verl 0.9.1). Where verl
has a builtin of the same name (``gspo``, ``clip_cov``, ``kl_cov``, ``cispo``, ``sapo``, ``dppo_tv``, ``dppo_kl``
in 0.9.1) the bare name stays verl's: ours is only ``tepo.<name>`` (docs/parity.md: what each computes).
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

Rollout correction
------------------
verl's ``algorithm.rollout_correction`` computes ``rollout_is_weights`` on the driver (detached, zero on padding)
and, for its rejection modes, ANDs the rejection into ``response_mask`` before the update; ``ppo_loss`` hands
both to the registered loss. Our losses multiply the weights into their per-token term before aggregation
(``compute_policy_loss(..., is_weights=rollout_is_weights)``), exactly where verl's own losses do
(``pg_losses * rollout_is_weights``), and aggregate over the (already rejected) mask with verl's global counts.

The sampler's log-probs (``rollout_logp``)
------------------------------------------
With ``actor_rollout_ref.rollout.calculate_log_probs=True`` the update's batch holds verl's ``rollout_log_probs``
(the sampler's log-prob of each token). verl 0.9.1's ``ppo_loss`` does not pass them to a registered loss (its
``PolicyLossFn`` type still lists them, no caller does), so `tepo_ppo_loss` reads them from the batch and our
loss passes them as ``compute_policy_loss(..., rollout_logp=...)``: the "behaviour" policy of ``dppo_tv`` /
``dppo_kl``'s divergence mask, ``off_policy_mask`` and ``m2po_threshold`` (without them, pi_old). A caller that
does pass ``rollout_log_probs=`` to the registered loss (a later verl) is used first.

The 2026 options
----------------
``dual_clip`` (grpo, dapo, dr_grpo), ``tau_pos``/``tau_neg`` (``tepo.sapo``; verl's ``actor.tau_*`` belong to
its builtin ``sapo``), ``k_pos``/``lam_pos``/``k_neg``/``lam_neg`` (vespo), ``delta_low``/``delta_high``
(dppo_tv), ``delta`` (dppo_kl), cispo's ``eps_low``, and on any loss ``off_policy_mask``,
``top_entropy_quantile`` (needs the current policy's entropy: `tepo_ppo_loss` with ``actor.calculate_entropy=
True``) and ``m2po_threshold``. verl calls the loss once per micro-batch with no view of the mini-batch, so the
two batch-dependent selections (the entropy quantile, M2PO's drop order) are taken over each verl micro-batch,
as TRL takes its entropy quantile; they equal tepo's mini-batch selection when a mini-batch is one micro-batch
per rank (``ppo_micro_batch_size_per_gpu`` = the per-rank mini-batch).

TEPO v2 (``tepo_kl_mask_coef``): per-token entropies
-----------------------------------------------------
verl 0.9.1 calls a registered loss with log-probs, old log-probs, advantages, the mask, the aggregation mode,
the actor config and rollout-correction weights only. TEPO v2's KL mask also needs the current policy's
per-token entropy ``H`` and pi_old's ``H_old``. `tepo_ppo_loss` is verl's own actor loss
(``verl.workers.utils.losses.ppo_loss``, unchanged: entropy bonus, KL loss and metrics stay verl's) that first
makes both available to our registered loss for the duration of the call: ``H`` from the actor's forward
(``model_output["entropy"]``, present when ``actor.calculate_entropy=True``) and ``H_old`` from the update's
batch: the field ``entropy`` where verl's v1 driver (its default) stored its pi_old pass, or `OLD_ENTROPY_KEY`
where `verl_workers.TepoRayPPOTrainer` keeps the ``entropys`` that verl's legacy driver computes and drops.
`verl_workers` installs `tepo_ppo_loss` as the actor's loss for either driver (see there). A loss with
``tepo_kl_mask_coef != 0`` called without them (verl's plain ``ppo_loss``) raises a ValueError naming what is
missing; it never silently drops the term.

Still refused, with the verl setting that computes the same term:

- ``entropy_coef``: use verl's ``actor.entropy_coeff``, which adds the same ``-coef * agg(H)``.
- ``kl_coef`` / ``kl_estimator``: use verl's ``actor.use_kl_loss=True``, ``kl_loss_coef``, ``kl_loss_type``
  (``low_var_kl`` is k3) — the same ``coef * agg(KL(pi || pi_ref))``.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, fields
from typing import Any

import torch
from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, register_policy_loss
from verl.workers.config import PolicyLossConfig

from tepo.integrations.verl_fields import OLD_ENTROPY_KEY, ROLLOUT_LOGP_KEY, V1_OLD_ENTROPY_KEY
from tepo.losses import POLICY_LOSSES, compute_policy_loss, get_policy_loss, valid_options

PREFIX = "tepo."

# verl's own PolicyLossConfig fields that are options of our losses under the same name.
_VERL_SHARED_FIELDS = ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio")
# Our options verl cannot feed, with the verl setting that computes the same term (None: no equivalent).
_REFUSED = {
    "entropy_coef": "use verl's actor_rollout_ref.actor.entropy_coeff, which adds the same -coef * agg(H)",
    "kl_coef": (
        "use verl's actor_rollout_ref.actor.use_kl_loss=True with kl_loss_coef and kl_loss_type (low_var_kl = k3),"
        " which add the same coef * agg(KL(pi || pi_ref))"
    ),
    "kl_estimator": "use verl's actor_rollout_ref.actor.kl_loss_type (low_var_kl = k3)",
}
# Per-token tensors verl does not pass to a registered loss, set by `tepo_ppo_loss` for one call.
_TOKEN_TENSORS: ContextVar[dict[str, torch.Tensor] | None] = ContextVar(
    "tepo_verl_token_tensors", default=None
)


@dataclass
class TepoPolicyLossConfig(PolicyLossConfig):
    """verl's `PolicyLossConfig` plus the options of the `tepo.losses` registry (None: the loss's default).

    ``eps`` sets eps_low = eps_high. ``agg`` overrides verl's ``loss_agg_mode`` for our losses only.
    ``tepo_kl_mask_coef`` (TEPO v2) needs `tepo_ppo_loss` as the actor's loss (see `verl_workers`).
    ``entropy_coef``, ``kl_coef`` and ``kl_estimator`` exist only to be refused with a message naming what to use
    instead (see the module docstring).
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
    tepo_kl_mask_estimator: str | None = None
    # The 2026 losses' own options (sapo, vespo, dppo_tv, dppo_kl) and options (dual_clip on grpo/dapo/dr_grpo;
    # the token selections on any loss). Our ``tepo.sapo`` reads these tau_pos/tau_neg, not verl's
    # ``actor.tau_pos``/``actor.tau_neg`` (those belong to verl's builtin ``sapo``).
    dual_clip: float | None = None
    tau_pos: float | None = None
    tau_neg: float | None = None
    k_pos: float | None = None
    lam_pos: float | None = None
    k_neg: float | None = None
    lam_neg: float | None = None
    delta: float | None = None
    delta_low: float | None = None
    delta_high: float | None = None
    off_policy_mask: float | None = None
    top_entropy_quantile: float | None = None
    m2po_threshold: float | None = None
    cap: float | None = None  # cispo / cispo_seq: the IS weight's ceiling in place of 1 + eps_high
    # The objectives of open TRL / verl pull requests (up, cppo, topr, stare, fipo, dapo_zv).
    log_ratio_clamp: float | None = None
    w_min: float | None = None
    delta_b: float | None = None
    delta_b_q: float | None = None
    delta_b_k: float | None = None
    tis_cap: float | None = None
    value_form: str | None = None
    horizon: int | None = None
    lower: float | None = None
    upper: float | None = None
    seq_ratio: str | None = None
    variant: str | None = None
    p: float | None = None
    W: float | None = None
    M: float | None = None
    H_tgt: float | None = None
    batch_entropy: float | None = None
    k_rounding: str | None = None
    clip_ratio_c: float | None = None
    decay_rate: float | None = None
    influence_clip: float | None = None
    high_only: bool | None = None
    safety_threshold: float | None = None
    tol: float | None = None

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


def _needs_entropy(name: str, options: dict[str, Any]) -> bool:
    return (
        bool(options.get("tepo_kl_mask_coef"))
        or options.get("top_entropy_quantile") is not None
        or "entropy" in get_policy_loss(name).requires
    )


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
        rollout_log_probs=None,
    ):
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
        token_tensors = _TOKEN_TENSORS.get() or {}
        if rollout_log_probs is None:  # verl 0.9.1's ppo_loss does not pass them: `tepo_ppo_loss` does
            rollout_log_probs = token_tensors.get("rollout_logp")
        if (
            _needs_entropy(name, options)
            and token_tensors.get("entropy") is None
            and not options.get("tepo_kl_mask_coef")
        ):
            quantile = options.get("top_entropy_quantile")
            why = (
                f"policy_loss.top_entropy_quantile={quantile!r}" if quantile is not None else f"loss {name!r}"
            )
            raise ValueError(
                f"{why} needs the current policy's "
                f"per-token entropy, which did not reach loss {name!r}: the actor loss must be "
                "tepo.integrations.verl.tepo_ppo_loss (see tepo.integrations.verl_workers), with "
                "actor_rollout_ref.actor.calculate_entropy=True"
            )
        if options.get("tepo_kl_mask_coef"):
            missing = [key for key in ("entropy", "old_entropy") if token_tensors.get(key) is None]
            if missing:
                raise ValueError(
                    f"policy_loss.tepo_kl_mask_coef={options['tepo_kl_mask_coef']!r} (TEPO v2) needs per-token "
                    f"entropies of pi and pi_old, but {' and '.join(missing)} did not reach loss {name!r}: the actor "
                    "loss must be tepo.integrations.verl.tepo_ppo_loss, with actor_rollout_ref.actor."
                    "calculate_entropy=True and pi_old's entropies in the batch: set trainer.v1.trainer_mode="
                    "tepo_sync (verl's v1 driver) or run `python -m tepo.integrations.verl_main` (legacy driver); "
                    "see tepo.integrations.verl_workers"
                )
        # verl's rollout_is_weights are detached constants (zero on padding); rejected tokens are already out of
        # response_mask. Multiplied into the per-token term before aggregation, as verl's own losses do.
        loss, metrics = compute_policy_loss(
            name,
            logp=log_prob,
            old_logp=old_log_prob,
            advantages=advantages,
            mask=response_mask,
            num_tokens=None if tokens is None else tokens / dp_size,
            is_weights=None if rollout_is_weights is None else rollout_is_weights.detach(),
            entropy=token_tensors.get("entropy") if _needs_entropy(name, options) else None,
            old_entropy=token_tensors.get("old_entropy") if options.get("tepo_kl_mask_coef") else None,
            rollout_logp=None if rollout_log_probs is None else rollout_log_probs.detach(),
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


@contextmanager
def token_tensors(
    entropy: torch.Tensor | None,
    old_entropy: torch.Tensor | None,
    rollout_logp: torch.Tensor | None = None,
):
    """Hand per-token ``entropy`` (pi, with gradient), ``old_entropy`` (pi_old) and ``rollout_logp`` (the
    sampler's log-probs) [N, T] to our registered losses called inside the block (verl 0.9.1's loss call has no
    place for them)."""
    token = _TOKEN_TENSORS.set({"entropy": entropy, "old_entropy": old_entropy, "rollout_logp": rollout_logp})
    try:
        yield
    finally:
        _TOKEN_TENSORS.reset(token)


def tepo_ppo_loss(config, model_output, data, dp_group=None):
    """verl's actor loss ``verl.workers.utils.losses.ppo_loss`` with TEPO v2's per-token entropies available.

    Same signature and result as verl's ``ppo_loss(config, model_output, data, dp_group)`` (policy loss through
    verl's registry, verl's entropy bonus and KL loss, verl's metrics). In addition our registered loss sees
    ``H = model_output["entropy"]`` (present when the update runs with ``calculate_entropy``) and ``H_old =
    data[OLD_ENTROPY_KEY]`` (verl's legacy driver through `TepoRayPPOTrainer`) or ``data["entropy"]`` (what verl's
    v1 driver stores from its pi_old pass), both brought to verl's padded [N, T] response layout as ``ppo_loss``
    does for the log-probs, so ``tepo_kl_mask_coef`` and ``top_entropy_quantile`` work; and, when the batch has
    them, verl's ``rollout_log_probs`` as our ``rollout_logp``. Other losses are unaffected.
    """
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import no_padding_2_padding

    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)
    key = next((k for k in (OLD_ENTROPY_KEY, V1_OLD_ENTROPY_KEY) if k in data), None)
    old_entropy = None if key is None else _padded_response_field(data, key)
    rollout_logp = _padded_response_field(data, ROLLOUT_LOGP_KEY) if ROLLOUT_LOGP_KEY in data else None
    with token_tensors(entropy, old_entropy, rollout_logp):
        return ppo_loss(config, model_output, data, dp_group)


def _padded_response_field(data, key: str) -> torch.Tensor:
    """Per-response field ``key`` of the update's batch in verl's padded [N, T] layout, detached: padded as
    ``ppo_loss`` pads its own per-response fields (jointly with response_mask)."""
    padded = data.select("response_mask", key).to_padded_tensor()
    value, width = padded[key], padded["response_mask"].shape[-1]
    if value.shape[-1] < width:  # a nested field shorter than a dense mask: pad the masked tail
        value = torch.nn.functional.pad(value, (0, width - value.shape[-1]))
    return value.detach()
