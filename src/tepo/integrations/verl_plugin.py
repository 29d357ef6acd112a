"""verl plugin: importing this module registers every `tepo.losses` loss in verl's policy-loss registry and every
`tepo.advantages` estimator in its advantage-estimator registry (as ``tepo.<name>``).

verl imports it in every process (driver and Ray workers) at ``import verl``, through either

- the ``verl.plugins`` entry point declared in tepo's ``pyproject.toml`` (automatic once tepo is installed in
  verl's environment; ``VERL_USE_EXTERNAL_PLUGINS=auto``, verl's default), or
- ``VERL_USE_EXTERNAL_MODULES=tepo.integrations.verl_plugin``.

verl swallows a failing entry-point plugin (logged at DEBUG only), so check that it loaded:
``"tepo.tepo" in verl.trainer.ppo.core_algos.POLICY_LOSS_REGISTRY``. The names are in `REGISTERED` (losses) and
`REGISTERED_ESTIMATORS`.
"""

from __future__ import annotations

from tepo.integrations.verl import register_with_verl
from tepo.integrations.verl_advantages import register_estimators_with_verl

REGISTERED: dict[str, str] = register_with_verl()
REGISTERED_ESTIMATORS: dict[str, str] = register_estimators_with_verl()
