"""Every `tepo.advantages` estimator inside verl (0.9.x), token-level ones included, as ``tepo.<name>``.

Names and options (``algorithm.*``)
-----------------------------------
Every estimator ``<name>`` of our registry is registered in verl's advantage-estimator registry
(``core_algos.register_adv_est``) as ``tepo.<name>`` only (``tepo.erpo``, ``tepo.entropy_adv``,
``tepo.ep_grpo``, ``tepo.grpo``...): verl's own estimators keep the bare names. A verl run selects one with
``algorithm.adv_estimator=tepo.erpo`` and sets its options under ``+algorithm.tepo_advantage.<option>=...``
(nested ``base_options`` too: ``+algorithm.tepo_advantage.base_options.std=population``); unset options are the
estimator's defaults. verl's ``algorithm.norm_adv_by_std_in_grpo=false`` and ``algorithm.gamma != 1`` are refused
with the tepo option to set instead: they are verl's settings, never read by our estimators.

What verl hands a registered estimator, and what ours reads
-----------------------------------------------------------
verl 0.9.1's ``compute_advantage`` (``verl/trainer/ppo/ray_trainer.py``; both PPO drivers call it, the v1 one
through ``compute_advantage_for_multi_trajectories``, which passes our names through unchanged) calls a registered
estimator with ``token_level_rewards``, ``response_mask``, ``index`` (the ``uid`` of each row's prompt) and
``config`` (``algorithm``) only, not the log-probs and entropies the token-level estimators read. Ours take them
from the batch that ``compute_advantage`` is computing for: its ``data`` (`_calling_batch` finds it one call up
and proves it is that batch: its ``token_level_rewards`` is the very tensor we were handed), plus any fields a
trainer adds for the call with `advantage_fields`. verl field -> our input (`INPUT_FIELDS`):

* ``logp`` and ``old_logp``: ``old_log_probs`` (pi_old's pass; verl computes advantages before any update, so the
  current policy is pi_old, as in tepo's own trainer). An estimator reading both (ERPO with
  ``progress_baseline="old"``) would see a difference of exactly 0, and is refused as tepo's trainer refuses it.
* ``ref_logp``: ``ref_log_prob``, computed by verl only with a reference policy (``actor.use_kl_loss=true`` or
  ``algorithm.use_kl_in_reward=true``; ``kl_loss_coef=0`` gives the pass without the loss term).
* ``entropy``: pi_old's per-token entropies, which verl's pi_old pass always computes (``calculate_entropy=True``
  in both drivers' ``_compute_old_log_prob``) but does not hand on: the legacy driver pops ``entropys`` (kept as
  ``old_entropys`` by `verl_workers.TepoRayPPOTrainer`), the v1 driver stores them as the per-response field
  ``entropy`` but fetches only its own fields for the advantage step (`verl_workers.TepoPPOTrainerSync` fetches it
  and hands it over with `advantage_fields`). No extra forward pass either way.
* ``sum_pi_squared``: verl's field of that name (``actor.calculate_sum_pi_squared=true``).
* ``mask``: ``response_mask`` as verl passes it (after rollout correction's rejection, as verl's own estimators).

Rewards are ``token_level_rewards`` summed over the response (what verl's ``grpo`` reads). Groups: verl keeps the
G responses of a prompt under one ``uid`` but not in contiguous rows (``trainer.balance_batch`` reorders them);
rows are put in group order for `tepo.advantages.compute_advantages` and the result put back, and groups must all
have the same size. A sequence-level result ``[N]`` is broadcast over ``response_mask`` as verl's estimators do;
``returns`` equal the advantages (verl's outcome estimators do the same).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from tepo.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, get_advantage_estimator
from tepo.integrations.verl_fields import OLD_ENTROPY_KEY, V1_OLD_ENTROPY_KEY

PREFIX = "tepo."
# algorithm.<OPTIONS_KEY>.<option>: the estimator's options in verl's config.
OPTIONS_KEY = "tepo_advantage"
# Our per-token input -> the verl batch fields holding it, first found wins.
INPUT_FIELDS: dict[str, tuple[str, ...]] = {
    "logp": ("old_log_probs",),
    "old_logp": ("old_log_probs",),
    "ref_logp": ("ref_log_prob",),
    # OLD_ENTROPY_KEY: TepoRayPPOTrainer's copy; "entropys": what _compute_old_log_prob returns;
    # V1_OLD_ENTROPY_KEY: the v1 driver's field (handed over by TepoPPOTrainerSync).
    "entropy": (OLD_ENTROPY_KEY, "entropys", V1_OLD_ENTROPY_KEY),
    "sum_pi_squared": ("sum_pi_squared",),
}
# What a verl user does to have each input in the batch at the advantage step.
_HOW_TO_GET = {
    "ref_logp": (
        "verl computes ref_log_prob only with a reference policy: set actor_rollout_ref.actor.use_kl_loss=true "
        "(actor_rollout_ref.actor.kl_loss_coef=0 keeps the loss unchanged) or algorithm.use_kl_in_reward=true"
    ),
    "entropy": (
        "pi_old's entropies reach the advantage step with verl's v1 driver through trainer.v1.trainer_mode="
        "tepo_sync (tepo.integrations.verl_workers in VERL_USE_EXTERNAL_MODULES), or with the legacy driver "
        "through `python -m tepo.integrations.verl_main` (trainer.use_v1=false); not with rollout_correction."
        "bypass_mode=true (no pi_old pass)"
    ),
    "logp": "old_log_probs is missing: verl's pi_old pass (or rollout_correction.bypass_mode) did not run",
    "sum_pi_squared": "set actor_rollout_ref.actor.calculate_sum_pi_squared=true",
    "reward_components": "use verl's own algorithm.adv_estimator=gdpo (with algorithm.gdpo_reward_keys)",
    "reward_weights": "use verl's own algorithm.adv_estimator=gdpo (with algorithm.gdpo_reward_keys)",
}
_HOW_TO_GET["old_logp"] = _HOW_TO_GET["logp"]
# verl settings of the algorithm section that our estimators do not read: refused when not at their default.
_VERL_SETTINGS = {
    "norm_adv_by_std_in_grpo": (
        True,
        "without the std division use algorithm.adv_estimator=tepo.dr_grpo, or set "
        f"+algorithm.{OPTIONS_KEY}.norm_by_std=false where the estimator has it (grpo_passk, gdpo)",
    ),
    "gamma": (1.0, f"tepo.reinforce_plus_plus's discount is +algorithm.{OPTIONS_KEY}.gamma"),
}
# Extra batch fields [N, T] for the current advantage step, set by a trainer with `advantage_fields`.
_EXTRA_FIELDS: ContextVar[Mapping[str, torch.Tensor] | None] = ContextVar(
    "tepo_verl_adv_fields", default=None
)


def tepo_estimator_name(adv_estimator: Any) -> str | None:
    """Our registry name behind verl's ``algorithm.adv_estimator`` (``tepo.<name>``), else None."""
    value = getattr(adv_estimator, "value", adv_estimator)
    if isinstance(value, str) and value.startswith(PREFIX) and value[len(PREFIX) :] in ADVANTAGE_ESTIMATORS:
        return value[len(PREFIX) :]
    return None


