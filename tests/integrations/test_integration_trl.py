"""`tepo.integrations.trl.TepoGRPOTrainer` with the real TRL (1.16) on CPU and the real embedded model.

The reward function here scores completions by their length (deterministic, varies across samples so that
advantages are not all zero): these tests are about the loss wiring, not about reward verification, which
`tests/test_rewards*.py` covers with the real math-verify.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("trl")
from trl import GRPOTrainer

from tepo.losses import compute_policy_loss
from trl_runner import embedded_model_trainer, loss_and_grad, policy_logps, random_micro_batch

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def fixed_trainer(tmp_path_factory):
    """A trainer (no training run) whose model is used for fixed-batch loss checks; its GRPOConfig also holds
    TRL's TEPO v1 settings (sequence-level IS, dapo loss, symmetric eps) for the TRL-equality test.

    Only the last transformer block and the final norm take gradients: the loss reaches every parameter through
    the same per-token log-probs, and a 135M-float gradient per comparison would dominate the test's time.
    """
    trainer = embedded_model_trainer(
        tmp_path_factory.mktemp("fixed"),
        loss_name="tepo",
        config=dict(importance_sampling_level="sequence", loss_type="dapo", epsilon=0.2, epsilon_high=0.2),
    )
    last_block = trainer.model.model.layers[-1]
    trainable = {id(p) for p in [*last_block.parameters(), *trainer.model.model.norm.parameters()]}
    for param in trainer.model.parameters():
        param.requires_grad_(id(param) in trainable)
    return trainer


def assert_grads_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32 summation-order noise, measured against the gradient's own scale."""
    assert float(want.abs().max()) > 0
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


def _fixed_batch(trainer, seed: int = 0, rows: int = 4, prompt_len: int = 5, comp_len: int = 6):
    """A hand-made TRL micro-batch: random tokens, ragged completion masks, old log-probs off the policy."""
    lengths = [comp_len, comp_len - 2, 3, comp_len - 1][:rows]
    advantages = [1.0, -0.5, 0.8, -1.2][:rows]
    gen = torch.Generator().manual_seed(seed)
    return random_micro_batch(trainer, gen, lengths, advantages, prompt_len, comp_len, slices=3)[0]


def _reference(trainer, batch, name, num_tokens, **options):
    """compute_policy_loss on the tensors TRL's own log-prob pass returns."""
    logps, entropies, _ = policy_logps(trainer, batch, compute_entropy=True)
    loss, _ = compute_policy_loss(
        name,
        logp=logps,
        old_logp=batch["old_per_token_logps"],
        advantages=batch["advantages"],
        mask=batch["completion_mask"],
        entropy=entropies,
        num_tokens=num_tokens,
        **options,
    )
    return loss


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("tepo", {}),
        ("grpo", {}),
        ("gspo", {"eps": 0.1}),
        ("cispo", {}),
        ("tepo", {"entropy_coef": 0.01}),
        # The objectives of open TRL / verl pull requests: stare (the entropy it requires) and fipo (its own token
        # count) by default, the rest under -m slow (each adds a forward and backward pass of the model).
        ("stare", {"H_tgt": 100.0}),  # gate on: the reweighting is in the gradient
        ("fipo", {}),
        pytest.param("up", {"dual_clip": 3.0}, marks=pytest.mark.slow),
        pytest.param("cppo", {}, marks=pytest.mark.slow),
        pytest.param("topr", {}, marks=pytest.mark.slow),
        pytest.param("dapo_zv", {}, marks=pytest.mark.slow),
    ],
)
def test_adapter_loss_and_grad_equal_compute_policy_loss(fixed_trainer, name, options):
    trainer = fixed_trainer
    trainer.model.train()
    batch = _fixed_batch(trainer)
    # The window counts the adapter writes after generation: 37 tokens, 10 sequences over the window.
    batch["tepo_num_tokens"], batch["tepo_num_seqs"] = 37.0, 10.0
    saved = (trainer.loss_name, trainer.loss_options)
    trainer.loss_name, trainer.loss_options = name, {**options, "max_len": 8}
    try:
        got, got_grad = loss_and_grad(trainer, lambda: trainer._compute_loss(trainer.model, batch))
    finally:
        trainer.loss_name, trainer.loss_options = saved
    want, want_grad = loss_and_grad(
        trainer, lambda: _reference(trainer, batch, name, 37.0, num_seqs=10.0, max_len=8, **options)
    )
    assert got.item() != 0.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    assert_grads_close(got_grad, want_grad)
    logged = trainer._metrics["train"]
    assert logged["tepo/loss"][-1] == pytest.approx(got.item(), rel=1e-6)
    assert "tepo/clip_frac_high" in logged and "tepo/approx_kl" in logged and "tepo/entropy" in logged


