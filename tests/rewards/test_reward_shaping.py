"""DAPO's overlong reward shaping (arXiv 2503.14476, Eq. 13 and overlong filtering) against closed forms, its
config keys and validation, and the presets that use it."""

from __future__ import annotations

import math
import subprocess
import sys
from fractions import Fraction

import pytest
import torch

from tepo.config import ConfigError, load_config
from tepo.losses.aggregation import aggregate
from tepo.rewards import mask_truncated, overlong_filter_mask, overlong_penalty


def eq13(length: int, max_len: int, buffer_len: int) -> Fraction:
    """The paper's piecewise R_length, in exact rationals."""
    if length <= max_len - buffer_len:
        return Fraction(0)
    if length <= max_len:
        return Fraction((max_len - buffer_len) - length, buffer_len)
    return Fraction(-1)


def verl(length: int, max_len: int, buffer_len: int, factor: float) -> float:
    """verl's DAPO reward manager: min(-exceed / buffer * factor, 0) with exceed = length - (max_len - buffer)."""
    exceed = length - (max_len - buffer_len)
    return min(-exceed / buffer_len * factor, 0)


def test_closed_form_at_every_boundary():
    # L_max 10, L_cache 4: no penalty up to 6 tokens, then -1/4 per token down to -1 at 10, and -1 beyond.
    lengths = torch.tensor([0, 1, 5, 6, 7, 8, 9, 10, 11, 1000])
    got = overlong_penalty(lengths, max_len=10, buffer_len=4)
    want = torch.tensor([0, 0, 0, 0, -0.25, -0.5, -0.75, -1, -1, -1])
    assert got.dtype == torch.float32
    assert torch.equal(got, want)


@pytest.mark.parametrize(("max_len", "buffer_len"), [(10, 4), (64, 13), (7, 1), (5, 5), (20480, 4096)])
def test_matches_the_paper_equation_for_every_length(max_len, buffer_len):
    lengths = torch.arange(0, 2 * max_len + 2)
    got = overlong_penalty(lengths, max_len=max_len, buffer_len=buffer_len).double()
    want = torch.tensor([float(eq13(n, max_len, buffer_len)) for n in lengths.tolist()], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-7)  # float32 result of an exact rational


