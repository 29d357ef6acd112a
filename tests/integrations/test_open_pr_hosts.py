"""The objectives of open TRL / verl pull requests reach both hosts: GRPOConfig's ``delta`` is their own ``delta``,
codapo's inputs are ones TepoGRPOTrainer computes, and verl's ``policy_loss`` config has a field for every option
(read from the source: verl itself is installed only for the ``-m slow`` verl tests, whose registration check
covers every registry name)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tepo.advantages import estimator_requires
from tepo.losses import POLICY_LOSSES

ROOT = Path(__file__).resolve().parents[2]
OPEN_PR_LOSSES = ("up", "cppo", "topr", "stare", "fipo", "dapo_zv")


def test_grpo_config_delta_is_the_delta_option_where_the_loss_has_one(tmp_path):
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from tepo.integrations.trl_config import plan_loss

    args = GRPOConfig(output_dir=str(tmp_path), delta=1.5, report_to=[], use_cpu=True, bf16=False)
    for name in ("up", "stare", "dapo_zv"):
        assert plan_loss(args, name, {}).options == {"delta": 1.5}, name
    assert plan_loss(args, "dapo", {}).options == {
        "dual_clip": 1.5
    }  # a loss without delta: TRL's delta = dual clip


def test_codapo_reads_only_what_the_trl_adapter_computes():
    from tepo.integrations.trl_token_inputs import COMPUTABLE

    assert estimator_requires("codapo") == {"old_logp", "mask"} <= COMPUTABLE


def test_verl_policy_loss_config_has_a_field_for_every_open_pr_option():
    tree = ast.parse((ROOT / "src" / "tepo" / "integrations" / "verl.py").read_text(encoding="utf-8"))
    (config,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TepoPolicyLossConfig"]
    fields = {n.target.id for n in config.body if isinstance(n, ast.AnnAssign)}
    for name in OPEN_PR_LOSSES:
        spec = POLICY_LOSSES[name]
        options = set(spec.defaults) - {spec.batch_stats_option}
        assert options <= fields, (name, sorted(options - fields))
