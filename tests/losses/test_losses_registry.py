"""Registry behaviour: errors that list the valid choices, user-registered losses, input checks, describe()."""

from __future__ import annotations

import pytest
import torch

from tepo.losses import (
    POLICY_LOSSES,
    LossInputs,
    compute_policy_loss,
    describe,
    describe_table,
    list_policy_losses,
    register_policy_loss,
)

BUILTINS = [
    "grpo", "dapo", "dr_grpo", "cispo", "prefix_is", "tepo",
    "gspo", "gmpo", "reinforce_is", "clip_cov", "kl_cov", "cov_gauss",
]  # fmt: skip


def _inputs():
    return {
        "logp": torch.tensor([[-1.0, -2.0], [-0.5, float("nan")]], requires_grad=True),
        "old_logp": torch.tensor([[-1.1, -1.9], [-0.5, 0.0]]),
        "advantages": torch.tensor([1.0, -1.0]),
        "mask": torch.tensor([[1, 1], [1, 0]]),
    }


def test_builtins_are_registered_with_table_defaults():
    assert set(BUILTINS) <= set(list_policy_losses())
    expected = {
        "grpo": ("seq-mean-token-mean", {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None}),
        "dapo": ("token-mean", {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": None}),
        "dr_grpo": ("seq-mean-token-sum-norm", {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": None}),
        "tepo": ("token-mean", {"eps_low": 0.2, "eps_high": 0.2}),
        "gspo": ("seq-mean-token-mean", {"eps_low": 3e-4, "eps_high": 4e-4}),
        "gmpo": ("seq-mean-token-mean", {"eps_low": 0.4, "eps_high": 0.4}),
        "cispo": ("token-mean", {"eps_high": 0.28, "eps_low": None, "cap": None}),
        "reinforce_is": ("token-mean", {}),
        "prefix_is": ("token-mean", {"eps_low": 0.2, "eps_high": 0.2}),
    }
    for name, (agg, defaults) in expected.items():
        assert POLICY_LOSSES[name].default_agg == agg, name
        assert dict(POLICY_LOSSES[name].defaults) == defaults, name
    assert POLICY_LOSSES["clip_cov"].defaults["clip_cov_ratio"] == 2e-4
    assert (
        POLICY_LOSSES["clip_cov"].defaults["clip_cov_lb"],
        POLICY_LOSSES["clip_cov"].defaults["clip_cov_ub"],
    ) == (1.0, 5.0)
    assert POLICY_LOSSES["kl_cov"].defaults["kl_cov_ratio"] == 2e-4
    assert POLICY_LOSSES["kl_cov"].defaults["kl_cov_coef"] == 1.0
    for name in BUILTINS:
        assert POLICY_LOSSES[name].paper and POLICY_LOSSES[name].fn.__doc__, name


def test_unknown_loss_lists_registered_names():
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'") as info:
        compute_policy_loss("ppo", **_inputs())
    for name in BUILTINS:
        assert name in str(info.value)


def test_unknown_option_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown option") as info:
        compute_policy_loss("tepo", **_inputs(), clip_ratio=0.2)
    message = str(info.value)
    for option in (
        "eps_low",
        "eps_high",
        "eps",
        "agg",
        "entropy_coef",
        "kl_coef",
        "kl_estimator",
        "tepo_kl_mask_coef",
    ):
        assert option in message
    with pytest.raises(ValueError, match="unknown option"):
        compute_policy_loss("cispo", **_inputs(), eps=0.2)  # cispo has no lower clip, so no symmetric alias


def test_eps_alias_and_conflicts():
    a, _ = compute_policy_loss("dapo", **_inputs(), eps=0.05)
    b, _ = compute_policy_loss("dapo", **_inputs(), eps_low=0.05, eps_high=0.05)
    assert a.item() == b.item()
    with pytest.raises(ValueError, match="either eps or eps_low"):
        compute_policy_loss("dapo", **_inputs(), eps=0.1, eps_low=0.1)
    with pytest.raises(ValueError, match="finite number"):
        compute_policy_loss("dapo", **_inputs(), eps_high="0.28")
    with pytest.raises(ValueError, match="eps_low must be >= 0"):
        compute_policy_loss("dapo", **_inputs(), eps_low=-0.1)


def test_bad_agg_lists_modes():
    with pytest.raises(ValueError, match="seq-mean-token-sum-norm"):
        compute_policy_loss("grpo", **_inputs(), agg="sum")


def test_agg_override_changes_aggregation():
    default, _ = compute_policy_loss("grpo", **_inputs())
    token, _ = compute_policy_loss("grpo", **_inputs(), agg="token-mean")
    dapo_sym, _ = compute_policy_loss("dapo", **_inputs(), eps_high=0.2)
    assert token.item() == pytest.approx(dapo_sym.item())
    assert default.item() != pytest.approx(token.item())


def test_covariance_option_checks():
    with pytest.raises(ValueError, match=r"clip_cov_ratio must be in \(0, 1\]"):
        compute_policy_loss("clip_cov", **_inputs(), clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match="seed or generator"):
        compute_policy_loss("clip_cov", **_inputs(), seed=1, generator=torch.Generator())
    with pytest.raises(ValueError, match="clip_cov_lb"):
        compute_policy_loss("clip_cov", **_inputs(), clip_cov_lb=3.0, clip_cov_ub=2.0)
    with pytest.raises(ValueError, match="CovStats"):
        compute_policy_loss("cov_gauss", **_inputs(), cov_stats=(0.0, 0.0, 1.0))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"old_logp": torch.zeros(2, 3)}, "old_logp must have the shape of logp"),
        ({"mask": torch.tensor([[1, 2], [1, 0]])}, "mask must hold only 0 and 1"),
        ({"advantages": torch.zeros(3)}, r"advantages must have shape \[N\]"),
        ({"logp": torch.zeros(4)}, r"logp must be a \[N, T\] tensor"),
        ({"num_tokens": 0}, "num_tokens must be a positive"),
        ({"num_seqs": -2}, "num_seqs must be a positive"),
    ],
)
def test_bad_inputs_raise_one_clear_error(change, message):
    with pytest.raises(ValueError, match=message):
        compute_policy_loss("tepo", **{**_inputs(), **change})


