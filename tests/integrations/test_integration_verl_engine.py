"""verl 0.9.1's own actor worker and FSDP2 engine run tepo's losses exactly, on CPU, on 1 and 2 gloo ranks.

Opt-in (``-m slow``; about 9 minutes for both world sizes on the shared 2-core development machine, in
``.venv-verl``, built once by the session fixture of tests/integrations/conftest.py). verl has no CPU platform;
tests/verl_cpu_platform.py is one, loaded the way verl loads a platform plugin (``VERL_USE_EXTERNAL_MODULES``).

tests/verl_engine_check.py runs under ``torchrun --nproc_per_node W`` for W = 1 and W = 2: verl's
``ActorRolloutRefWorker(role="actor").init_model()`` from verl's packaged Hydra config (TrainingWorker, FSDP2
engine, SGD with lr 1, no weight decay, no clipping), the embedded SmolLM2-135M in float32, and for each case one
``update_actor`` (``train_mini_batch``: micro-batches of 2 rows, ``forward_backward_batch``, FSDP2's gradient
reduction over gloo, ``optimizer_step``) on a global batch of 8 responses of up to 16 tokens, rank r getting
chunk r as verl's dispatch splits it (unequal token counts: 42 and 29). Cases: ``tepo`` (token-mean), ``grpo``
(seq-mean-token-mean), ``dr_grpo`` (seq-mean-token-sum-norm, ``loss_scale_factor=24``), ``tepo.kl_cov`` (a
covariance loss), TEPO v2 (``tepo_kl_mask_coef`` through `tepo_ppo_loss`, H_old in ``old_entropys``), and
``grpo`` / ``tepo`` with verl's ``rollout_is_weights`` and a rejected row.

Asserted: on each world size the parameter update of four tensors equals ``-lr * grad`` of
``compute_policy_loss`` on the whole batch (for ``kl_cov``, which picks tokens within each call as verl's own
kl_cov does, summed over the same micro-batches with global counts), verl's reported loss equals ours, and the
2-rank update equals the 1-rank one. Dividing the global counts by ``dp_size`` is what makes the 2-rank update
right: without it the 2-rank updates are half of these (checked by hand on a broken copy, see
docs/integrations.md).
"""

from __future__ import annotations

import json

import pytest

from verl_runner import ROOT, run, verl_env

pytestmark = pytest.mark.slow

CASES = ("tepo", "grpo", "dr_grpo", "kl_cov", "tepo_v2", "grpo_is", "tepo_is")


def _run_world(verl_python, model_dir, out, world: int) -> dict:
    out.mkdir()
    env = verl_env(
        VERL_USE_EXTERNAL_MODULES="verl_cpu_platform",
        PYTHONPATH=str(ROOT / "tests"),
        OMP_NUM_THREADS="1",  # two ranks on a shared 2-core machine
    )
    torchrun = verl_python.parent / "torchrun"
    cmd = [torchrun, "--standalone", f"--nproc_per_node={world}", ROOT / "tests" / "verl_engine_check.py"]
    result = run([*cmd, model_dir, out], timeout=1800, env=env)
    assert result.returncode == 0, (
        f"verl engine check ({world} ranks) failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )
    line = next(x for x in reversed(result.stdout.splitlines()) if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


def _close(got, want, what: str) -> None:
    import torch

    # float32 forward/backward in a different order (nested vs padded layout, reduce-scatter vs one backward):
    # a relative error of a few 1e-5 of the tensor's scale; a wrong count is off by tens of percent.
    scale = float(want.abs().max())
    assert scale > 0, f"{what}: zero update"
    torch.testing.assert_close(got, want, rtol=0, atol=3e-4 * scale, msg=what)


def test_verl_fsdp2_engine_update_equals_compute_policy_loss(verl_python, embedded_model_dir, tmp_path):
    import torch

    reports = {w: _run_world(verl_python, embedded_model_dir, tmp_path / f"w{w}", w) for w in (1, 2)}
    updates = {w: torch.load(tmp_path / f"w{w}" / f"updates_w{w}.pt") for w in (1, 2)}
    for world, report in reports.items():
        assert report["world"] == world and set(report["cases"]) == set(CASES), report
        for label in CASES:
            case = report["cases"][label]
            # rank 0's micro-batches: 4 of 2 rows on 1 rank, 2 of 2 rows (its half) on 2 ranks
            assert case["micro_batches"] == [2] * (4 // world), (world, label, case)
            # verl's reported loss: its micro-batch losses summed, then averaged over ranks (gloo's AVG)
            assert case["verl_loss"] == pytest.approx(case["loss"], rel=1e-4, abs=1e-5), (world, label, case)
            assert any(k.startswith("actor/tepo/") for k in case["tepo_metrics"]), case
            for name, want in updates[world][label]["expected"].items():
                _close(updates[world][label]["update"][name], want, f"{world} ranks, {label}, {name}")
    for label in CASES:
        for name, one in updates[1][label]["update"].items():
            _close(updates[2][label]["update"][name], one, f"2 ranks vs 1 rank, {label}, {name}")
    cases = reports[1]["cases"]
    assert cases["grpo"]["clip_frac"] > 0, "no token was clipped: the clipped branch is untested"
    assert 0 < cases["tepo_v2"]["tepo_kl_mask_frac"] < 1, cases["tepo_v2"]
    for label in ("grpo_is", "tepo_is"):
        assert abs(cases[label]["loss"] - cases[label]["unweighted_loss"]) > 1e-4, f"{label}: weights inert"
        assert cases[label]["tokens"] < cases["grpo"]["tokens"], "the rejected row is still in the mask"


def test_verl_defaults_that_change_tepos_reading(verl_python):
    # verl's builtins of the same names with verl's defaults are other readings; with the documented settings
    # they equal ours (value and gradient). Synthetic tensors, about 30 s (importing verl).
    result = run([verl_python, ROOT / "tests" / "verl_defaults_check.py"], timeout=600, env=verl_env())
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found.pop("ratios_above_3_with_negative_adv") > 0  # the dual clip is reached
    assert found == {
        "vanilla_default_equals_dapo": False,  # dual clip, clip_ratio_c=3.0
        "vanilla_no_dual_clip_equals_dapo": True,  # clip_ratio_c=1e9
        "cispo_default_equals_ours": False,  # lower clip at 1 - clip_ratio_low = 0.8, upper 1.2
        "cispo_set_equals_ours": True,  # clip_ratio_low=1.0, clip_ratio_high=0.28
        "gspo_default_equals_ours": False,  # token-mean, clip 0.2
        "gspo_set_equals_ours": True,  # loss_agg_mode=seq-mean-token-mean, clip 3e-4 / 4e-4
        "our_grpo_under_verl_default_agg_equals_tepo_grpo": False,  # verl's token-mean wins
        "our_grpo_with_agg_set_equals_tepo_grpo": True,
    }, found
