"""tepo's open-PR objectives against numbers computed by the upstream code at each pull request's head commit.

The fixtures (tests/fixtures/open_prs/, README there) hold float64 inputs and the upstream function's outputs:
loss, gradient with respect to logp, the upstream metrics under tepo's names, and per-token quantities (STARE's
omega, FIPO's influence weights and kept rows, CoDaPO's advantages). Tolerances are the spec's
(ALGORITHMS-open-prs.md): 1e-12 where the arithmetic is the same; verl's seq-mean-token-mean divides by
``L_i + 1e-8`` (1e-7 rel / 1e-9 abs); metrics computed in float32 or with verl's ``+1e-8`` denominators: 1e-7.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tepo.advantages import compute_advantages
from tepo.losses import compute_policy_loss, mini_batch_stats
from tepo.losses.future_kl import _fipo_parts
from tepo.losses.inputs import prepare_inputs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_prs"
LOSSES = ("up", "cppo", "topr", "stare", "fipo", "dapo_zv")


def _fixture(name):
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _cases(names):
    return [
        pytest.param(name, case, id=f"{name}-{i}")
        for name in names
        for i, case in enumerate(_fixture(name)["cases"])
    ]


def _tensors(case):
    raw = case["inputs"]
    out = {k: torch.tensor(v, dtype=torch.float64) for k, v in raw.items() if k != "mask"}
    out["mask"] = torch.tensor(raw["mask"])
    return out


def _tolerance(name, options):
    if options.get("agg") == "seq-mean-token-mean":  # verl's /(L_i + 1e-8)
        return {"rtol": 1e-7, "atol": 1e-9}
    return {"rtol": 1e-12, "atol": 1e-15}


def test_every_fixture_names_its_upstream_commit():
    for name in (*LOSSES, "codapo"):
        source = _fixture(name)["source"]
        assert len(source["commit"]) == 40 and source["pull_request"] > 0, name
        assert source["repo"] in ("verl-project/verl", "huggingface/trl"), name


@pytest.mark.parametrize(("name", "case"), _cases(LOSSES))
def test_loss_gradient_and_metrics_equal_the_upstream_code(name, case):
    inputs = _tensors(case)
    options = dict(case["tepo_options"])
    logp = inputs.pop("logp").requires_grad_(True)
    loss, metrics = compute_policy_loss(name, logp=logp, **inputs, **options)
    loss.backward()
    expected = case["expected"]
    tol = _tolerance(name, options)
    torch.testing.assert_close(loss.detach(), torch.tensor(expected["loss"], dtype=torch.float64), **tol)
    grad_tol = {"rtol": 1e-7, "atol": 1e-9} if tol["rtol"] > 1e-12 else {"rtol": 1e-12, "atol": 1e-14}
    torch.testing.assert_close(logp.grad, torch.tensor(expected["grad"], dtype=torch.float64), **grad_tol)
    for key, value in expected["metrics"].items():
        assert metrics[key] == pytest.approx(value, rel=1e-7, abs=1e-9), key


@pytest.mark.parametrize("case", _fixture("cppo")["cases"])
def test_cppo_ratio_value_form_has_verls_gradient(case):
    inputs = _tensors(case)
    options = {**case["tepo_options"], "value_form": "ratio"}
    logp = inputs.pop("logp").requires_grad_(True)
    compute_policy_loss("cppo", logp=logp, **inputs, **options)[0].backward()
    torch.testing.assert_close(
        logp.grad, torch.tensor(case["expected"]["grad"], dtype=torch.float64), rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("case", _fixture("stare")["cases"])
def test_stare_token_weights_equal_trls(case):
    inputs = _tensors(case)
    o = case["tepo_options"]
    stats = mini_batch_stats("stare", **inputs, **o)
    gate = stats.batch_entropy < o["H_tgt"]
    omega = torch.ones_like(inputs["logp"])
    if gate:
        omega = torch.where(stats.positive, o["W"], torch.where(stats.negative, o["M"], omega))
    torch.testing.assert_close(
        omega, torch.tensor(case["expected"]["omega"], dtype=torch.float64), rtol=0, atol=0
    )


@pytest.mark.parametrize("case", _fixture("fipo")["cases"])
def test_fipo_influence_weights_and_kept_rows_equal_trls(case):
    raw = _tensors(case)
    inputs = prepare_inputs(
        **{k: raw[k] for k in ("logp", "old_logp", "advantages", "mask")},
        ref_logp=None, entropy=None, old_entropy=None, num_tokens=None, num_seqs=None, max_len=None,
    )  # fmt: skip
    defaults = {"eps_low": 0.2, "eps_high": 0.28}
    _, _, weight, _, kept_rows = _fipo_parts(inputs, {**defaults, **case["tepo_options"]})
    expected = torch.tensor(case["expected"]["influence_weights"], dtype=torch.float64)
    valid = inputs.mask
    torch.testing.assert_close(weight[valid], expected[valid], rtol=1e-12, atol=1e-14)
    assert kept_rows.tolist() == case["expected"]["kept_rows"]


@pytest.mark.parametrize("case", _fixture("dapo_zv")["cases"])
def test_dapo_zv_token_count_equals_trls(case):
    inputs = _tensors(case)
    stats = mini_batch_stats("dapo_zv", **inputs)
    assert stats.count == case["expected"]["num_items_in_batch_zv"]


@pytest.mark.parametrize("case", _fixture("codapo")["cases"])
def test_codapo_advantages_equal_verls(case):
    raw = case["inputs"]
    adv = compute_advantages(
        "codapo",
        torch.tensor(raw["rewards"], dtype=torch.float64),
        raw["group_size"],
        old_logp=torch.tensor(raw["old_logp"], dtype=torch.float64),
        mask=torch.tensor(raw["mask"]),
        **case["tepo_options"],
    )
    torch.testing.assert_close(
        adv, torch.tensor(case["expected"]["advantages"], dtype=torch.float64), rtol=1e-12, atol=1e-15
    )


@pytest.mark.parametrize("case", _fixture("stare_authors")["cases"])
def test_stare_authors_reading_equals_their_code(case):
    """hp-luo/STARE's compute_policy_loss_stare (verl's dual clip c = 3, the controller's gate and step entropy,
    k = int(n p + 0.999999)) = stare(dual_clip=3.0, batch_entropy=H_bar, k_rounding="authors")."""
    inputs = _tensors(case)
    logp = inputs.pop("logp").requires_grad_(True)
    loss, metrics = compute_policy_loss("stare", logp=logp, **inputs, **case["tepo_options"])
    loss.backward()
    expected = case["expected"]
    torch.testing.assert_close(
        loss.detach(), torch.tensor(expected["loss"], dtype=torch.float64), rtol=1e-12, atol=1e-15
    )
    torch.testing.assert_close(
        logp.grad, torch.tensor(expected["grad"], dtype=torch.float64), rtol=1e-12, atol=1e-14
    )
    for key, value in expected["metrics"].items():
        assert metrics[key] == pytest.approx(value, rel=1e-12), key
