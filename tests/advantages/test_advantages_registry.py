"""The advantage registry's declarations: what an estimator is handed, duplicate names, listing order, and the
config decisions (reference model, group size) taken from the declarations rather than from names."""

from __future__ import annotations

import pytest
import torch

from tepo.advantages import (
    ADVANTAGE_ESTIMATORS,
    TENSOR_INPUTS,
    compute_advantages,
    estimator_requires,
    list_advantage_estimators,
    register_advantage_estimator,
)
from tepo.config import AlgorithmConfig, ConfigError, load_config
from tepo.losses import list_policy_losses
from tepo.training.plan import needs_reference_model


def _all_inputs(n=4, t=3):
    """Distinct tensors per name, so a test can tell which one an estimator received."""
    return {
        "logp": torch.full((n, t), -1.0),
        "old_logp": torch.full((n, t), -2.0),
        "ref_logp": torch.full((n, t), -3.0),
        "entropy": torch.full((n, t), 4.0),
        "mask": torch.ones(n, t),
    }


def _spy(received):
    def spy(rewards, group_size, *, logp=None, old_logp=None, ref_logp=None, entropy=None, mask=None, k=0):
        received.append(
            {
                name: value
                for name, value in dict(
                    logp=logp, old_logp=old_logp, ref_logp=ref_logp, entropy=entropy, mask=mask
                ).items()
                if value is not None
            }
        )
        return torch.zeros_like(rewards)

    return spy


# ---------------------------------------------------------------------------------------------------------
# Built-in declarations
# ---------------------------------------------------------------------------------------------------------


def test_builtin_declarations():
    assert estimator_requires("grpo") == frozenset()
    assert estimator_requires("dr_grpo", {}) == frozenset()
    assert estimator_requires("rloo") == frozenset()
    assert estimator_requires("entropy_adv") == {"entropy", "mask"}
    assert estimator_requires("erpo") == {"entropy", "mask", "logp", "ref_logp"}
    assert estimator_requires("erpo", {"progress_baseline": "old"}) == {"entropy", "mask", "logp", "old_logp"}
    assert estimator_requires("ep_grpo") == {"entropy", "mask", "old_logp", "ref_logp"}
    assert all(
        ADVANTAGE_ESTIMATORS[n].group_relative
        for n in ("grpo", "dr_grpo", "rloo", "entropy_adv", "erpo", "ep_grpo")
    )
    assert [n for n, e in ADVANTAGE_ESTIMATORS.items() if e.token_level] == [
        "entropy_adv",
        "erpo",
        "ep_grpo",
        "reinforce_plus_plus",
        "optimal_token_baseline",
        "tir_optimal_token_baseline",
        "codapo",
    ]
    assert estimator_requires("codapo") == {"old_logp", "mask"}


def test_estimator_requires_rejects_bad_names_and_options():
    with pytest.raises(ValueError, match=r"unknown advantage estimator 'gae'"):
        estimator_requires("gae")
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['lambda'\] for advantage estimator 'erpo'"):
        estimator_requires("erpo", {"lambda": 0.1})
    with pytest.raises(ValueError, match=r"progress_baseline must be one of \('ref', 'old'\), got 'sampler'"):
        estimator_requires("erpo", {"progress_baseline": "sampler"})


# ---------------------------------------------------------------------------------------------------------
# What compute_advantages hands over
# ---------------------------------------------------------------------------------------------------------


def test_estimator_receives_exactly_what_it_declared(scratch_registry):
    received = []
    register_advantage_estimator("spy", requires=("entropy", "mask"))(_spy(received))
    given = _all_inputs()
    compute_advantages("spy", torch.tensor([1.0, 0.0, 1.0, 0.0]), 2, **given)
    assert set(received[0]) == {"entropy", "mask"}
    assert torch.equal(received[0]["entropy"], given["entropy"])
    assert torch.equal(received[0]["mask"], given["mask"])
    # An estimator that declares nothing gets nothing, whatever the trainer passes.
    register_advantage_estimator("spy_none")(_spy(received))
    compute_advantages("spy_none", torch.tensor([1.0, 0.0]), 2, **_all_inputs(2))
    assert received[1] == {}