def _get(config: Any, key: str) -> Any:
    if config is None:
        return None
    getter = getattr(config, "get", None)
    return getter(key, None) if callable(getter) else getattr(config, key, None)


def _plain(value: Any) -> Any:
    """OmegaConf containers (Hydra's config) as plain dicts and lists, so options compare and copy as Python."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - verl depends on omegaconf
        return value
    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def estimator_options(algorithm: Any, name: str) -> dict[str, Any]:
    """The options of estimator ``name`` in verl's ``algorithm`` config; ValueError naming a refused setting,
    an unknown option, or a combination whose signal would be exactly 0 in verl."""
    for key, (default, ours) in _VERL_SETTINGS.items():
        value = _get(algorithm, key)
        if value is not None and value != default:
            raise ValueError(
                f"algorithm.{key}={value!r} is verl's setting and is not read by tepo.{name}: leave it at "
                f"{default!r}; {ours}"
            )
    options = _plain(_get(algorithm, OPTIONS_KEY)) or {}
    if not isinstance(options, Mapping):
        raise ValueError(f"algorithm.{OPTIONS_KEY} must be a mapping of options, got {options!r}")
    options = dict(options)
    estimator = get_advantage_estimator(name)
    estimator.check_options(options)
    needs = estimator.requires_for(options)
    if {"logp", "old_logp"} <= needs:
        raise ValueError(
            f"tepo.{name} with algorithm.{OPTIONS_KEY}={options!r} compares logp with old_logp, but verl computes "
            "advantages before any update, so both are old_log_probs: their difference is exactly 0 and that "
            "term would silently do nothing"
        )
    return options


def required_inputs(algorithm: Any, name: str) -> frozenset[str]:
    """The per-token inputs (`tepo.advantages.TENSOR_INPUTS` names) estimator ``name`` reads with verl's
    ``algorithm`` config, ``mask`` excluded (verl always passes ``response_mask``)."""
    needs = get_advantage_estimator(name).requires_for(estimator_options(algorithm, name))
    return frozenset(needs - {"mask"})


@contextmanager
def advantage_fields(fields: Mapping[str, torch.Tensor]) -> Iterator[None]:
    """Hand extra batch fields (verl names, ``[N, T]`` in the rows of the advantage step's batch) to our
    estimators called inside the block, for fields the driver does not put in that batch (v1's ``entropy``)."""
    token = _EXTRA_FIELDS.set(dict(fields))
    try:
        yield
    finally:
        _EXTRA_FIELDS.reset(token)


def _calling_batch(token_level_rewards: torch.Tensor, depth: int = 6) -> Mapping[str, torch.Tensor]:
    """The ``batch`` (a TensorDict) of the DataProto that verl's ``compute_advantage`` is computing for.

    verl 0.9.1 calls a registered estimator from ``compute_advantage(data, ...)`` with ``token_level_rewards=
    data.batch["token_level_rewards"]`` and nothing else of ``data``. The caller's local ``data`` is that batch
    when its ``token_level_rewards`` is the tensor we were handed (the same object): anything else is not
    trusted, and then only `advantage_fields` supply inputs.
    """
    frame = sys._getframe(1)  # walks up: `_inputs`, our registered estimator, verl's compute_advantage
    for _ in range(depth):
        if frame is None:
            break
        batch = getattr(frame.f_locals.get("data"), "batch", None)
        # TensorDict has no `in` (it refuses __contains__): keys() it is.
        holds = batch is not None and "token_level_rewards" in batch.keys()  # noqa: SIM118
        if holds and batch["token_level_rewards"] is token_level_rewards:
            return batch
        frame = frame.f_back
    return {}


def _response_width(value: torch.Tensor, width: int) -> torch.Tensor:
    """``value`` [N, T'] as [N, width]: zero-padded on the right when narrower (a field padded to its longest
    response next to a mask padded to verl's max_response_length); wider is an error (not the same rows)."""
    if value.shape[-1] < width:
        value = torch.nn.functional.pad(value, (0, width - value.shape[-1]))
    return value


def _inputs(name: str, needs: frozenset[str], token_level_rewards: torch.Tensor, shape: torch.Size):
    """Our per-token inputs ``needs`` from the calling batch and `advantage_fields`; ValueError for a missing one,
    naming the verl setting that supplies it."""
    fields = {**dict(_calling_batch(token_level_rewards).items()), **(_EXTRA_FIELDS.get() or {})}
    inputs, missing = {}, []
    for key in sorted(needs):
        field = next((f for f in INPUT_FIELDS.get(key, ()) if f in fields), None)
        if field is None:
            missing.append(key)
            continue
        value = _response_width(fields[field], shape[-1])
        if value.shape != shape:
            raise ValueError(
                f"tepo.{name}: batch field {field!r} has shape {tuple(value.shape)}, expected the response mask's "
                f"{tuple(shape)}"
            )
        inputs[key] = value
    if missing:
        raise ValueError(
            f"tepo.{name} reads {', '.join(missing)} [N, T] at verl's advantage step, which the batch does not "
            "hold: " + "; ".join(f"{key}: {_HOW_TO_GET.get(key, 'not supplied by verl')}" for key in missing)
        )
    return inputs


def group_rows(index: Any, n: int) -> tuple[torch.Tensor, int]:
    """The permutation putting the rows of each ``uid`` in ``index`` together (groups in order of first row,
    rows in batch order) and the common group size; ValueError when groups differ in size."""
    if index is None:
        return torch.arange(n), 1
    rows: dict[Any, list[int]] = {}
    for row, uid in enumerate(index):
        rows.setdefault(uid, []).append(row)
    sizes = sorted({len(members) for members in rows.values()})
    if len(sizes) != 1:
        raise ValueError(
            f"tepo estimators need every prompt (uid) to have the same number of responses, got group sizes "
            f"{sizes}: keep whole groups (verl's filter_groups keeps or drops whole groups)"
        )
    return torch.tensor([row for members in rows.values() for row in members]), sizes[0]


def make_verl_estimator(name: str):
    """A function with verl's registered-estimator signature computing ``compute_advantages(name, ...)``."""
    estimator = get_advantage_estimator(name)

    def tepo_verl_advantage(token_level_rewards, response_mask, index=None, config=None, **_verl_extras):
        options = estimator_options(config, name)
        needs = frozenset(estimator.requires_for(options) - {"mask"})
        mask = response_mask.bool()
        inputs = _inputs(name, needs, token_level_rewards, mask.shape)
        order, group_size = group_rows(index, mask.shape[0])
        rewards = token_level_rewards.sum(dim=-1)
        adv = compute_advantages(
            name,
            rewards[order],
            group_size,
            mask=mask[order],
            **{key: value[order] for key, value in inputs.items()},
            **options,
        )
        if not estimator.token_level:
            adv = adv.unsqueeze(-1) * mask[order]
        advantages = torch.empty_like(adv)
        advantages[order] = adv
        advantages = advantages.to(token_level_rewards.dtype)
        return advantages, advantages

    tepo_verl_advantage.__name__ = f"tepo_{name}_advantage"
    tepo_verl_advantage.__doc__ = (
        f"verl advantage estimator computing tepo.advantages.compute_advantages({name!r})."
    )
    return tepo_verl_advantage


_REGISTERED: dict[str, str] = {}


def register_estimators_with_verl() -> dict[str, str]:
    """Register every estimator of our registry in verl as ``tepo.<name>`` (idempotent; names registered after
    the first call are added by the next); returns {verl adv_estimator: tepo estimator name}."""
    # verl is imported here only: the rest of this module is verl-free (tests/integrations run it without verl).
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    for name in ADVANTAGE_ESTIMATORS:
        key = PREFIX + name
        if key not in _REGISTERED and key not in ADV_ESTIMATOR_REGISTRY:
            register_adv_est(key)(make_verl_estimator(name))
            _REGISTERED[key] = name
    return dict(_REGISTERED)


def _dry_run(name: str, options: Mapping[str, Any]) -> None:
    """``compute_advantages(name, ...)`` on a tiny all-zero batch, so an option's value (not only its name) is
    checked on the driver before any worker starts; ValueError as the real call would raise it."""
    zeros, group_size = torch.zeros(2, 2), 2
    inputs = {key: zeros for key in ("logp", "old_logp", "ref_logp", "entropy", "sum_pi_squared")}
    compute_advantages(
        name,
        torch.arange(group_size, dtype=torch.float32),
        group_size,
        mask=torch.ones(2, 2, dtype=torch.bool),
        reward_components=torch.zeros(2, 1),
        reward_weights=torch.ones(1),
        **inputs,
        **options,
    )


def advantage_config_errors(config: Any) -> list[str]:
    """Problems, before any worker starts, of a verl trainer config whose ``algorithm.adv_estimator`` is ours
    (empty otherwise): bad options, and inputs that verl would not compute with this config."""
    name = tepo_estimator_name(config.algorithm.adv_estimator)
    if name is None:
        return []
    try:
        needs = required_inputs(config.algorithm, name)
        _dry_run(name, estimator_options(config.algorithm, name))
    except ValueError as err:
        return [str(err)]
    errors = []
    actor = config.actor_rollout_ref.actor
    has_ref = bool(config.algorithm.get("use_kl_in_reward", False) or actor.get("use_kl_loss", False))
    correction = config.algorithm.get("rollout_correction", None)
    bypass = bool(correction is not None and correction.get("bypass_mode", False))
    absent = {
        "ref_logp": not has_ref,
        "entropy": bypass,
        "sum_pi_squared": not actor.get("calculate_sum_pi_squared", False),
        "reward_components": True,
        "reward_weights": True,
    }
    for key in sorted(needs):
        if absent.get(key, False):
            errors.append(f"algorithm.adv_estimator=tepo.{name} reads {key}: {_HOW_TO_GET[key]}")
    return errors
