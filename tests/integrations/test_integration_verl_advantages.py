"""tepo's advantage estimators through verl 0.9.1's own advantage step (issue #44, verl half).

`CHECK_SCRIPT` runs in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py; slow,
like it). It builds the batch verl builds before its advantage step: a ``DataProto`` with ``responses``,
``attention_mask``, ``response_mask``, ``token_level_rewards`` (the outcome reward on each response's last token),
``old_log_probs`` and pi_old's entropies (verl's ``_compute_old_log_prob``: ``entropys``, or ``old_entropys`` as
`TepoRayPPOTrainer` keeps them), ``ref_log_prob``, and ``uid`` in ``non_tensor_batch``, float32 as verl casts
them, rows of a prompt NOT contiguous (``trainer.balance_batch`` reorders them), padding holding junk. It runs
verl's ``compute_advantage`` (legacy driver) and ``compute_advantage_for_multi_trajectories`` (v1 driver, with
the entropies handed over by `advantage_fields` as `TepoPPOTrainerSync` does) with ``adv_estimator=tepo.<name>``
and compares the ``advantages`` they write with `tepo.advantages.compute_advantages` on the same tensors laid out
as tepo lays them out (groups contiguous), for erpo, entropy_adv and ep_grpo, with default and non-default
options (given as verl's Hydra config gives them, ``algorithm.tepo_advantage``). Each comparison is checked to
have teeth: the token-level term is non-zero there (the result differs from the base ``grpo``). ``tepo.grpo``
equals verl's own ``grpo``. Then the refusals: an input verl did not compute (each message names the verl
setting), ``norm_adv_by_std_in_grpo=false``, ERPO's ``progress_baseline="old"`` (exactly 0 in verl), unequal
groups; and `advantage_config_errors` on verl's own composed ``ppo_trainer`` config.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

# Estimators checked through verl, with the options they are checked with ({} = defaults).
CASES = {
    "erpo": [{}, {"lam": 0.5, "gate": "none", "num_buckets": 2, "base_options": {"std": "population"}}],
    "entropy_adv": [{}, {"alpha": 0.05, "kappa": 3.0}],
    "ep_grpo": [{}, {"eta": 0.5, "num_buckets": 3, "gamma": 2.0}],
}

CHECK_SCRIPT = textwrap.dedent(
    r"""
    import sys
    from omegaconf import OmegaConf
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories
    from tepo.advantages import compute_advantages
    from tepo.integrations.verl_advantages import advantage_fields

    CASES = json.loads(sys.argv[1])
    F32 = torch.float32
    gen = torch.Generator().manual_seed(0)
    G, P, T = 4, 2, 7
    N = G * P
    lengths = [7, 3, 1, 5, 6, 2, 7, 4]  # tepo's layout: rows g*G .. g*G+G-1 are prompt g's
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25], dtype=F32)
    mask = lengths_mask(lengths, T)
    junk = torch.where(mask, 0.0, 1e4)  # padding holds junk: it must not reach a valid token
    old = (-torch.rand(N, T, generator=gen) * 3).to(F32) + junk
    ref = (old + 0.4 * torch.randn(N, T, generator=gen)).to(F32) + junk
    entropy = (torch.rand(N, T, generator=gen) * 4).to(F32) + junk

    # verl's batch: the same rows shuffled, as balance_batch leaves them; uid names each row's prompt.
    perm = torch.tensor([5, 0, 3, 7, 1, 6, 2, 4])
    uid = np.array([f"prompt-{int(r) // G}" for r in perm], dtype=object)
    token_rewards = torch.zeros(N, T, dtype=F32)
    token_rewards[torch.arange(N), mask.sum(-1) - 1] = rewards


    def verl_batch(entropy_field="entropys", with_ref=True, with_entropy=True):
        fields = {
            "responses": torch.randint(5, 100, (N, T), generator=gen)[perm] * mask[perm],
            "attention_mask": torch.cat([torch.ones(N, 3, dtype=torch.long), mask[perm].long()], dim=1),
            "response_mask": mask[perm].long(),
            "token_level_rewards": token_rewards[perm].clone(),
            "old_log_probs": old[perm].clone(),
        }
        if with_ref:
            fields["ref_log_prob"] = ref[perm].clone()
        if with_entropy:
            fields[entropy_field] = entropy[perm].clone()
        return DataProto.from_dict(fields, non_tensors={"uid": uid.copy()})


    def algorithm(name, **settings):
        return OmegaConf.create({"adv_estimator": f"tepo.{name}", "gamma": 1.0, "lam": 1.0,
                                 "norm_adv_by_std_in_grpo": True, **settings})


    def legacy(name, data, options=None, **settings):
        cfg = algorithm(name, **settings) if options is None else algorithm(name, tepo_advantage=options, **settings)
        out = compute_advantage(data, adv_estimator=f"tepo.{name}", num_repeat=G, config=cfg)
        return out.batch["advantages"], out.batch["returns"]


    def v1(name, data, options, fields):
        keys = [f"{uid[i]}_0_{i}" for i in range(N)]  # v1's row keys: {uid}_{session}_{index}
        with advantage_fields(fields):
            out = compute_advantage_for_multi_trajectories(
                data, batch_keys=keys, adv_estimator=f"tepo.{name}", num_repeat=G,
                config=algorithm(name, tepo_advantage=options))
        return out.batch["advantages"]


    def unshuffle(adv):
        out = torch.empty_like(adv)
        out[perm] = adv
        return out


    def exact(got, want):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        return float((got - want).abs().max())


    report = {}
    grpo = compute_advantages("grpo", rewards, G).unsqueeze(-1) * mask
    for name, option_sets in CASES.items():
        for options in option_sets:
            ours = compute_advantages(name, rewards, G, logp=old, old_logp=old, ref_logp=ref, entropy=entropy,
                                      mask=mask, **options)
            assert bool((ours[~mask] == 0).all())
            # teeth: the token-level term is non-zero here, so a lost or misaligned input would change the result
            report[f"{name} {options} token term"] = float((ours - grpo).abs().max())
            assert report[f"{name} {options} token term"] > 1e-4, report
            for field in ("entropys", "old_entropys"):
                adv, returns = legacy(name, verl_batch(field), options)
                report[f"{name} {options} legacy {field}"] = exact(unshuffle(adv), ours)
                assert returns is adv or torch.equal(returns, adv)
            data = verl_batch(with_entropy=False)
            adv = v1(name, data, options, {"entropy": entropy[perm].clone()})
            report[f"{name} {options} v1"] = exact(unshuffle(adv), ours)

    # tepo.grpo through verl equals verl's own grpo
    verl_grpo = compute_advantage(verl_batch(), adv_estimator="grpo", num_repeat=G,
                                  config=algorithm("grpo"))
    ours_grpo, _ = legacy("grpo", verl_batch())
    report["tepo.grpo vs verl grpo"] = close(ours_grpo.double(), verl_grpo.batch["advantages"].double(),
                                             rtol=1e-6, atol=1e-6)
    report["tepo.grpo vs tepo"] = exact(unshuffle(ours_grpo), grpo)

    # refusals, each naming what to set
    def refusal(call):
        try:
            call()
        except ValueError as err:
            return str(err)
        raise AssertionError("no ValueError")

    report["no entropy"] = refusal(lambda: legacy("erpo", verl_batch(with_entropy=False)))
    report["no ref"] = refusal(lambda: legacy("erpo", verl_batch(with_ref=False)))
    report["verl norm"] = refusal(lambda: legacy("erpo", verl_batch(), norm_adv_by_std_in_grpo=False))
    report["erpo old"] = refusal(lambda: legacy("erpo", verl_batch(), {"progress_baseline": "old"}))
    report["unknown option"] = refusal(lambda: legacy("erpo", verl_batch(), {"lamda": 0.2}))
    uneven = verl_batch().select_idxs(list(range(N - 1)))
    report["uneven groups"] = refusal(lambda: legacy("grpo", uneven))
    print(json.dumps(report))
    """
)


def test_verl_advantage_step_computes_tepo_estimators(verl_python, tmp_path):
    """verl's own advantage step with adv_estimator=tepo.<name> writes tepo's advantages, exactly."""
    import json

    report = run_verl_script(
        verl_python, tmp_path, SCRIPT_PRELUDE + CHECK_SCRIPT, json.dumps(CASES), name="advantages.py"
    )
    for name, option_sets in CASES.items():
        for options in option_sets:
            for path in ("legacy entropys", "legacy old_entropys", "v1"):
                assert report[f"{name} {options} {path}"] == 0.0
    assert "trainer.v1.trainer_mode=tepo_sync" in report["no entropy"]
    assert "tepo.integrations.verl_main" in report["no entropy"]
    assert "use_kl_loss=true" in report["no ref"] and "kl_loss_coef=0" in report["no ref"]
    assert "norm_adv_by_std_in_grpo" in report["verl norm"] and "tepo.dr_grpo" in report["verl norm"]
    assert "exactly 0" in report["erpo old"]
    assert "lamda" in report["unknown option"]
    assert "same number of responses" in report["uneven groups"]


CONFIG_SCRIPT = textwrap.dedent(
    r"""
    import json
    from pathlib import Path
    from hydra import compose, initialize_config_dir
    import verl
    from tepo.integrations.verl_workers import tepo_config_errors

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")

    def errors(*overrides):
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return tepo_config_errors(compose(config_name="ppo_trainer", overrides=list(overrides)))

    print(json.dumps({
        "erpo without reference": errors("algorithm.adv_estimator=tepo.erpo"),
        "erpo with reference": errors("algorithm.adv_estimator=tepo.erpo", "actor_rollout_ref.actor.use_kl_loss=true",
                                      "actor_rollout_ref.actor.kl_loss_coef=0", "+algorithm.tepo_advantage.lam=0.3",
                                      "+algorithm.tepo_advantage.base_options.std=population"),
        "entropy_adv": errors("algorithm.adv_estimator=tepo.entropy_adv"),
        "erpo bad option": errors("algorithm.adv_estimator=tepo.erpo", "actor_rollout_ref.actor.use_kl_loss=true",
                                  "+algorithm.tepo_advantage.gate=soft"),
        "otb": errors("algorithm.adv_estimator=tepo.optimal_token_baseline"),
        "gdpo": errors("algorithm.adv_estimator=tepo.gdpo"),
        "verl's grpo": errors("algorithm.adv_estimator=grpo"),
    }))
    """
)


def test_verl_config_checks_of_tepo_estimators(verl_python, tmp_path):
    """Our trainers refuse, from verl's own composed ppo_trainer config, an estimator verl cannot feed."""
    got = run_verl_script(verl_python, tmp_path, CONFIG_SCRIPT, name="config.py")
    assert len(got["erpo without reference"]) == 1 and "use_kl_loss=true" in got["erpo without reference"][0]
    assert got["erpo with reference"] == []
    assert got["entropy_adv"] == []
    assert len(got["erpo bad option"]) == 1 and "gate" in got["erpo bad option"][0]
    assert len(got["otb"]) == 1 and "calculate_sum_pi_squared=true" in got["otb"][0]
    assert any("gdpo" in e for e in got["gdpo"])
    assert got["verl's grpo"] == []
