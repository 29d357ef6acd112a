"""TEPO v2 under verl 0.9.1: the actor's loss that reads per-token entropies, for both of verl's PPO drivers.

`tepo.integrations.verl.tepo_ppo_loss` needs the current policy's entropies (``actor.calculate_entropy=True``)
and pi_old's in the update's batch. verl's actor loss is ``partial(verl.workers.utils.losses.ppo_loss,
config=actor_config)``, set in ``ActorRolloutRefWorker.init_model``; both trainers below replace it after their
workers start, through the worker group's own ``set_loss_fn``, with ``partial(tepo_ppo_loss, config=actor_config)``.

- verl's v1 driver (its default, ``trainer.use_v1=true``; needs verl's optional ``TransferQueue``):
  ``trainer.v1.trainer_mode=tepo_sync`` selects `TepoPPOTrainerSync`, verl's ``sync`` trainer plus the loss. Its
  ``_compute_old_log_prob`` already stores pi_old's entropies as the per-response field ``entropy``, which the
  update reads back. Registered when this module is imported in the driver's process: add it to
  ``VERL_USE_EXTERNAL_MODULES`` (examples/verl does).
- verl's legacy driver (``trainer.use_v1=false``; ``RayPPOTrainer``): `TepoRayPPOTrainer` also copies the
  ``entropys`` of ``_compute_old_log_prob`` to `tepo.integrations.verl.OLD_ENTROPY_KEY` (``old_entropys``),
  because that driver pops ``entropys`` before the update. ``python -m tepo.integrations.verl_main`` runs it.
  verl 0.9.1's legacy driver has no dynamic sampling (``algorithm.filter_groups`` is read by the v1 driver only).

Both refuse, before any worker starts, a TEPO v2 config that cannot work (`tepo_v2_config_errors`):
``tepo_kl_mask_coef != 0`` without ``actor.calculate_entropy=True``, with distillation (which replaces the actor
loss), or with rollout correction's bypass mode (no pi_old pass, so no pi_old entropies).

Token-level advantage estimators (``algorithm.adv_estimator=tepo.erpo``, `tepo.integrations.verl_advantages`)
read pi_old's entropies at the advantage step too: the legacy trainer's ``old_entropys`` are in the batch verl's
``compute_advantage`` gets, and `TepoPPOTrainerSync._compute_advantage` fetches v1's ``entropy`` field (one more
read of a stored [N, T] field, no forward pass) and hands it over. Both refuse, before workers start, an
estimator config verl cannot feed (`verl_advantages.advantage_config_errors`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.config import omega_conf_to_dataclass

from tepo.integrations.verl import OLD_ENTROPY_KEY, V1_OLD_ENTROPY_KEY, tepo_ppo_loss
from tepo.integrations.verl_advantages import (
    advantage_config_errors,
    advantage_fields,
    required_inputs,
    tepo_estimator_name,
)


def tepo_config_errors(config: Any) -> list[str]:
    """Problems of a verl trainer config for our trainers: TEPO v2's, then our advantage estimator's."""
    return tepo_v2_config_errors(config) + advantage_config_errors(config)


def tepo_v2_config_errors(config: Any) -> list[str]:
    """Problems of a verl trainer config that asks for TEPO v2's KL mask (empty when it does not ask for it)."""
    actor = config.actor_rollout_ref.actor
    coef = actor.policy_loss.get("tepo_kl_mask_coef", None)
    if not coef:
        return []
    errors = []
    if not actor.get("calculate_entropy", False):
        errors.append(
            "actor_rollout_ref.actor.calculate_entropy must be true with "
            f"policy_loss.tepo_kl_mask_coef={coef!r}: the update needs the current policy's per-token entropy"
        )
    distillation = config.get("distillation", None)
    if distillation is not None and distillation.get("enabled", False):
        errors.append(
            "distillation.enabled replaces the actor's loss; it cannot be combined with tepo_kl_mask_coef"
        )
    correction = config.algorithm.get("rollout_correction", None)
    if correction is not None and correction.get("bypass_mode", False):
        errors.append(
            "algorithm.rollout_correction.bypass_mode skips the pi_old pass, so pi_old's entropies do not exist; "
            "tepo_kl_mask_coef needs bypass_mode=false"
        )
    return errors