def test_requirements_may_depend_on_options(scratch_registry):
    received = []
    register_advantage_estimator(
        "spy_opt", requires=lambda o: {"logp", "ref_logp" if o["k"] == 0 else "old_logp"}
    )(_spy(received))
    given = _all_inputs(2)
    compute_advantages("spy_opt", torch.tensor([1.0, 0.0]), 2, **given)
    compute_advantages("spy_opt", torch.tensor([1.0, 0.0]), 2, **given, k=1)
    assert set(received[0]) == {"logp", "ref_logp"}
    assert set(received[1]) == {"logp", "old_logp"}
    assert torch.equal(received[1]["old_logp"], given["old_logp"])
    assert estimator_requires("spy_opt") == {"logp", "ref_logp"}
    assert estimator_requires("spy_opt", {"k": 1}) == {"logp", "old_logp"}


def test_declared_input_that_is_none_is_a_clear_error(scratch_registry):
    register_advantage_estimator("spy_ref", requires=("logp", "ref_logp"))(_spy([]))
    given = _all_inputs(2)
    given["ref_logp"] = None
    with pytest.raises(
        ValueError, match=r"'spy_ref' needs ref_logp=\[N, T\] but it was not given.*reads logp, ref_logp"
    ):
        compute_advantages("spy_ref", torch.tensor([1.0, 0.0]), 2, **given)
    with pytest.raises(ValueError, match=r"needs logp=\[N, T\], ref_logp=\[N, T\] but they were not given"):
        compute_advantages("spy_ref", torch.tensor([1.0, 0.0]), 2)
    # The built-in erpo: the trainer had no reference model.
    given = _all_inputs(2)
    given["ref_logp"] = None
    with pytest.raises(ValueError, match=r"'erpo' needs ref_logp=\[N, T\]"):
        compute_advantages("erpo", torch.tensor([1.0, 0.0]), 2, **given)


def test_inputs_are_handed_over_detached(scratch_registry):
    received = []
    register_advantage_estimator("spy_grad", requires=("logp",))(_spy(received))
    logp = torch.zeros(2, 3, requires_grad=True)
    compute_advantages("spy_grad", torch.tensor([1.0, 0.0]), 2, logp=logp)
    assert not received[0]["logp"].requires_grad


def test_sequence_level_estimators_ignore_every_token_input():
    # The trainer passes all it has; a sequence-level estimator's result does not depend on it.
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    for name in ("grpo", "dr_grpo", "rloo"):
        assert torch.equal(compute_advantages(name, r, 4, **_all_inputs()), compute_advantages(name, r, 4))


def test_token_level_base_receives_what_it_declared(scratch_registry):
    # entropy_adv's declaration includes its base's needs, and the base is handed them.
    received = []
    register_advantage_estimator("spy_base", requires=("ref_logp",))(_spy(received))
    assert estimator_requires("entropy_adv", {"base": "spy_base"}) == {"entropy", "mask", "ref_logp"}
    assert estimator_requires("erpo", {"base": "spy_base", "progress_baseline": "old"}) == {
        "entropy",
        "mask",
        "logp",
        "old_logp",
        "ref_logp",
    }
    given = _all_inputs(2)
    compute_advantages("entropy_adv", torch.tensor([1.0, 0.0]), 2, base="spy_base", **given)
    assert set(received[0]) == {"ref_logp"}
    assert torch.equal(received[0]["ref_logp"], given["ref_logp"])


def test_bad_declarations_fail_at_registration(scratch_registry):
    with pytest.raises(ValueError, match=r"requires \['ref'\]: expected names among logp, old_logp"):
        register_advantage_estimator("bad_name", requires=("ref",))(_spy([]))
    with pytest.raises(ValueError, match=r"collection of names, not a string"):
        register_advantage_estimator("bad_str", requires="logp")

    def no_kw(rewards, group_size):
        return rewards

    with pytest.raises(TypeError, match=r"requires \['logp'\] but its function has no keyword parameter"):
        register_advantage_estimator("bad_fn", requires=("logp",))(no_kw)
    assert "bad_name" not in ADVANTAGE_ESTIMATORS and "bad_fn" not in ADVANTAGE_ESTIMATORS
    assert set(TENSOR_INPUTS) == {
        "logp",
        "old_logp",
        "ref_logp",
        "entropy",
        "mask",
        "sum_pi_squared",
        "reward_components",
        "reward_weights",
    }