@pytest.mark.parametrize("factor", [1.0, 0.5, 2.0])
def test_matches_verl_for_every_reachable_length(factor):
    # verl's responses never exceed L_max; there the two forms must agree, factor included.
    max_len, buffer_len = 32, 8
    lengths = torch.arange(0, max_len + 1, dtype=torch.float64)
    got = overlong_penalty(lengths, max_len=max_len, buffer_len=buffer_len, penalty_factor=factor)
    want = torch.tensor([verl(int(n), max_len, buffer_len, factor) for n in lengths], dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
    # Beyond L_max the paper's -1 (times the factor) holds, where verl's unclamped form would keep falling.
    beyond = overlong_penalty(
        torch.tensor([max_len + 8]), max_len=max_len, buffer_len=buffer_len, penalty_factor=factor
    )
    assert beyond.item() == -factor


def test_penalty_factor_scales_and_zero_turns_it_off():
    lengths = torch.tensor([6, 7, 8, 10, 12])
    base = overlong_penalty(lengths, max_len=10, buffer_len=4)
    assert torch.equal(overlong_penalty(lengths, max_len=10, buffer_len=4, penalty_factor=0.5), base * 0.5)
    assert torch.equal(overlong_penalty(lengths, max_len=10, buffer_len=0), torch.zeros(5))
    assert torch.equal(
        overlong_penalty(lengths, max_len=10, buffer_len=4, penalty_factor=0.0), torch.zeros(5)
    )


def test_buffer_equal_to_the_limit_penalises_from_the_first_token():
    got = overlong_penalty(torch.tensor([0, 1, 5, 10]), max_len=10, buffer_len=10)
    assert torch.equal(got, torch.tensor([0.0, -0.1, -0.5, -1.0]))


def test_fractional_lengths_shape_and_no_gradient():
    lengths = torch.tensor([[6.5, 9.0], [0.0, 12.0]], requires_grad=True)
    got = overlong_penalty(lengths, max_len=10, buffer_len=4)
    assert got.shape == (2, 2)
    assert torch.equal(got, torch.tensor([[-0.125, -0.75], [0.0, -1.0]]))
    assert not got.requires_grad  # a length is a count: no gradient flows into the policy through it
    assert overlong_penalty(torch.tensor([], dtype=torch.long), max_len=10, buffer_len=4).shape == (0,)


def test_shaped_rewards_are_correctness_plus_penalty():
    # The documented use: correctness (0/1) + penalty, before advantages. A correct answer at the limit nets 0.
    correct = torch.tensor([1.0, 1.0, 0.0, 1.0])
    lengths = torch.tensor([3, 8, 9, 10])
    shaped = correct + overlong_penalty(lengths, max_len=10, buffer_len=4)
    assert torch.equal(shaped, torch.tensor([1.0, 0.5, -0.75, 0.0]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_len": 0, "buffer_len": 0}, "max_len"),
        ({"max_len": 10, "buffer_len": -1}, "buffer_len"),
        ({"max_len": 10, "buffer_len": 11}, "buffer_len"),
        ({"max_len": 10, "buffer_len": 2.5}, "buffer_len"),
        ({"max_len": 10, "buffer_len": 4, "penalty_factor": -0.1}, "penalty_factor"),
        ({"max_len": 10, "buffer_len": 4, "penalty_factor": math.nan}, "penalty_factor"),
        ({"max_len": 10, "buffer_len": 4, "penalty_factor": math.inf}, "penalty_factor"),
        ({"max_len": 10, "buffer_len": 4, "penalty_factor": True}, "penalty_factor"),
        ({"max_len": True, "buffer_len": 0}, "max_len"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        overlong_penalty(torch.tensor([1]), **kwargs)


def test_numpy_integers_are_accepted():
    np = pytest.importorskip("numpy")
    got = overlong_penalty(
        torch.tensor([8]), max_len=np.int64(10), buffer_len=np.int32(4), penalty_factor=np.float32(2)
    )
    assert got.item() == -1.0


def test_bad_lengths_are_refused():
    with pytest.raises(ValueError, match=">= 0"):
        overlong_penalty(torch.tensor([3, -1]), max_len=10, buffer_len=4)
    with pytest.raises(TypeError, match="counts"):
        overlong_penalty(torch.tensor([True]), max_len=10, buffer_len=4)
    with pytest.raises(TypeError, match="tensor"):
        overlong_penalty([3, 4], max_len=10, buffer_len=4)


# ---------------------------------------------------------------- overlong filtering
def test_filter_mask_keeps_responses_that_ended():
    truncated = torch.tensor([False, True, False, True])
    assert torch.equal(overlong_filter_mask(truncated), torch.tensor([True, False, True, False]))
    with pytest.raises(TypeError, match="bool"):
        overlong_filter_mask(torch.tensor([0, 1]))


def test_mask_truncated_zeroes_whole_rows_and_keeps_dtype():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    got = mask_truncated(mask, torch.tensor([False, True, False]))
    assert torch.equal(got, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert got.dtype == mask.dtype
    long_mask = mask.long()
    assert mask_truncated(long_mask, torch.tensor([True, False, False])).dtype == torch.long
    with pytest.raises(ValueError, match=r"\[N, T\] and \[N\]"):
        mask_truncated(mask, torch.tensor([False, True]))


def test_filtered_rows_leave_the_token_mean_loss_value_and_gradient():
    # Token-mean over the kept tokens only: rows 0 and 2 have 2 + 1 tokens; row 1 (truncated) is gone from both the
    # sum and the count, and gets zero gradient.
    loss_mat = torch.tensor([[1.0, 2.0, 9.0], [4.0, 5.0, 6.0], [3.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    filtered = mask_truncated(mask, torch.tensor([False, True, False]))
    value = aggregate(loss_mat, filtered, "token-mean")
    assert value.item() == pytest.approx((1 + 2 + 3) / 3)
    value.backward()
    want_grad = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]) / 3
    assert torch.equal(loss_mat.grad, want_grad)


# ---------------------------------------------------------------- config
def test_defaults_are_off():
    r = load_config("default").reward
    assert (r.overlong_buffer, r.overlong_penalty_factor, r.overlong_filter) == (0, 1.0, False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("reward.overlong_buffer=-1", "reward.overlong_buffer: must be >= 0"),
        (
            "reward.overlong_buffer=64",
            r"reward.overlong_buffer \(64\) must be smaller than rollout.max_new_tokens",
        ),
        ("reward.overlong_buffer=100", "rollout.max_new_tokens \\(64\\)"),
        ("reward.overlong_buffer=2.5", "neither a whole number of tokens nor a share"),
        ("reward.overlong_buffer=0.999", r"\(0.999: 64 tokens\) must be smaller"),
        (
            "reward.overlong_penalty_factor=-0.5",
            "reward.overlong_penalty_factor: must be a finite number >= 0",
        ),
        ("reward.overlong_penalty_factor=.nan", "reward.overlong_penalty_factor"),
        ("reward.answer_format=raw", "reward.answer_format: expected one of boxed, boxed_or_last"),
        ("reward.overlong_filter=maybe", "reward.overlong_filter"),
    ],
)
def test_bad_reward_keys_are_named(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("default", [override])


def test_buffer_is_checked_against_an_overridden_limit():
    assert load_config("default", ["reward.overlong_buffer=63"]).reward.overlong_buffer == 63
    with pytest.raises(ConfigError, match=r"smaller than rollout\.max_new_tokens"):
        load_config("default", ["rollout.max_new_tokens=13", "reward.overlong_buffer=13"])
    ok = load_config("clip_higher", ["rollout.max_new_tokens=256", "reward.overlong_buffer=51"])
    assert ok.reward.overlong_buffer == 51
    # The preset's share follows the limit: 0.2 of 13 tokens is 3.
    assert load_config("clip_higher", ["rollout.max_new_tokens=13"]).reward.overlong_buffer == 0.2


@pytest.mark.parametrize("preset", ["clip_higher", "dapo"])
def test_dapo_presets_use_the_published_setting_scaled(preset):
    from tepo.rewards.shaping import overlong_buffer_tokens
    from tepo.training.parts import _overlong_shaping

    # DAPO/verl: buffer 4096 of a 20480-token limit (1/5), factor 1.0, no overlong filtering; as a share, so the
    # buffer follows the limit: 13 of 64 tokens, 26 of 128.
    for limit in (64, 128, 256):
        c = load_config(preset, [f"rollout.max_new_tokens={limit}"])
        assert c.reward.overlong_buffer == 0.2
        assert overlong_buffer_tokens(c.reward.overlong_buffer, limit) == round(limit * 4096 / 20480)
        assert _overlong_shaping(c).buffer_len == round(limit * 4096 / 20480)
    c = load_config(preset)
    assert (c.reward.overlong_penalty_factor, c.reward.overlong_filter) == (1.0, False)
    assert c.algorithm.loss == "dapo" and c.algorithm.dynamic_sampling


def test_importing_the_reward_pool_does_not_import_torch():
    # Verification-only users (math_equal, the pool) stay light; the shaping functions load torch on first use.
    code = "import sys, tepo.rewards; assert 'torch' not in sys.modules; tepo.rewards.overlong_penalty"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