def test_sampler_logps_reach_the_loss_as_rollout_logp(fixed_trainer):
    # TRL's sampling_per_token_logps (vLLM's own log-probs) are the behaviour policy of dppo_tv's mask; a NaN
    # (a token vLLM could not score) falls back to pi_old.
    trainer = fixed_trainer
    trainer.model.train()
    batch = _fixed_batch(trainer, seed=3)
    batch["tepo_num_tokens"], batch["tepo_num_seqs"] = 20.0, 4.0
    sampler = batch["old_per_token_logps"] + torch.linspace(
        -2.0, 2.0, batch["old_per_token_logps"].numel()
    ).view(batch["old_per_token_logps"].shape)
    rollout = sampler.clone()
    sampler[0, 0] = float("nan")
    rollout[0, 0] = batch["old_per_token_logps"][0, 0]
    batch["sampling_per_token_logps"] = sampler
    options = {"delta_low": 1e-4, "delta_high": 1e-4}
    saved = (trainer.loss_name, trainer.loss_options)
    trainer.loss_name, trainer.loss_options = "dppo_tv", options
    try:
        got, got_grad = loss_and_grad(trainer, lambda: trainer._compute_loss(trainer.model, batch))
    finally:
        trainer.loss_name, trainer.loss_options = saved
    want, want_grad = loss_and_grad(
        trainer,
        lambda: _reference(trainer, batch, "dppo_tv", 20.0, num_seqs=4.0, rollout_logp=rollout, **options),
    )
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-8)
    assert_grads_close(got_grad, want_grad)
    without = _reference(trainer, batch, "dppo_tv", 20.0, num_seqs=4.0, **options)
    assert without.item() != pytest.approx(got.item(), rel=1e-3)  # the sampler's mask changed the loss


def test_trl_sequence_dapo_equals_tepo(fixed_trainer):
    """TRL's importance_sampling_level="sequence" + loss_type="dapo" (symmetric eps 0.2) is TEPO v1: same value and
    gradient as our ``tepo`` on the same micro-batch, with TRL's own normaliser (no window counts passed)."""
    trainer = fixed_trainer
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test does not run
    batch = _fixed_batch(trainer, seed=1)
    assert trainer.importance_sampling_level == "sequence" and trainer.loss_type == "dapo"
    assert trainer.epsilon_low == trainer.epsilon_high == 0.2 and trainer.beta == 0.0
    trl_loss, trl_grad = loss_and_grad(
        trainer, lambda: GRPOTrainer._compute_loss(trainer, trainer.model, batch)
    )
    ours, our_grad = loss_and_grad(trainer, lambda: trainer._compute_loss(trainer.model, batch))
    assert trl_loss.item() != 0.0
    torch.testing.assert_close(ours, trl_loss, rtol=1e-6, atol=1e-8)
    assert_grads_close(our_grad, trl_grad)
    # and both are compute_policy_loss("tepo") with T_tot = num_items_in_batch (GA = steps_per_generation = 1 here
    # would divide by it; this config has steps_per_generation=2, GA=1, so T_tot = num_items / 2).
    want = _reference(trainer, batch, "tepo", float(batch["num_items_in_batch"]) / 2)
    torch.testing.assert_close(ours, want.detach(), rtol=1e-6, atol=1e-8)


def test_window_counts_make_micro_batches_sum_to_the_whole_batch(fixed_trainer):
    """Two slices of one optimizer window (GA=2): the adapter's counts make the sum of their gradients equal the
    gradient of compute_policy_loss on the whole window, for token-mean and seq-mean-token-mean."""
    trainer = fixed_trainer
    trainer.model.train()
    whole = _fixed_batch(trainer, seed=2)
    slices = [{k: (v[:2] if v.dim() else v) for k, v in whole.items()}]
    slices.append({k: (v[2:] if v.dim() else v) for k, v in whole.items()})
    trainer._annotate_counts(slices, window_size=2)
    assert (
        slices[0]["tepo_num_tokens"] == slices[1]["tepo_num_tokens"] == float(whole["completion_mask"].sum())
    )
    assert slices[0]["tepo_num_seqs"] == 4.0
    for name in ("tepo", "grpo"):
        trainer.loss_name = name
        try:
            trainer.model.zero_grad(set_to_none=True)
            for s in slices:
                trainer._compute_loss(trainer.model, s).backward()
            split_grad = torch.cat(
                [p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]
            )
        finally:
            trainer.loss_name = "tepo"
        _, whole_grad = loss_and_grad(trainer, lambda n=name: _reference(trainer, whole, n, None))
        assert_grads_close(split_grad, whole_grad)