class TepoRayPPOTrainer(RayPPOTrainer):
    """verl's ``RayPPOTrainer`` keeping pi_old's entropies (for TEPO v2's loss and, being in the batch of verl's
    ``compute_advantage``, for the token-level estimators) and running `tepo_ppo_loss` as the actor loss."""

    def __init__(self, config, *args, **kwargs):
        errors = tepo_config_errors(config)
        if errors:
            raise ValueError("tepo under verl: " + "; ".join(errors))
        super().__init__(config, *args, **kwargs)

    def init_workers(self):
        super().init_workers()
        actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
        self.actor_rollout_wg.set_loss_fn(partial(tepo_ppo_loss, config=actor_config))

    def _compute_old_log_prob(self, batch):
        old_log_prob, mfu = super()._compute_old_log_prob(batch)
        old_log_prob.batch[OLD_ENTROPY_KEY] = old_log_prob.batch["entropys"].detach().clone()
        return old_log_prob, mfu


try:  # verl's v1 driver needs its optional TransferQueue dependency
    from verl.trainer.ppo.v1 import register_trainer
    from verl.trainer.ppo.v1.trainer_base import TRAINER_REGISTRY, tq
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
except ImportError:  # pragma: no cover - depends on the installation
    PPOTrainerSync = None

if PPOTrainerSync is not None and "tepo_sync" not in TRAINER_REGISTRY:

    @register_trainer("tepo_sync")
    class TepoPPOTrainerSync(PPOTrainerSync):
        """verl's v1 ``sync`` trainer with `tepo_ppo_loss` as the actor loss (``trainer.v1.trainer_mode=tepo_sync``).

        verl's v1 driver already keeps pi_old's entropies: ``_compute_old_log_prob`` writes them to its
        TransferQueue as the per-response field ``entropy`` next to ``old_log_probs``, and the update reads every
        persisted field of its samples back; `tepo_ppo_loss` takes H_old from there when `OLD_ENTROPY_KEY` is
        absent. Its advantage step fetches only its own fields, so `_compute_advantage` hands ``entropy`` to a
        token-level estimator that reads it (`verl_advantages.advantage_fields`).
        """

        def __init__(self, config, *args, **kwargs):
            errors = tepo_config_errors(config)
            if errors:
                raise ValueError("tepo under verl: " + "; ".join(errors))
            super().__init__(config, *args, **kwargs)

        def init(self):
            super().init()
            actor_config = omega_conf_to_dataclass(self.config.actor_rollout_ref.actor)
            self.actor_rollout_wg.set_loss_fn(partial(tepo_ppo_loss, config=actor_config))

        def _compute_advantage(self, batch, metrics):
            """verl's advantage step, with pi_old's stored entropies handed to our estimator when it reads them
            (verl's step fetches only its own fields from the TransferQueue)."""
            name = tepo_estimator_name(self.config.algorithm.adv_estimator)
            if name is None or "entropy" not in required_inputs(self.config.algorithm, name):
                return super()._compute_advantage(batch, metrics)
            stored = tq.kv_batch_get(
                keys=batch.keys,
                partition_id=batch.partition_id,
                select_fields=["response_mask", V1_OLD_ENTROPY_KEY],
            )
            # Padded as verl's step pads its own fetch (same keys, same rows), so the rows line up.
            entropy = stored.to_padded_tensor()[V1_OLD_ENTROPY_KEY]
            with advantage_fields({V1_OLD_ENTROPY_KEY: entropy}):
                return super()._compute_advantage(batch, metrics)
