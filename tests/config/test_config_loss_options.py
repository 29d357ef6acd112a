"""The 2026 losses and options through the typed config: presets, ``algorithm.loss_options`` checked at start with
one line naming the problem, and ``tepo compare --losses`` resolving the new names."""

from __future__ import annotations

import pytest

from tepo.compare.planning import method_overrides, parse_methods
from tepo.config import ConfigError, list_presets, load_config, validate

NEW = ["sapo", "luspo", "dppo_tv", "dppo_kl", "vespo", "tepo_token", "gspo_token"]


def test_each_new_loss_has_a_preset_that_runs_it():
    assert set(NEW) <= set(list_presets())
    for name in NEW:
        assert load_config(name).algorithm.loss == name


def test_compare_resolves_the_2026_names():
    methods = parse_methods("tepo,sapo,luspo,dppo_tv,gspo")
    losses = [method_overrides(m)["algorithm.loss"] for m in methods]
    assert losses == ["tepo", "sapo", "luspo", "dppo_tv", "gspo"]


def test_options_are_accepted_where_they_apply():
    config = load_config(
        "grpo",
        [
            "algorithm.loss_options.dual_clip=3.0",
            "algorithm.loss_options.off_policy_mask=0.5",
            "algorithm.loss_options.top_entropy_quantile=0.2",
            "algorithm.loss_options.m2po_threshold=0.04",
        ],
    )
    assert validate(config) == []
    assert (
        validate(load_config("default", ["algorithm.loss=cispo", "algorithm.loss_options.eps_low=0.2"])) == []
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.loss_options.dual_clip=3"],
            "dual_clip applies only to policy losses grpo, dapo, dr_grpo",
        ),
        (["algorithm.loss=dapo", "algorithm.loss_options.dual_clip=1"], "dual_clip must be > 1"),
        (["algorithm.loss_options.top_entropy_quantile=0"], "top_entropy_quantile must be in (0, 1]"),
        (["algorithm.loss_options.m2po_threshold=-1"], "m2po_threshold must be >= 0"),
        (["algorithm.loss_options.off_policy_mask=near"], "off_policy_mask must be a finite number or None"),
        (["algorithm.loss=sapo", "algorithm.loss_options.tau_neg=0"], "tau_neg must be > 0"),
        (
            ["algorithm.loss=cispo", "algorithm.loss_options.eps=0.2"],
            "unknown option(s) eps for policy loss 'cispo'",
        ),
    ],
)
def test_bad_options_fail_at_start_with_one_line(overrides, message):
    with pytest.raises(ConfigError, match="invalid configuration") as err:
        load_config("tepo", overrides)
    assert message in str(err.value)
