"""``algorithm.rollout_correction`` / ``rollout_correction_options``: defaults and one-line errors naming the key
(before any model loads). How ``auto`` resolves is the trainer's plan: tests/training/test_step_plan.py."""

from __future__ import annotations

import pytest

from helpers import config_error_lines
from tepo.config import load_config


def test_defaults():
    config = load_config(None)
    assert config.algorithm.rollout_correction == "auto"
    assert config.algorithm.rollout_correction_options == {}


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["algorithm.rollout_correction=tiss"],
            "algorithm.rollout_correction: unknown correction 'tiss' (valid: auto, none, tis, mis, seq_tis, "
            "seq_mask, seq_k3, seq_max_k2)",
        ),
        (
            ["algorithm.rollout_correction=tis", "algorithm.rollout_correction_options.cap=0"],
            "algorithm.rollout_correction_options.cap: must be > 0, got 0",
        ),
        (
            ["algorithm.rollout_correction=mis", "algorithm.rollout_correction_options.c_low=-0.5"],
            "algorithm.rollout_correction_options.c_low: must be > 0, got -0.5",
        ),
        (
            [
                "algorithm.rollout_correction=seq_mask",
                "algorithm.rollout_correction_options={c_low: 1.2, c_high: 1.1}",
            ],
            "algorithm.rollout_correction_options.c_low: must be <= c_high, got c_low=1.2 > c_high=1.1",
        ),
        (
            ["algorithm.rollout_correction=mis", "algorithm.rollout_correction_options.cap=2"],
            "algorithm.rollout_correction_options.cap: not an option of rollout correction 'mis' "
            "(its options: c_low, c_high, normalize, verl_threshold)",
        ),
        (
            [
                "algorithm.rollout_correction_options.c_high=2"
            ],  # auto's options are those of the mode it turns on
            "algorithm.rollout_correction_options.c_high: not an option of rollout correction 'tis' "
            "(its options: cap, normalize)",
        ),
    ],
)
def test_each_problem_is_one_line_naming_the_key(overrides, line):
    lines = config_error_lines(overrides)
    assert f"  - {line}" in lines
    assert len(lines) == 2  # the header and this one problem


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.rollout_correction=none"],
        ["algorithm.rollout_correction=tis", "algorithm.rollout_correction_options.cap=5"],
        ["algorithm.rollout_correction=seq_tis"],
        [
            "algorithm.rollout_correction=mis",
            "algorithm.rollout_correction_options={c_low: 0.8, c_high: 1.25}",
        ],
        ["algorithm.rollout_correction=seq_mask", "algorithm.rollout_correction_options.c_high=1.01"],
        ["algorithm.rollout_correction_options.cap=3"],
    ],
)
def test_valid_settings_load(overrides):
    load_config(None, overrides)
