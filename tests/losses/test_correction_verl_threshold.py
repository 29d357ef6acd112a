"""``seq_mask`` / ``mis`` with verl's threshold string (issue #36 item 1), in the default suite.

verl's k1 rejection (``rollout_rs=seq_mean_k1`` / ``token_k1``) bounds ``-log rho`` by ``[log lower, log upper]``;
tepo's ``c_low <= exp(mean log rho) <= c_high``; so tepo ``(c_low, c_high)`` = verl ``(1/upper, 1/lower)``, and
``verl_threshold="lower_upper"`` applies that mapping. The equality with verl's own function runs in
``.venv-verl`` (tests/integrations/test_integration_verl_rollout_rs.py, ``-m slow``); here the mapping, the parsing, the
refusals, the +-20 clamp and the config path, on closed-form rows.
"""

from __future__ import annotations

import math

import pytest
import torch

from tepo.config import ConfigError, load_config
from tepo.losses import rollout_correction_weights
from tepo.losses.rollout_correction import MODE_OPTIONS, rollout_correction_option_errors, verl_k1_bounds

F64 = torch.float64
# The issue's rows: one token each, mean log-ratio just inside / outside +-log(1.001) = +-0.0009995.
ISSUE_ROWS = torch.tensor([[-0.0010003], [-0.0009998], [0.0009998], [0.0010003]], dtype=F64)


def _keep(log_ratio, mode="seq_mask", mask=None, **options):
    mask = torch.ones_like(log_ratio, dtype=torch.bool) if mask is None else mask
    old = torch.full_like(log_ratio, -1.0)
    _, keep, _ = rollout_correction_weights(old, old - log_ratio, mask, mode=mode, **options)
    return keep


def test_the_same_numbers_keep_mirror_image_rows_and_verl_threshold_maps_them():
    same_numbers = _keep(ISSUE_ROWS, c_low=0.999, c_high=1.001)[:, 0].tolist()
    assert same_numbers == [True, True, False, False]
    # verl's "0.999_1.001" keeps mean(-log rho) in [log 0.999, log 1.001]: the last two rows
    assert _keep(ISSUE_ROWS, verl_threshold="0.999_1.001")[:, 0].tolist() == [False, False, True, True]
    assert _keep(ISSUE_ROWS, c_low=1 / 1.001, c_high=1 / 0.999)[:, 0].tolist() == [False, False, True, True]
    # the default is verl's decoupled_geo_rs() preset, mapped
    assert _keep(ISSUE_ROWS)[:, 0].tolist() == [False, False, True, True]
    assert MODE_OPTIONS["seq_mask"] == {"c_low": 1 / 1.001, "c_high": 1 / 0.999}


@pytest.mark.parametrize(
    ("spec", "bounds"),
    [
        ("0.999_1.001", (1 / 1.001, 1 / 0.999)),
        ("0.5_1.5", (1 / 1.5, 2.0)),
        ("2", (0.5, 2.0)),  # one number u is verl's 1/u_u
        (2.0, (0.5, 2.0)),
        (" 0.8_1.25 ", (0.8, 1.25)),
    ],
)
def test_verl_k1_bounds_parses_verls_spelling(spec, bounds):
    assert verl_k1_bounds(spec) == pytest.approx(bounds, rel=1e-15)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("seq_mask", {"verl_threshold": "1.5_0.5"}, "0 < lower <= upper"),
        ("seq_mask", {"verl_threshold": "abc"}, "verl's threshold string"),
        ("seq_mask", {"verl_threshold": 0.52}, "quote the string"),  # what YAML makes of 0.5_2 unquoted
        ("seq_mask", {"verl_threshold": True}, "verl's threshold string"),
        ("seq_mask", {"verl_threshold": "0.9_1.1", "c_high": 1.2}, "drop c_high"),
        ("tis", {"verl_threshold": "0.9_1.1"}, "not an option of rollout correction 'tis'"),
    ],
)
def test_bad_verl_thresholds_are_refused(mode, options, message):
    errors = rollout_correction_option_errors(mode, options)
    assert len(errors) == 1 and errors[0].startswith("verl_threshold"), errors
    assert message in errors[0], errors


def test_mis_kept_tokens_follow_the_same_mapping():
    d = torch.tensor([[math.log(0.45), math.log(0.55), math.log(1.9), math.log(2.1)]], dtype=F64)
    # verl token_k1 "0.5_2" keeps 0.5 <= 1/rho <= 2, i.e. rho in [0.5, 2]: symmetric, the same as c_low/c_high
    assert _keep(d, "mis", verl_threshold="0.5_2").tolist() == [[False, True, True, False]]
    # "0.8_2.5" keeps rho in [0.4, 1.25]
    assert _keep(d, "mis", verl_threshold="0.8_2.5").tolist() == [[True, True, False, False]]
    assert _keep(d, "mis", c_low=0.8, c_high=2.5).tolist() == [[False, False, True, True]]


def test_seq_mask_clamps_each_log_ratio_at_verls_safety_bound():
    # [30, -29.99]: mean 0.005 unclamped (outside +-0.001), 0 once each token is clamped to [-20, 20] (kept)
    far = torch.tensor([[30.0, -29.99]], dtype=F64)
    assert bool(_keep(far).all())
    assert not bool(_keep(torch.tensor([[19.0, -18.99]], dtype=F64)).any())  # inside the bound: mean 0.005


def test_verl_threshold_loads_from_the_config():
    config = load_config(
        None,
        [
            "algorithm.rollout_correction=seq_mask",
            "algorithm.rollout_correction_options.verl_threshold='0.99_1.01'",
        ],
    )
    assert config.algorithm.rollout_correction_options == {"verl_threshold": "0.99_1.01"}
    with pytest.raises(ConfigError, match=r"algorithm\.rollout_correction_options\.verl_threshold: .*quote"):
        load_config(
            None,
            [
                "algorithm.rollout_correction=seq_mask",
                "algorithm.rollout_correction_options.verl_threshold=0.5_2",
            ],
        )