# ---------------------------------------------------------------------------------------------------------
# Duplicates and order, as for policy losses
# ---------------------------------------------------------------------------------------------------------


def test_duplicate_name_raises_and_replacing_means_removing_first(scratch_registry):
    from tepo.losses import register_policy_loss

    with pytest.raises(ValueError, match=r"policy loss 'grpo' is already registered"):
        register_policy_loss("grpo")(lambda inputs: None)
    with pytest.raises(ValueError, match=r"advantage estimator 'grpo' is already registered"):
        register_advantage_estimator("grpo")(_spy([]))
    with pytest.raises(TypeError):
        register_advantage_estimator("grpo", overwrite=True)  # no such escape hatch, as for losses
    del ADVANTAGE_ESTIMATORS["grpo"]
    register_advantage_estimator("grpo")(lambda rewards, group_size: torch.ones_like(rewards))
    assert torch.equal(compute_advantages("grpo", torch.tensor([1.0, 0.0]), 2), torch.ones(2))


def test_listing_is_registration_order_like_losses(scratch_registry):
    assert list_policy_losses()[0] != sorted(list_policy_losses())[0]  # losses list in registration order too
    register_advantage_estimator("aaa_last")(_spy([]))
    assert list_advantage_estimators()[-1] == "aaa_last"
    assert list_advantage_estimators()[:5] == ["grpo", "dr_grpo", "rloo", "entropy_adv", "erpo"]


# ---------------------------------------------------------------------------------------------------------
# Config decisions from the declarations
# ---------------------------------------------------------------------------------------------------------


def test_needs_reference_model_follows_the_declarations(scratch_registry):
    assert not needs_reference_model(AlgorithmConfig(loss="grpo", advantage="grpo"))
    assert needs_reference_model(AlgorithmConfig(loss="grpo", advantage="erpo"))
    assert not needs_reference_model(
        AlgorithmConfig(loss="grpo", advantage="erpo", advantage_options={"progress_baseline": "old"})
    )
    # A user estimator under any name: the declaration decides.
    register_advantage_estimator("my_ref_baseline", requires=("ref_logp",))(_spy([]))
    assert needs_reference_model(AlgorithmConfig(loss="grpo", advantage="my_ref_baseline"))
    assert needs_reference_model(AlgorithmConfig(loss="grpo", advantage="grpo", kl_coef=0.01))


def test_group_size_one_is_refused_by_declaration_not_name(scratch_registry):
    register_advantage_estimator("my_group", group_relative=True)(_spy([]))
    register_advantage_estimator("my_absolute", group_relative=False)(_spy([]))
    with pytest.raises(ConfigError, match=r"rollout.group_size is 1 but algorithm.advantage='my_group'"):
        load_config("default", ["rollout.group_size=1", "algorithm.advantage=my_group"])
    config = load_config("default", ["rollout.group_size=1", "algorithm.advantage=my_absolute"])
    assert config.algorithm.advantage == "my_absolute"


def test_token_inputs_are_not_options():
    with pytest.raises(
        ConfigError, match=r"\['mask'\] are per-token inputs the trainer supplies, not options"
    ):
        load_config("default", ["algorithm.advantage_options={mask: 1}"])


def test_token_level_output_must_match_the_mask(scratch_registry):
    @register_advantage_estimator("short_tokens", requires=("mask",), token_level=True)
    def short_tokens(rewards, group_size, *, mask=None):
        return torch.zeros(rewards.shape[0], mask.shape[1] - 1)

    with pytest.raises(
        ValueError, match=r"'short_tokens' returned shape \(2, 2\), expected the mask's shape \(2, 3\)"
    ):
        compute_advantages("short_tokens", torch.tensor([1.0, 0.0]), 2, mask=torch.ones(2, 3))
