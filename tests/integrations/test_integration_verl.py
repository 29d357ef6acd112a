"""`tepo.integrations.verl` against the real verl 0.9.1, in its own virtual environment.

verl 0.9.1 pins dependencies that clash with tepo's environment, so the session fixture ``verl_python``
(tests/integrations/conftest.py, with tests/verl_runner.py) builds ``.venv-verl`` in the repository root (once; later
runs reuse it). That is about a minute from a warm package cache but about 2 GB of downloads on a fresh machine,
hence ``@pytest.mark.slow`` (opt in: ``pytest -m slow tests/integrations/test_integration_verl.py``). The fixture
skips only when pip cannot reach a package index.

The checks run in a subprocess inside that environment (`CHECK_SCRIPT`): verl's own ``import verl`` must have
loaded our plugin through the ``verl.plugins`` entry point (and, in a second process, through
``VERL_USE_EXTERNAL_MODULES``), ``get_policy_loss_fn`` must resolve every name, and each returns the value and
gradient of ``compute_policy_loss`` on the same tensors with verl's global batch info, including a simulated
2-rank data-parallel split, with and without verl's ``rollout_is_weights`` (``compute_policy_loss(...,
is_weights=...)``, and verl's own ``vanilla`` loss with the same weights). The actor's loss path on a real model
forward is in tests/integrations/test_integration_verl_actor.py.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from verl_runner import ROOT, run, run_verl_script, verl_env

pytestmark = pytest.mark.slow


CHECK_SCRIPT = textwrap.dedent(
    r"""
    import json, os, sys
    import verl  # loads plugins: nothing of tepo has been imported before this line
    via = os.environ.get("VERL_USE_EXTERNAL_MODULES") or "entry point"
    assert "tepo.integrations.verl_plugin" in sys.modules, f"tepo plugin not loaded by `import verl` ({via})"

    import torch
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import POLICY_LOSS_REGISTRY, get_policy_loss_fn
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import ActorConfig
    from tepo.integrations.verl import TepoPolicyLossConfig, registered_names
    from tepo.losses import POLICY_LOSSES, compute_policy_loss

    names = registered_names()
    assert set(names.values()) == set(POLICY_LOSSES), names
    for mode, name in names.items():
        assert get_policy_loss_fn(mode).__name__ == f"tepo_{name}_policy_loss", mode
    for builtin in ("gspo", "cispo", "clip_cov", "kl_cov", "vanilla"):
        assert not get_policy_loss_fn(builtin).__name__.startswith("tepo_"), f"verl builtin {builtin} replaced"

    def actor_config(policy_loss: dict, agg="token-mean"):
        # The real conversion path of verl's trainer: hydra _target_ -> our PolicyLossConfig subclass.
        pl = omega_conf_to_dataclass(OmegaConf.create(
            {"_target_": "tepo.integrations.verl.TepoPolicyLossConfig", **policy_loss}))
        assert type(pl) is TepoPolicyLossConfig
        return ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                           loss_agg_mode=agg, policy_loss=pl)

    gen = torch.Generator().manual_seed(0)
    N, T = 6, 7
    mask = torch.ones(N, T, dtype=torch.bool)
    for i, length in enumerate([7, 5, 3, 6, 1, 4]):
        mask[i, length:] = False
    base_logp = -torch.rand(N, T, generator=gen) * 3
    old = base_logp + 0.2 * torch.randn(N, T, generator=gen)
    adv = torch.randn(N, generator=gen).unsqueeze(-1).expand(N, T).contiguous()

    # verl's rollout_is_weights: detached, zero on padding (rollout_corr_helper multiplies by response_mask)
    is_w = (0.25 + 1.5 * torch.rand(N, T, generator=gen)) * mask

    def verl_call(mode, cfg, rows, info, weights=None):
        cfg.global_batch_info.clear()
        cfg.global_batch_info.update(info)
        logp = base_logp.clone().requires_grad_(True)
        loss, metrics = get_policy_loss_fn(mode)(
            old_log_prob=old[rows], log_prob=logp[rows], advantages=adv[rows], response_mask=mask[rows],
            loss_agg_mode=cfg.loss_agg_mode, config=cfg,
            rollout_is_weights=None if weights is None else weights[rows])
        loss.backward()
        return loss.detach(), logp.grad, metrics

    def ours(name, options, agg, weights=None):
        logp = base_logp.clone().requires_grad_(True)
        loss, _ = compute_policy_loss(name, logp=logp, old_logp=old, advantages=adv, mask=mask, agg=agg,
                                      is_weights=weights, **options)
        loss.backward()
        return loss.detach(), logp.grad

    CASES = [  # (verl loss_mode, policy_loss options, verl loss_agg_mode, split-invariant)
        ("tepo", {"eps": 0.2}, "token-mean", True),
        ("tepo.tepo", {}, "token-mean", True),
        ("grpo", {}, "seq-mean-token-mean", True),
        ("dapo", {"eps_high": 0.28}, "token-mean", True),
        ("dr_grpo", {}, "seq-mean-token-sum-norm", True),
        ("tepo.cispo", {}, "token-mean", True),
        ("prefix_is", {}, "token-mean", True),
        ("tepo.gspo", {"eps": 0.05}, "seq-mean-token-mean", True),
        ("gmpo", {"agg": "seq-mean-token-mean"}, "token-mean", True),
        ("reinforce_is", {}, "token-mean", True),
        ("tepo.clip_cov", {"clip_cov_ratio": 1.0, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0, "seed": 3},
         "token-mean", False),
        ("tepo.kl_cov", {"kl_cov_ratio": 0.5, "kl_cov_coef": 0.7}, "token-mean", False),
        ("cov_gauss", {}, "token-mean", False),
    ]
    checked = {}
    whole = torch.arange(N)
    for mode, options, agg, split_invariant in CASES:
        name = names[mode]
        cfg = actor_config({"loss_mode": mode, **options}, agg)
        mine = {k: v for k, v in options.items()}
        use_agg = mine.pop("agg", agg)
        want, want_grad = ours(name, {**mine, "max_len": 9.0}, use_agg)
        info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": N, "loss_scale_factor": 9}
        got, got_grad, metrics = verl_call(mode, cfg, whole, info)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-7)
        assert f"actor/tepo/loss" in metrics and "actor/tepo/clip_frac_high" in metrics, metrics
        assert float(want) != 0.0
        result = {"value": float(got)}
        if split_invariant:
            # Two data-parallel ranks, each one micro-batch of half the rows; DDP averages their gradients.
            info2 = dict(info, dp_size=2)
            halves = [torch.arange(0, N // 2), torch.arange(N // 2, N)]
            parts = [verl_call(mode, cfg, rows, info2) for rows in halves]
            value = sum(p[0] for p in parts) / 2
            grad = sum(p[1] for p in parts) / 2
            torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)
            result["dp2"] = True
        # rollout_is_weights reach the loss as compute_policy_loss's is_weights
        want_w, want_w_grad = ours(name, {**mine, "max_len": 9.0}, use_agg, is_w)
        got_w, got_w_grad, _ = verl_call(mode, cfg, whole, info, is_w)
        torch.testing.assert_close(got_w, want_w, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(got_w_grad, want_w_grad, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(got_w, got), f"{mode}: weights changed nothing"
        result["is_weights"] = True
        checked[mode] = result

    # verl's own vanilla loss with the same weights = our dapo (token-level clip, token-mean; vanilla's dual clip
    # is inactive with clip_ratio_c=10 at these ratios), with and without weights, whole and in 2 dp ranks.
    vanilla = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode="token-mean",
                          clip_ratio=0.2, clip_ratio_c=10.0)
    dapo = actor_config({"loss_mode": "dapo", "eps": 0.2})
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": N, "loss_scale_factor": None}
    for weights in (None, is_w):
        v_val, v_grad, _ = verl_call("vanilla", vanilla, whole, info, weights)
        d_val, d_grad, _ = verl_call("dapo", dapo, whole, info, weights)
        torch.testing.assert_close(d_val, v_val, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(d_grad, v_grad, rtol=1e-6, atol=1e-7)
        halves = [torch.arange(0, N // 2), torch.arange(N // 2, N)]
        info2 = dict(info, dp_size=2)
        v_parts = [verl_call("vanilla", vanilla, rows, info2, weights) for rows in halves]
        d_parts = [verl_call("dapo", dapo, rows, info2, weights) for rows in halves]
        for v_part, d_part in zip(v_parts, d_parts):
            torch.testing.assert_close(d_part[0], v_part[0], rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(d_part[1], v_part[1], rtol=1e-6, atol=1e-7)
    checked["vanilla=dapo"] = {"value": float(v_val), "is_weights": True}

    # Refusals: one clear error, at config time and at call time.
    errors = {}
    for bad in ({"loss_mode": "tepo", "entropy_coef": 0.01},
                {"loss_mode": "tepo.kl_cov", "eps": 0.2}, {"loss_mode": "grpo", "kl_coef": 0.1}):
        try:
            actor_config(bad)
        except Exception as exc:  # hydra wraps the ValueError of __post_init__
            errors[json.dumps(bad)] = str(exc)
        else:
            raise AssertionError(f"accepted {bad}")
    # TEPO v2 is accepted in the config, but a registered loss called without entropies (verl's plain ppo_loss)
    # refuses rather than dropping the mask term.
    cfg = actor_config({"loss_mode": "tepo", "tepo_kl_mask_coef": 0.1})
    try:
        get_policy_loss_fn("tepo")(old_log_prob=old, log_prob=base_logp, advantages=adv, response_mask=mask,
                                   config=cfg, rollout_is_weights=None)
    except ValueError as exc:
        errors["tepo_kl_mask_coef"] = str(exc)
    else:
        raise AssertionError("tepo_kl_mask_coef ran without entropies")
    print(json.dumps({"via": via, "checked": checked, "errors": errors, "names": names}))
    """
)


def _check(verl_python: Path, tmp_path: Path, env_overrides: dict) -> dict:
    env = verl_env(**env_overrides, PYTHONPATH="")
    return run_verl_script(verl_python, tmp_path, CHECK_SCRIPT, name="check_verl.py", env=env)


def test_verl_registry_resolves_our_losses_via_entry_point(verl_python, tmp_path):
    report = _check(verl_python, tmp_path, {})
    assert report["via"] == "entry point"
    assert len(report["checked"]) == 14
    assert sum(1 for r in report["checked"].values() if r.get("dp2")) == 10
    assert all(r.get("is_weights") for r in report["checked"].values())
    assert "tepo.gspo" in report["names"] and "gspo" not in report["names"]  # verl's builtin gspo kept
    assert report["names"]["tepo"] == "tepo"
    errors = report["errors"]
    assert (
        "tepo_ppo_loss" in errors["tepo_kl_mask_coef"] and "calculate_entropy" in errors["tepo_kl_mask_coef"]
    )
    assert any("entropy_coeff" in e for e in errors.values())
    assert any("not an option of loss 'kl_cov'" in e for e in errors.values())
    assert any("kl_loss_coef" in e for e in errors.values())


def test_verl_plugin_via_external_modules_env(verl_python, tmp_path):
    report = _check(
        verl_python,
        tmp_path,
        {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "tepo.integrations.verl_plugin"},
    )
    assert report["via"] == "tepo.integrations.verl_plugin"
    assert len(report["checked"]) == 14


COMPOSE_SCRIPT = textwrap.dedent(
    r"""
    import json, sys
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    import verl  # noqa: F401
    from verl.utils.config import omega_conf_to_dataclass
    with initialize_config_dir(config_dir=sys.argv[1], version_base=None):
        cfg = compose(config_name="tepo_qwen2.5_7b_dapo_math")
    OmegaConf.resolve(cfg)
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
    from verl.trainer.ppo.v1 import get_trainer_cls
    from tepo.integrations.verl_workers import tepo_v2_config_errors  # registers tepo_sync, as the launch script
    without_entropy = OmegaConf.merge(cfg, {"actor_rollout_ref": {"actor": {"calculate_entropy": False}}})
    print(json.dumps({
        "prompts": cfg.data.train_batch_size, "n": cfg.actor_rollout_ref.rollout.n,
        "mini": actor.ppo_mini_batch_size, "epochs": actor.ppo_epochs, "lr": actor.optim.lr,
        "response": cfg.data.max_response_length, "loss_mode": actor.policy_loss.loss_mode,
        "eps": actor.policy_loss.eps, "policy_loss_cls": type(actor.policy_loss).__name__,
        "agg": actor.loss_agg_mode, "filter_groups": cfg.algorithm.filter_groups.enable,
        "model": cfg.actor_rollout_ref.model.path,
        "tepo_kl_mask_coef": actor.policy_loss.tepo_kl_mask_coef, "calculate_entropy": actor.calculate_entropy,
        "use_v1": cfg.trainer.use_v1, "trainer_mode": cfg.trainer.v1.trainer_mode,
        "v2_errors": tepo_v2_config_errors(cfg), "trainer_cls": get_trainer_cls(cfg.trainer.v1.trainer_mode).__name__,
        "without_entropy": tepo_v2_config_errors(without_entropy),
    }))
    """
)


def test_verl_example_config_is_the_paper_setting(verl_python, tmp_path):
    """examples/verl's config composes over verl's own ppo_trainer config into TEPO Section 4.1's setting with TEPO
    v2's mask, selecting the tepo_sync trainer (registered by tepo.integrations.verl_workers)."""
    got = run_verl_script(
        verl_python, tmp_path, COMPOSE_SCRIPT, ROOT / "examples" / "verl", name="compose.py"
    )
    assert got == {
        "prompts": 64,
        "n": 8,
        "mini": 16,
        "epochs": 2,
        "lr": 5e-7,
        "response": 8192,
        "loss_mode": "tepo",
        "eps": 0.2,
        "policy_loss_cls": "TepoPolicyLossConfig",
        "agg": "token-mean",
        "filter_groups": True,
        "model": "Qwen/Qwen2.5-7B",
        "tepo_kl_mask_coef": 0.1,
        "calculate_entropy": True,
        "use_v1": True,
        "trainer_mode": "tepo_sync",
        "v2_errors": [],
        "trainer_cls": "TepoPPOTrainerSync",
        "without_entropy": [
            "actor_rollout_ref.actor.calculate_entropy must be true with policy_loss.tepo_kl_mask_coef=0.1: the "
            "update needs the current policy's per-token entropy"
        ],
    }
    updates_per_rollout = got["prompts"] // got["mini"] * got["epochs"]
    assert updates_per_rollout == 8


def test_verl_main_runs_verl_config_and_refuses_before_ray(verl_python, tmp_path):
    """`python -m tepo.integrations.verl_main` composes verl's own config and checks it before Ray starts."""
    shown = run(
        [verl_python, "-m", "tepo.integrations.verl_main", "--cfg", "job", "trainer.use_v1=false"],
        timeout=600,
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "use_v1: false" in shown.stdout
    refused = run(
        [
            verl_python,
            "-m",
            "tepo.integrations.verl_main",
            "trainer.use_v1=false",
            "+actor_rollout_ref.actor.policy_loss.tepo_kl_mask_coef=0.1",
            "actor_rollout_ref.actor.policy_loss._target_=tepo.integrations.verl.TepoPolicyLossConfig",
            "actor_rollout_ref.actor.policy_loss.loss_mode=tepo",
            f"hydra.run.dir={tmp_path / 'hydra'}",  # hydra's run log, out of the working tree
        ],
        timeout=600,
    )
    assert refused.returncode != 0
    assert "calculate_entropy must be true" in refused.stderr, refused.stderr[-3000:]
    assert "ray init" not in refused.stdout  # refused before verl's run_ppo starts Ray
