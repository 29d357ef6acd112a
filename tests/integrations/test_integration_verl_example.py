"""examples/verl without verl installed (default suite): its loss options are options tepo accepts, TEPO v2 included.

The full check (the config composed by verl's own Hydra machinery, the trainer it selects) needs ``.venv-verl``
and lives in tests/integrations/test_integration_verl.py (``-m slow``). This one catches, in every run, an example whose
policy-loss options ``compute_policy_loss`` would reject or whose launch script loads a module that does not exist.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch
import yaml

from tepo.losses import compute_policy_loss

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "verl"
CONFIG = EXAMPLES / "tepo_qwen2.5_7b_dapo_math.yaml"
SCRIPT = EXAMPLES / "run_tepo_qwen2.5_7b_dapo_math.sh"


def _actor() -> dict:
    return yaml.safe_load(CONFIG.read_text())["actor_rollout_ref"]["actor"]


def test_example_policy_loss_options_are_tepo_options():
    policy_loss = dict(_actor()["policy_loss"])
    assert policy_loss.pop("_target_") == "tepo.integrations.verl.TepoPolicyLossConfig"
    name = policy_loss.pop("loss_mode")
    assert name == "tepo" and policy_loss["tepo_kl_mask_coef"] > 0
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=gen)
    old = logp + 0.1 * torch.randn(3, 4, generator=gen)
    inputs = dict(
        logp=logp, old_logp=old, advantages=torch.tensor([1.0, -1.0, 0.5]), mask=torch.ones(3, 4).bool()
    )
    # TEPO v2's mask needs both entropies: exactly what the example's trainer must deliver
    with pytest.raises(ValueError, match="entropy"):
        compute_policy_loss(name, **inputs, agg=_actor()["loss_agg_mode"], **policy_loss)
    entropy = torch.rand(3, 4, generator=gen)
    loss, metrics = compute_policy_loss(
        name,
        **inputs,
        agg=_actor()["loss_agg_mode"],
        entropy=entropy,
        old_entropy=entropy + 0.1,
        **policy_loss,
    )
    assert torch.isfinite(loss) and metrics["tepo_kl_mask_frac"] > 0


def test_example_selects_the_tepo_v2_wiring():
    config = yaml.safe_load(CONFIG.read_text())
    assert _actor()["calculate_entropy"] is True  # H per token in the update
    assert config["trainer"]["v1"]["trainer_mode"] == "tepo_sync"
    modules = re.search(r"VERL_USE_EXTERNAL_MODULES:-([^}]*)}", SCRIPT.read_text()).group(1).split(",")
    assert modules == ["tepo.integrations.verl_plugin", "tepo.integrations.verl_workers"]
    for module in modules:  # present in the package (importing them needs verl)
        assert importlib.util.find_spec(module) is not None, module
