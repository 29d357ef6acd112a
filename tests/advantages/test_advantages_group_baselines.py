"""The 2026 advantage estimators against hand values: ``grpo_batch_std`` (Lite-PPO, TRL scale_rewards="batch"),
``maxrl`` (MaxRL) and ``opo`` (OPO, verl): closed forms, zero groups, batch-statistic behaviour, refusals."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import config_error_lines
from tepo.advantages import compute_advantages, estimator_requires, get_advantage_estimator
from tepo.config import ConfigError, load_config

F64 = torch.float64


def _r(*values):
    return torch.tensor(values, dtype=F64)


def test_registered_after_the_papers_estimators_with_their_needs():
    from tepo.advantages import list_advantage_estimators

    names = list_advantage_estimators()
    assert names[:5] == ["grpo", "dr_grpo", "rloo", "entropy_adv", "erpo"]
    assert names.index("grpo_batch_std") < names.index("maxrl") < names.index("opo")
    assert estimator_requires("grpo_batch_std") == frozenset()
    assert estimator_requires("maxrl") == frozenset()
    assert estimator_requires("opo") == frozenset({"mask"})  # the response lengths
    for name in ("grpo_batch_std", "maxrl", "opo"):
        est = get_advantage_estimator(name)
        assert est.group_relative and not est.token_level


# ---- grpo_batch_std ------------------------------------------------------------------------------------------


def test_grpo_batch_std_hand_values():
    # Groups (1, 0) and (1, 1): group means 0.5 and 1; batch mean 0.75, squared deviations 3 * 1/16 + 9/16 = 3/4,
    # unbiased std sqrt(3/4 / 3) = 0.5 -> A = (0.5 / 0.5, -0.5 / 0.5, 0, 0).
    adv = compute_advantages("grpo_batch_std", _r(1, 0, 1, 1), 2, eps=0.0)
    torch.testing.assert_close(adv, _r(1, -1, 0, 0), rtol=0, atol=0)
    population = compute_advantages("grpo_batch_std", _r(1, 0, 1, 1), 2, eps=0.0, std="population")
    torch.testing.assert_close(population, _r(0.5, -0.5, 0, 0) / math.sqrt(3 / 16))
    default = compute_advantages("grpo_batch_std", _r(1, 0, 1, 1), 2)  # eps 1e-6 on the std
    torch.testing.assert_close(default, _r(0.5, -0.5, 0, 0) / (0.5 + 1e-6))


def test_grpo_batch_std_differs_from_grpo_only_by_the_scale():
    r = _r(3, 1, 0.2, 0.4, 5, 5.5)
    grpo = compute_advantages("grpo", r, 2, eps=0.0)
    batch = compute_advantages("grpo_batch_std", r, 2, eps=0.0)
    centred = r.view(3, 2) - r.view(3, 2).mean(1, keepdim=True)
    torch.testing.assert_close(batch, (centred / r.std()).flatten())
    # Per group, batch/grpo = std_g / std_batch: the small-spread group (0.2, 0.4) is no longer scaled to +-0.707.
    ratio = (batch / grpo).view(3, 2)
    torch.testing.assert_close(ratio[:, 0], r.view(3, 2).std(1) / r.std())


def test_grpo_batch_std_one_groups_scale_depends_on_the_others():
    # The std is a batch statistic: the whole rollout batch must be scored at once (the trainer does, before
    # any mini- or micro-batching), and reordering groups leaves each group's advantages unchanged.
    a = compute_advantages("grpo_batch_std", _r(1, 0, 0, 0), 2)
    b = compute_advantages("grpo_batch_std", _r(1, 0, 5, 0), 2)
    assert a[0].item() != pytest.approx(b[0].item())
    swapped = compute_advantages("grpo_batch_std", _r(5, 0, 1, 0), 2)
    torch.testing.assert_close(swapped, torch.cat([b[2:], b[:2]]))


@pytest.mark.parametrize("name", ["grpo_batch_std", "maxrl"])
def test_all_equal_groups_and_group_size_one_give_exact_zero(name):
    adv = compute_advantages(name, _r(0.3, 0.3, 1, 0), 2)
    assert adv[0].item() == 0.0 and adv[1].item() == 0.0 and adv[2].item() > 0
    assert torch.equal(compute_advantages(name, _r(1, 0, 1), 1), torch.zeros(3, dtype=F64))
    assert torch.equal(compute_advantages(name, _r(2, 2, 2, 2), 4), torch.zeros(4, dtype=F64))


# ---- maxrl ---------------------------------------------------------------------------------------------------


def test_maxrl_hand_values():
    # R = (1, 0, 0, 0): p = 0.25 -> A = (0.75 / 0.25, -0.25 / 0.25, ...) = (3, -1, -1, -1) at eps 0.
    torch.testing.assert_close(compute_advantages("maxrl", _r(1, 0, 0, 0), 4, eps=0.0), _r(3, -1, -1, -1))
    # R = (1, 1, 1, 0): p = 0.75 -> (1/3, 1/3, 1/3, -1); default eps 1e-6 on the mean.
    torch.testing.assert_close(
        compute_advantages("maxrl", _r(1, 1, 1, 0), 4), _r(0.25, 0.25, 0.25, -0.75) / (0.75 + 1e-6)
    )


def test_maxrl_weighs_hard_prompts_more_than_dr_grpo():
    # dr_grpo's centred reward scaled by 1/p: by 4 for the rarely solved prompt (p = 0.25), by 4/3 at p = 0.75.
    r = _r(1, 0, 0, 0, 1, 1, 1, 0)
    dr = compute_advantages("dr_grpo", r, 4)
    maxrl = compute_advantages("maxrl", r, 4, eps=0.0)
    torch.testing.assert_close(maxrl[:4], dr[:4] / 0.25)
    torch.testing.assert_close(maxrl[4:], dr[4:] / 0.75)


def test_maxrl_unsolved_group_is_zero():
    adv = compute_advantages("maxrl", _r(0, 0, 0, 0, 1, 0, 0, 0), 4)
    assert torch.equal(adv[:4], torch.zeros(4, dtype=F64))


def test_maxrl_refuses_negative_rewards():
    with pytest.raises(ValueError, match=r"maxrl .* rewards must be >= 0; negative at rows \[2\]"):
        compute_advantages("maxrl", _r(1, 0, -0.5, 1), 2)
    with pytest.raises(ValueError, match="maxrl option eps must be a number >= 0"):
        compute_advantages("maxrl", _r(1, 0), 2, eps=-1.0)


# ---- opo -----------------------------------------------------------------------------------------------------


def test_opo_hand_values_length_weighted_baseline():
    # Group 1: R = (1, 0), lengths (1, 3): baseline 1/4 -> A = (0.75, -0.25).
    # Group 2: R = (0, 1), lengths (2, 2): baseline 1/2 (equal lengths: the plain mean) -> (-0.5, 0.5).
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [0, 1, 1]])  # left padding counts the same
    adv = compute_advantages("opo", _r(1, 0, 0, 1), 2, mask=mask)
    torch.testing.assert_close(adv, _r(0.75, -0.25, -0.5, 0.5), rtol=0, atol=1e-15)
    # The weighted baseline differs from dr_grpo's plain mean exactly where lengths differ.
    dr = compute_advantages("dr_grpo", _r(1, 0, 0, 1), 2)
    torch.testing.assert_close(adv[2:], dr[2:])
    assert adv[0].item() != pytest.approx(dr[0].item())


def test_opo_general_closed_form():
    gen = torch.Generator().manual_seed(0)
    r = torch.rand(6, generator=gen, dtype=F64)
    mask = torch.rand(6, 7, generator=gen) > 0.4
    mask[:, 0] = True
    adv = compute_advantages("opo", r, 3, mask=mask)
    lengths = mask.sum(1).to(F64).view(2, 3)
    groups = r.view(2, 3)
    expected = groups - (lengths * groups).sum(1, keepdim=True) / lengths.sum(1, keepdim=True)
    torch.testing.assert_close(adv, expected.flatten())


def test_opo_zero_groups_and_empty_responses():
    mask = torch.tensor([[1, 1], [1, 0], [0, 0], [0, 0]])
    adv = compute_advantages("opo", _r(0.5, 0.5, 1, 0), 2, mask=mask)
    assert adv[0].item() == 0.0 and adv[1].item() == 0.0  # all-equal rewards: exactly 0
    torch.testing.assert_close(adv[2:], _r(0.5, -0.5))  # no token in the group: plain mean, not NaN
    assert torch.equal(compute_advantages("opo", _r(1, 0), 1, mask=mask[:2]), torch.zeros(2, dtype=F64))


def test_opo_refuses_a_missing_or_bad_mask():
    with pytest.raises(ValueError, match=r"'opo' needs mask=\[N, T\]"):
        compute_advantages("opo", _r(1, 0), 2)
    with pytest.raises(ValueError, match=r"opo: mask must have shape \[N=2, T\]"):
        compute_advantages("opo", _r(1, 0), 2, mask=torch.ones(3, 2))
    with pytest.raises(ValueError, match="opo: mask must hold only 0/1"):
        compute_advantages("opo", _r(1, 0), 2, mask=torch.full((2, 2), 2.0))


def test_options_are_refused_where_they_do_not_exist():
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['eps'\] for advantage estimator 'opo'"):
        compute_advantages("opo", _r(1, 0), 2, mask=torch.ones(2, 1), eps=1e-3)
    with pytest.raises(ValueError, match="grpo_batch_std option std must be 'unbiased' or 'population'"):
        compute_advantages("grpo_batch_std", _r(1, 0), 2, std="sample")


# ---- config --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["grpo_batch_std", "maxrl", "opo"])
def test_config_accepts_each_estimator(name):
    assert load_config(None, [f"algorithm.advantage={name}"]).algorithm.advantage == name


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["algorithm.advantage=maxrl", "algorithm.advantage_options.eps=-1"], "maxrl option eps must be"),
        (["algorithm.advantage=opo", "algorithm.advantage_options.eps=0.1"], "for advantage estimator 'opo'"),
        (["algorithm.advantage=grpo_batch_std", "rollout.group_size=1"], "group_size is 1"),
        # DAPO's overlong penalty makes a long wrong answer score < 0, which maxrl refuses: caught at load,
        # not at whichever step first produces such an answer.
        (["algorithm.advantage=maxrl", "reward.overlong_buffer=16"], "reward.overlong_buffer=16 subtracts"),
    ],
)
def test_config_refuses_bad_settings_in_one_line(overrides, needle):
    lines = config_error_lines(overrides)
    assert len(lines) == 2, lines
    assert needle in lines[1]


def test_maxrl_with_shaping_that_cannot_go_negative_is_accepted():
    # The penalty switched off either way leaves every reward in [0, 1]: nothing to refuse.
    for off in ("reward.overlong_penalty_factor=0", "reward.overlong_buffer=0"):
        config = load_config(None, ["algorithm.advantage=maxrl", "reward.overlong_buffer=16", off])
        assert config.algorithm.advantage == "maxrl"
    # dapo's preset turns the penalty on: maxrl on top of it is refused with the fix in the message.
    with pytest.raises(ConfigError, match=r"Set reward\.overlong_buffer=0"):
        load_config("dapo", ["algorithm.advantage=maxrl"])
