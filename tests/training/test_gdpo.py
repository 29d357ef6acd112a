"""GDPO (multi-reward, 2601.05242): the estimator's values by hand, TRL's normalize_then_sum formula, the named
reward functions of ``reward.functions``, their path through a step's collection, and config validation.

Parity with verl 0.9.1's real ``compute_gdpo_outcome_advantage`` is in tests/integrations/test_integration_verl_gdpo.py
(slow, .venv-verl).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from scripted_collect import ScriptedRollout, collect_scripted, problem_stream
from tepo.advantages import compute_advantages
from tepo.config import ConfigError, load_config
from tepo.rewards import RewardPool, format_reward, parse_reward_functions, reward_columns

F64 = torch.float64


def t(*values):
    return torch.tensor(values, dtype=F64)


def gdpo(components, weights, group_size, mask=None, **options):
    components = torch.as_tensor(components, dtype=F64)
    n = components.shape[0]
    mask = torch.ones(n, 1) if mask is None else mask
    weights = torch.as_tensor(weights, dtype=F64)
    total = components @ weights
    return compute_advantages(
        "gdpo", total, group_size, mask=mask, reward_components=components, reward_weights=weights, **options
    )


def whiten(values, counts=None):
    """verl's masked_whiten of per-response values repeated ``counts`` times (one token each by default):
    mean = sum / (n + 1e-8), var = sum((x - mean)^2) / (n + 1e-8) * n / (n - 1), (x - mean) / sqrt(var + 1e-8)."""
    tokens = values if counts is None else values.repeat_interleave(counts)
    n = tokens.numel()
    mean = tokens.sum() / (n + 1e-8)
    var = ((tokens - mean) ** 2).sum() / (n + 1e-8) * (n / (n - 1))
    return (values - mean) / torch.sqrt(var + 1e-8)


# --------------------------------------------------------------------------------------------------------------
# The estimator, by hand
# --------------------------------------------------------------------------------------------------------------


def test_docstring_example():
    # r1 = (1, 0): A1 = (+-0.5 / (0.7071 + 1e-6)); r2 = (1, 1): all equal, 0. S = A1; whitening over 2 tokens:
    # mean 0, unbiased var = 2 * a^2 (times 2 / (2 + 1e-8), verl's count guard) = 1 - O(1e-6).
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    var = 2 * a * a * 2 / (2 + 1e-8)
    expected = t(a, -a) / math.sqrt(var + 1e-8)
    torch.testing.assert_close(gdpo([[1.0, 1.0], [0.0, 1.0]], [1.0, 1.0], 2), expected, rtol=1e-12, atol=0)
    assert abs(expected[0] - 0.7071) < 1e-4


def test_each_reward_is_normalised_in_its_group_before_the_weighted_sum():
    # Two groups of 2, two rewards with different scales. Per group, a non-equal pair (x, y) normalises to
    # (+-1/sqrt2) * sign(x - y) / (1 + eps*sqrt2/|x - y|): the scale of the reward is gone.
    comps = [[10.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]]
    w = [1.0, 2.0]
    eps = 1e-6

    def unit(d):
        return (abs(d) / 2) / (abs(d) / math.sqrt(2) + eps) * (1 if d > 0 else -1)

    s = [unit(10) + 2 * unit(-1), -unit(10) + 2 * unit(1), 0 + 2 * unit(1), 0 + 2 * unit(-1)]
    s = torch.tensor(s, dtype=F64)
    expected = whiten(s)  # lengths 1: one token per response
    got = gdpo(comps, w, 2)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    # GRPO on the weighted sum (10, 2, 3, 1) would rank row 0 first by the large reward's scale; GDPO sees
    # row 0 better on reward 1 and worse on reward 2 (weight 2): -1/sqrt2 overall.
    assert got[0] < 0 < got[1]


def test_token_whitening_weights_responses_by_length_and_sequence_mode_does_not():
    comps = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    mask = torch.zeros(4, 3)
    for i, length in enumerate((3, 1, 2, 1)):
        mask[i, :length] = 1
    s = gdpo(comps, [1.0, 0.25], 2, batch_norm="none")
    # Token mode: every valid token a sample (row 0 three times).
    expected = whiten(s, mask.sum(1).long())
    torch.testing.assert_close(gdpo(comps, [1.0, 0.25], 2, mask=mask), expected, rtol=1e-12, atol=1e-12)
    seq = gdpo(comps, [1.0, 0.25], 2, mask=mask, batch_norm="sequence")
    torch.testing.assert_close(seq, (s - s.mean()) / (s.std() + 1e-6), rtol=1e-12, atol=1e-12)
    assert (gdpo(comps, [1.0, 0.25], 2, mask=mask) - seq).abs().max() > 1e-2  # the two modes do differ here


def test_trl_normalize_then_sum_formula():
    # TRL 1.16 GRPOTrainer, multi_objective_aggregation="normalize_then_sum" (inline in
    # _generate_and_score_completions): reward_k = (r - mean_g) / (std_g + 1e-4); rewards = sum_k w_k reward_k;
    # advantages = (rewards - mean) / (std + 1e-4), std unbiased (nanstd), over the batch's responses.
    gen = torch.Generator().manual_seed(0)
    comps = torch.rand(12, 3, generator=gen, dtype=F64).round(decimals=1)
    w = t(1.0, 0.5, 2.0)
    grouped = comps.view(-1, 4, 3)
    reward_k = (grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)
    rewards = (reward_k.view(-1, 3) * w).sum(1)
    trl = (rewards - rewards.mean()) / (rewards.std() + 1e-4)
    ours = gdpo(comps, w, 4, eps=1e-4, batch_norm="sequence")
    torch.testing.assert_close(ours, trl, rtol=1e-12, atol=1e-12)


def test_norm_by_std_false_is_centring_only_and_equals_grpo_without_std_on_the_sum():
    comps = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 1.0], [0.0, 0.25]], dtype=F64)
    w = t(1.0, 3.0)
    total = comps @ w
    centred = (total.view(-1, 2) - total.view(-1, 2).mean(1, keepdim=True)).flatten()
    torch.testing.assert_close(
        gdpo(comps, w, 2, norm_by_std=False, batch_norm="none"), centred, rtol=0, atol=1e-15
    )


def test_all_equal_column_contributes_exactly_zero_and_one_column_is_grpo_then_whitening():
    comps = torch.tensor([[0.1, 1.0], [0.1, 0.0], [0.1, 1.0], [0.1, 1.0]], dtype=F64)
    # Column 0 is all equal (0.1's float mean residue would be amplified by 1/eps without the exact-zero rule).
    torch.testing.assert_close(
        gdpo(comps, [5.0, 1.0], 2, batch_norm="none"), gdpo(comps[:, 1:], [1.0], 2, batch_norm="none")
    )
    grpo = compute_advantages("grpo", comps[:, 1], 2).to(F64)
    none = gdpo(comps[:, 1:], [1.0], 2, batch_norm="none")
    torch.testing.assert_close(none, grpo, rtol=1e-6, atol=1e-6)  # grpo returns float32


def test_group_order_does_not_matter():
    gen = torch.Generator().manual_seed(1)
    comps = torch.randint(0, 3, (12, 2), generator=gen).to(F64)
    mask = (torch.arange(5) < torch.randint(1, 6, (12, 1), generator=gen)).float()
    perm = torch.tensor([2, 0, 1]).repeat_interleave(4) * 4 + torch.arange(4).repeat(3)
    a = gdpo(comps, [1.0, 0.5], 4, mask=mask)
    b = gdpo(comps[perm], [1.0, 0.5], 4, mask=mask[perm])
    torch.testing.assert_close(a[perm], b, rtol=1e-12, atol=1e-12)


def test_bad_inputs_raise_one_clear_error():
    r = t(1.0, 0.0)
    m = torch.ones(2, 1)
    with pytest.raises(ValueError, match=r"gdpo' needs reward_components=\[N, K\], reward_weights=\[K\]"):
        compute_advantages("gdpo", r, 2, mask=m)
    with pytest.raises(ValueError, match=r"reward_weights must be a Tensor \[K=2\]"):
        compute_advantages("gdpo", r, 2, mask=m, reward_components=torch.ones(2, 2), reward_weights=t(1.0))
    with pytest.raises(ValueError, match=r"batch_norm must be one of"):
        gdpo([[1.0, 0.0], [0.0, 1.0]], [1.0, 1.0], 2, batch_norm="batch")


# --------------------------------------------------------------------------------------------------------------
# Reward functions and config
# --------------------------------------------------------------------------------------------------------------


def test_format_reward():
    assert format_reward(r"so \boxed{42}") == 1.0
    assert format_reward(r"\boxed{wrong} but boxed") == 1.0  # format, not correctness
    assert format_reward("The answer is 42.") == 0.0
    assert format_reward(r"\boxed{}") == 0.0  # empty
    assert format_reward(r"\boxed{4") == 0.0  # cut off by the length limit
    assert format_reward(r"\boxed{12}<|im_end|>" + "\n" * 50_000) == 1.0  # trailer dropped first
    hostile = "{" * 200_000 + r"\boxed{" * 50_000
    start = time.perf_counter()
    assert format_reward(hostile) == 0.0
    assert time.perf_counter() - start < 2.0  # linear scan of the last max_chars characters


def test_reward_columns_and_parsing():
    names = ["correctness", "format"]
    cols = reward_columns(names, [r"\boxed{3}", "3", r"\boxed{4}"], [1.0, 1.0, 0.0])
    assert cols == [[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]
    parsed, errors = parse_reward_functions(["correctness", {"name": "format", "weight": 0.5}])
    assert parsed == [("correctness", 1.0), ("format", 0.5)] and errors == []
    _, errors = parse_reward_functions([{"name": "format", "weight": "x"}, {"name": "format"}, {"nam": 1}])
    assert (
        len(errors) == 2
        and "weight must be a finite number" in errors[0]
        and "expected a mapping" in errors[1]
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algorithm.advantage=gdpo"],
            r"algorithm.advantage='gdpo' normalises each reward of reward.functions on its own and needs at "
            r"least two, got 1 \(correctness\)",
        ),
        (
            [
                "algorithm.advantage=gdpo",
                "reward.functions=[correctness, format]",
                "reward.overlong_buffer=8",
            ],
            r"the overlong penalty \(reward.overlong_buffer=8\) is not one of them",
        ),
        (["reward.functions=[{name: length}]"], r"reward.functions\[0\]: unknown reward function 'length'"),
        (["reward.functions=[correctness, correctness]"], r"'correctness' is listed twice"),
    ],
)
def test_config_refuses_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(None, overrides)
    assert str(info.value).count("\n  - ") == 1


def test_config_accepts_gdpo_with_two_functions_and_default_is_correctness():
    c = load_config(None, ["algorithm.advantage=gdpo", "reward.functions=[{name: correctness}, format]"])
    assert parse_reward_functions(c.reward.functions)[0] == [("correctness", 1.0), ("format", 1.0)]
    assert parse_reward_functions(load_config(None, []).reward.functions)[0] == [("correctness", 1.0)]


# --------------------------------------------------------------------------------------------------------------
# A step's collection: one column per function, the weighted total, a metric per function
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=1, timeout_s=10.0) as p:
        yield p


def test_collect_scores_each_function_and_sums_them_with_weights(pool):
    # Gold 3. Round 0: group 0 (right boxed, wrong bare) kept, group 1 (both wrong) dropped by correctness though
    # its format rewards differ; round 1: group 0 (right bare, wrong boxed) kept, then the batch is full (2 groups).
    rounds = [[r"\boxed{3}", "4", r"\boxed{4}", "4"], ["3", r"\boxed{4}", r"\boxed{3}", r"\boxed{3}"]]
    got = collect_scripted(
        ScriptedRollout(rounds),
        problem_stream(4),
        pool,
        dynamic_sampling=True,
        max_resample_rounds=1,
        reward_functions=[("correctness", 1.0), ("format", 0.5)],
    )
    assert got.batch.texts == [r"\boxed{3}", "4", "3", r"\boxed{4}"]
    assert got.reward_components.tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]]
    assert got.rewards.tolist() == [1.5, 0.0, 1.0, 0.5]  # 1 * correctness + 0.5 * format
    m = got.metrics  # first round only, like reward_mean
    assert (m["reward/correctness_mean"], m["reward/format_mean"], m["reward/mean"]) == (0.25, 0.5, 0.25)


def test_default_functions_leave_the_rewards_as_correctness(pool):
    got = collect_scripted(ScriptedRollout([[r"\boxed{3}", "4", "3", "x"]]), problem_stream(2), pool)
    assert got.rewards.tolist() == [1.0, 0.0, 1.0, 0.0] and got.reward_components.shape == (4, 1)
    assert got.metrics["reward/correctness_mean"] == 0.5
