"""Adapters that run the `tepo.losses` registry inside other trainers.

- `tepo.integrations.trl`: `TepoGRPOTrainer`, a TRL `GRPOTrainer` whose loss is `compute_policy_loss`.
- `tepo.integrations.verl`: registration of every registry loss in verl's policy-loss registry, loaded in
  every verl process by the plugin module `tepo.integrations.verl_plugin`.

Neither is imported here: each needs its own optional dependency (TRL; verl in its own environment).
"""