def test_user_registered_loss_works_by_name(scratch_registry):
    @register_policy_loss("scaled_pg", default_agg="seq-mean-token-sum", paper="ours")
    def scaled_pg(inputs: LossInputs, *, scale: float = 2.0):
        """Scaled policy gradient: l = -scale * A * logp."""
        return -scale * inputs.advantages * inputs.logp, {"scale_seen": scale}

    assert "scaled_pg" in list_policy_losses()
    inputs = _inputs()
    loss, metrics = compute_policy_loss("scaled_pg", **inputs, scale=3.0)
    # seq-mean-token-sum over N=2: (-3*1*(-1 - 2) + -3*(-1)*(-0.5)) / 2
    assert loss.item() == pytest.approx((9.0 - 1.5) / 2)
    assert metrics["scale_seen"] == 3.0
    loss.backward()
    torch.testing.assert_close(inputs["logp"].grad, torch.tensor([[-1.5, -1.5], [1.5, 0.0]]))
    with pytest.raises(ValueError, match="scale"):
        compute_policy_loss("scaled_pg", **_inputs(), temperature=1.0)
    row = next(r for r in describe() if r["name"] == "scaled_pg")
    assert row == {
        "name": "scaled_pg",
        "default_agg": "seq-mean-token-sum",
        "defaults": {"scale": 2.0},
        "paper": "ours",
        "summary": "Scaled policy gradient: l = -scale * A * logp.",
    }


def test_registration_is_validated(scratch_registry):
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("tepo")(lambda inputs: None)
    with pytest.raises(TypeError, match="keyword-only"):

        @register_policy_loss("positional_option")
        def bad(inputs, scale=1.0):
            return inputs.logp, {}

    with pytest.raises(ValueError, match="unknown aggregation mode"):
        register_policy_loss("x", default_agg="mean")
    with pytest.raises(ValueError, match="requires"):
        register_policy_loss("x", requires=("values",))


def test_required_tensor_is_checked(scratch_registry):
    @register_policy_loss("needs_entropy", requires=("entropy",))
    def needs_entropy(inputs):
        return -inputs.entropy, {}

    with pytest.raises(ValueError, match="policy loss 'needs_entropy' needs entropy"):
        compute_policy_loss("needs_entropy", **_inputs())


def test_wrong_shaped_user_loss_output_is_reported(scratch_registry):
    @register_policy_loss("scalar_out")
    def scalar_out(inputs):
        return inputs.logp.sum(), {}

    with pytest.raises(ValueError, match="per-token loss of shape"):
        compute_policy_loss("scalar_out", **_inputs())


def test_describe_table_lists_every_loss():
    table = describe_table()
    lines = table.splitlines()
    assert lines[0].split() == ["name", "default", "agg", "defaults", "paper"]
    for name in BUILTINS:
        assert any(line.startswith(name + " ") for line in lines), name
    assert "eps_low=0.2, eps_high=0.28" in table
    assert "2510.09369" in table


def test_metrics_are_python_floats():
    _, metrics = compute_policy_loss("tepo", **_inputs())
    for key in ("clip_frac_low", "clip_frac_high", "seq_clip_frac_low", "seq_clip_frac_high", "approx_kl",
                "ratio_mean", "ratio_max", "policy_loss", "loss"):  # fmt: skip
        assert type(metrics[key]) is float, key


def test_half_precision_inputs_are_computed_in_float32():
    inputs = {
        k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v) for k, v in _inputs().items()
    }
    inputs["logp"].requires_grad_(True)
    loss, _ = compute_policy_loss("tepo", **inputs)
    assert loss.dtype == torch.float32
    loss.backward()
    assert inputs["logp"].grad.dtype == torch.bfloat16
