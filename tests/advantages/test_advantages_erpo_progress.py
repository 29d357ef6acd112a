"""ERPO's implicit progress term: what it receives, when it is exactly 0, and the config's answer to that."""

from __future__ import annotations

import pytest
import torch

from tepo.advantages import compute_advantages
from tepo.config import ConfigError, config_warnings, load_config, validate


def _inputs():
    """One group, G = 2, two valid tokens each; K = 1 bucket, gate relu at 0, lam 0.5, base dr_grpo.

    R = (1, 0) -> A = (0.5, -0.5), sgn = (+1, -1).
    Entropy (1, 3 | 1, 3): mean 2, population std 1 -> z = (-1, 1 | -1, 1) -> relu Hn = (0, 1 | 0, 1).
    """
    r = torch.tensor([1.0, 0.0])
    kw = dict(
        entropy=torch.tensor([[1.0, 3.0], [1.0, 3.0]]),
        mask=torch.ones(2, 2),
        num_buckets=1,
        lam=0.5,
        eps=0.0,
        base="dr_grpo",
    )
    return r, kw


BASE_ONLY = [[0.5, 0.5], [-0.5, -0.5]]


def test_progress_is_zero_when_logp_equals_ref_logp():
    # d = logp - ref = 0 everywhere -> every bucket mean is 0 -> no spread -> Sn = 0 -> A[i,t] = A_i.
    r, kw = _inputs()
    logp = torch.tensor([[-0.7, -1.9], [-0.2, -3.0]])
    adv = compute_advantages("erpo", r, 2, logp=logp, ref_logp=logp.clone(), **kw)
    assert torch.equal(adv, torch.tensor(BASE_ONLY))


def test_progress_is_nonzero_when_logp_differs_from_ref_logp():
    # d = (0.1, 0.3 | -0.1, -0.3): bucket means 0.2 and -0.2, population z across the pair -> Sn = (+1 | -1).
    # Row 0: 0.5 + 0.5 * (0, 1) * (+1) * (+1) = (0.5, 1.0); row 1: -0.5 + 0.5 * (0, 1) * (-1) * (-1) = (-0.5, 0.0).
    r, kw = _inputs()
    ref = torch.tensor([[-0.7, -1.9], [-0.2, -3.0]])
    logp = ref + torch.tensor([[0.1, 0.3], [-0.1, -0.3]])
    adv = compute_advantages("erpo", r, 2, logp=logp, ref_logp=ref, **kw)
    assert torch.allclose(adv, torch.tensor([[0.5, 1.0], [-0.5, 0.0]]), atol=1e-6)
    # Only the ordering of the bucket means across the group matters, not their size: a 1e-4 shift does the same.
    adv_small = compute_advantages("erpo", r, 2, logp=ref + (logp - ref) * 1e-3, ref_logp=ref, **kw)
    assert torch.allclose(adv_small, adv, atol=1e-6)


def test_trainer_style_call_with_old_baseline_is_inert():
    # What the built-in trainer hands over: advantages before the update, so logp and old_logp are one tensor.
    # progress_baseline="old" then measures logp - logp = 0 and ERPO returns its base, whatever the policy did.
    r, kw = _inputs()
    old = torch.tensor([[-0.7, -1.9], [-0.2, -3.0]])
    ref = old - torch.tensor([[0.1, 0.3], [-0.1, -0.3]])
    everything = dict(logp=old, old_logp=old, ref_logp=ref)
    inert = compute_advantages("erpo", r, 2, progress_baseline="old", **everything, **kw)
    assert torch.equal(inert, torch.tensor(BASE_ONLY))
    informative = compute_advantages("erpo", r, 2, **everything, **kw)  # default "ref"
    assert torch.allclose(informative, torch.tensor([[0.5, 1.0], [-0.5, 0.0]]), atol=1e-6)


def test_config_refuses_the_old_baseline_and_says_why():
    with pytest.raises(ConfigError) as err:
        load_config("erpo", ["algorithm.advantage_options={progress_baseline: old}"])
    message = str(err.value)
    assert "algorithm.advantage_options: 'erpo' with these options compares logp with old_logp" in message
    assert "advantages from the pre-update policy" in message
    assert "exactly 0 at every step" in message
    assert "Drop progress_baseline='old': with the defaults 'erpo' does not read old_logp" in message
    # One message, one line, for this one problem.
    assert sum("old_logp" in line for line in message.splitlines()) == 1


def test_ref_baseline_is_valid_with_a_one_line_note():
    config = load_config("erpo")
    assert validate(config) == []
    notes = config_warnings(config)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0].startswith("algorithm.advantage='erpo' measures the policy against the reference model")
    assert "exactly 0 on step 1" in notes[0]
    assert config_warnings(load_config("default", ["algorithm.advantage=grpo"])) == []
    assert config_warnings(load_config("default", ["algorithm.advantage=entropy_adv"])) == []
