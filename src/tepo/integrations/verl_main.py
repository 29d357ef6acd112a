"""``python -m tepo.integrations.verl_main <hydra args>``: verl 0.9.1's ``main_ppo`` with `TepoRayPPOTrainer`.

The same Hydra configuration and launch as ``python -m verl.trainer.main_ppo`` (verl's config tree, verl's
``run_ppo`` and Ray set-up), except that the task runner builds `tepo.integrations.verl_workers.TepoRayPPOTrainer`
instead of ``RayPPOTrainer`` (pi_old's entropies for TEPO v2 and the token-level estimators; see that module). It runs verl's legacy driver, so it needs
``trainer.use_v1=false`` and refuses anything else with one message before Ray starts.
"""

from __future__ import annotations

import hydra
import ray
import verl.trainer.main_ppo_v0 as _v0
from omegaconf import DictConfig
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device


@ray.remote
class TepoTaskRunner(_v0.TaskRunner.__ray_actor_class__):
    """verl's v0 ``TaskRunner`` whose trainer is `TepoRayPPOTrainer` (swapped in its own Ray process only)."""

    def run(self, config):
        from tepo.integrations.verl_workers import TepoRayPPOTrainer

        _v0.RayPPOTrainer = TepoRayPPOTrainer
        return super().run(config)


def check_config(config: DictConfig) -> None:
    """ValueError, before Ray starts, for a config this entry point cannot run."""
    from tepo.integrations.verl_workers import tepo_config_errors

    errors = tepo_config_errors(config)
    if config.trainer.get("use_v1", False):
        errors.insert(
            0, "trainer.use_v1 must be false: TepoRayPPOTrainer extends verl's legacy RayPPOTrainer"
        )
    if errors:
        raise ValueError("tepo.integrations.verl_main: " + "; ".join(errors))


@hydra.main(config_path="pkg://verl.trainer.config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    auto_set_device(config)
    check_config(config)
    validate_config(
        config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    run_ppo(config, task_runner_class=TepoTaskRunner)


if __name__ == "__main__":
    main()