def test_refuses_what_it_cannot_honour(tmp_path, embedded_model):
    model, tokenizer = embedded_model
    with pytest.raises(ValueError, match="unknown policy loss 'nope'"):
        embedded_model_trainer(tmp_path, model, tokenizer, loss_name="nope")
    with pytest.raises(ValueError, match="unknown loss_options bogus"):
        embedded_model_trainer(tmp_path, model, tokenizer, loss_options={"bogus": 1})
    with pytest.raises(ValueError, match=r"kl_coef in loss_options: set GRPOConfig\(beta"):
        embedded_model_trainer(tmp_path, model, tokenizer, loss_options={"kl_coef": 0.1})
    # TRL options with no equal are refused before TRL loads anything (the mapped ones:
    # tests/integrations/test_integration_trl_config.py).
    with pytest.raises(ValueError, match=r"delta=2\.0 .* which loss 'tepo' does not take"):
        embedded_model_trainer(tmp_path, model, tokenizer, config={"delta": 2.0})
    with pytest.raises(ValueError, match="GRPOConfig sets loss_type='sapo'"):
        embedded_model_trainer(tmp_path, model, tokenizer, config={"loss_type": "sapo"})
    # token-level estimators get their inputs at advantage time (test_integration_trl_token_advantages.py), except
    # what TRL's fused log-prob pass does not give, and a logp - old_logp signal (0 once per generation)
    with pytest.raises(
        ValueError, match="needs sum_pi_squared at advantage time, which TepoGRPOTrainer does not"
    ):
        embedded_model_trainer(tmp_path, model, tokenizer, advantage_estimator="optimal_token_baseline")
    with pytest.raises(ValueError, match=r"compares logp with old_logp.* Drop progress_baseline='old'"):
        embedded_model_trainer(
            tmp_path,
            model,
            tokenizer,
            advantage_estimator="erpo",
            advantage_options={"progress_baseline": "old"},
        )
    with pytest.raises(ValueError, match=r"needs reward_components, reward_weights .*normalize_then_sum"):
        embedded_model_trainer(tmp_path, model, tokenizer, advantage_estimator="gdpo")
    with pytest.raises(ValueError, match="unknown advantage_estimator"):
        embedded_model_trainer(tmp_path, model, tokenizer, advantage_estimator="nope")


slow = pytest.mark.slow
RUNS = [
    # TEPO v2's mask (entropies of pi and pi_old), the rloo estimator and the group filter. Opt-in since the
    # default suite neared its 15-minute budget (101 s, the suite's slowest test); the default suite keeps the
    # adapter's loss, gradient and TRL-metric equalities on real GRPOTrainer objects
    # (test_integration_trl_config.py, test_adapter_loss_and_grad_equal_compute_policy_loss).
    pytest.param(
        "tepo",
        {"tepo_kl_mask_coef": 0.5},
        {"advantage_estimator": "rloo", "dynamic_sampling": True},
        id="tepo+v2",
        marks=slow,
    ),
    # 35-75 s each on a loaded 2-core machine: opt-in.
    pytest.param("tepo", {}, {}, id="tepo", marks=slow),
    pytest.param("grpo", {}, {}, id="grpo", marks=slow),
    pytest.param("gspo", {}, {}, id="gspo", marks=slow),
    pytest.param("cispo", {}, {}, id="cispo", marks=slow),
]


@pytest.mark.parametrize(("name", "options", "extra"), RUNS)
def test_two_step_training_run(tmp_path, name, options, extra):
    """Two optimizer steps on 2 prompts x 2 samples, 8 new tokens: the second update is off-policy (pi_old != pi),
    the parameters move, and the loss's metrics reach TRL's log history."""
    trainer = embedded_model_trainer(tmp_path, loss_name=name, loss_options=options, **extra)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    moved = sum(float((p.detach() - b).abs().sum()) for p, b in zip(trainer.model.parameters(), before))
    assert moved > 0
    logs = [h for h in trainer.state.log_history if "tepo/loss" in h]
    assert len(logs) == 2
    for entry in logs:
        assert math.isfinite(entry["tepo/loss"]) and math.isfinite(entry["tepo/policy_loss"])
        assert "tepo/clip_frac_low" in entry and "tepo/entropy" in entry
        # TRL's own names beside tepo's, for dashboards and callbacks that read them
        assert entry["entropy"] == pytest.approx(entry["tepo/entropy"], rel=1e-5)
        assert math.isfinite(entry["policy_loss"])
        if name in ("tepo", "grpo", "gspo"):
            assert 0.0 <= entry["clip_ratio/region_mean"] <= 1.0
        if name == "cispo":
            assert 0.0 <= entry["cispo_clip_ratio"] <= 1.0
    if options.get("tepo_kl_mask_coef"):
        assert all("tepo/tepo_kl_mask_frac" in e for e in logs)
        assert "tepo/dynamic_sampling/frac_groups_dropped" in logs[0]
