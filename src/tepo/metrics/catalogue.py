"""Every metric name a run logs, grouped by the phase that computes it, and named so where it is computed (verl
logs ``actor/pg_clipfrac`` the same way):

- ``rollout/``: sampling and the batch it gave (groups kept and dropped, lengths, truncation, policy lag),
- ``reward/``: scoring (batch reward and accuracy, verifier time-outs and errors, each reward function's mean),
- ``update/``: the policy update (the loss and its metrics, clip fractions, ratios, KL, entropy, gradient norm,
  learning rate, optimizer steps applied and skipped),
- ``mismatch/``: the sampler/trainer gap on the batch and the rollout correction's importance weights,
- ``parity/``: the engine's weight-sync check (``tepo.rollout.parity``),
- ``eval/``: held-out accuracies, on the steps that evaluate,
- ``time/``: seconds per phase and tokens per second,
- ``memory/``: peak memory.

``step`` stays at the top level. The collect phase (``tepo.training.collect``), the update
(``tepo.training.update``), the step (``tepo.training.step``), the held-out evaluation
(``tepo.training.evaluation``) and the trainer write these names; a library function that names its own values
(a loss's ``clip_frac_high``, the guard's ``parity_gap``) is put in its group by the phase that logs it
(:func:`in_group`). :data:`LOGGED` is the catalogue docs/metrics.md documents (tests/metrics/test_metrics_doc.py);
a new metric is one line here and one row there. Reading logs written before the grouping: ``tepo.metrics.names``.
"""

from __future__ import annotations

STEP = "step"

_CATALOGUE: dict[str, tuple[str, ...]] = {
    "rollout": (
        "policy_lag",  # 1: sampled during the previous update (overlapped rollouts)
        "rounds",  # sampling rounds (dynamic sampling refills)
        "groups_total",
        "groups_dropped",
        "frac_groups_dropped",
        "num_sequences",
        "gen_tokens",
        "response_length_mean",
        "response_length_max",
        "frac_truncated",
    ),
    "reward": (
        "mean",
        "std",
        "accuracy",
        "no_answer",
        "timeouts",
        "errors",
        "overlong_penalty_mean",
        # Groups whose G rewards are all equal (GRPO: no gradient), and the share of their tokens that the
        # estimator still gave a nonzero advantage (EP-GRPO's polarity fallback; tepo.advantages.filtering).
        "frac_groups_all_equal",
        "frac_all_equal_tokens_advantaged",
        "timeouts_total",  # the run's running totals, across resumes
        "parse_failures_total",
    ),
    "update": (
        # The loss (tepo.losses.compute_policy_loss and the registered losses' own metrics), token-weighted
        # over the micro-batches of the step.
        "loss",
        "policy_loss",
        "clip_frac_low",
        "clip_frac_high",
        "clip_frac_dual",
        "seq_clip_frac_low",
        "seq_clip_frac_high",
        "approx_kl",
        "ratio_mean",
        "ratio_max",
        "seq_ratio_mean",
        "seq_ratio_max",
        "seq_ratio_min",
        "seq_ratio_p10",
        "seq_ratio_p50",
        "seq_ratio_p90",
        "entropy",
        "entropy_bonus",
        "kl_ref",
        "tepo_kl_mask",
        "tepo_kl_mask_frac",
        "cov_clip_frac",
        "kl_cov_frac",
        "kl_cov_abs_kl",
        "cov_weight_mean",
        "off_policy_mask_frac",
        "top_entropy_kept_frac",
        "m2po_drop_frac",
        "dro_log_ratio_mean",
        "sapo_gate_mean",
        "vespo_phi_mean",
        # The objectives of open TRL / verl pull requests (up, cppo, topr, stare, fipo): their upstream metrics.
        "ppo_kl",
        "up_clipfrac",
        "up_clipfrac_lower",
        "up_low_mean",
        "up_low_min",
        "cppo_masked_frac",
        "cppo_tis_capped_frac",
        "topr_negative_seq_frac",
        "topr_taper_weight_mean",
        "stare_gate_on",
        "stare_batch_entropy",
        "stare_positive_reweight_ratio",
        "stare_negative_reweight_ratio",
        "stare_mean_weight",
        "fipo_influence_weights_mean_raw",
        "fipo_influence_weight_clip_ratio_upper",
        "fipo_influence_weight_clip_ratio_lower",
        "fipo_sequence_drop_ratio",
        # The update loop (tepo.training.update) and the trainer around it.
        "entropy_mean",
        "grad_norm",
        "grad_norm_max",
        "optimizer_updates",
        "skipped_updates",  # optimizer steps not applied (non-finite loss or gradient)
        "padding_share",
        "lr",
        "bad_steps_in_row",
        "skipped_update",  # no update at all this step (dynamic sampling kept no group)
        "skip_reason",
    ),
    "mismatch": (
        # tepo.losses.rollout_mismatch_metrics: the sampler pi_s against the trainer's pi_old.
        "kl_k1",
        "kl_k3",
        "abs_log_ratio_mean",
        "abs_log_ratio_max",
        "token_out_frac",
        "seq_token_out_frac",
        "seq_out_frac",
        "seq_ratio_mean",
        "seq_ratio_std",
        "seq_ratio_min",
        "seq_ratio_max",
        # tepo.losses.rollout_correction_weights: what the correction of that gap did.
        "is_weight_mean",
        "is_weight_min",
        "is_weight_max",
        "is_truncated_frac",
        "is_dropped_frac",
        "is_dropped_seq_frac",
        "is_batch_norm_factor",
    ),
    "parity": ("gap", "share", "shift", "residual", "decided", "frozen", "undecided_total"),
    "eval": ("greedy_accuracy", "sampled_accuracy", "sampled_cons"),
    "time": (
        "step_seconds",  # the whole step, waiting for an overlapped batch included
        "gen_seconds",
        "reward_seconds",
        "logprob_seconds",
        "update_seconds",
        "eval_seconds",
        "rollout_sync_seconds",  # included in gen_seconds
        "rollout_wait_seconds",
        "rollout_stage_seconds",
        "gen_tokens_per_s",
        "logprob_tokens_per_s",
        "update_tokens_per_s",
    ),
    "memory": (
        "peak_rss_mb",  # the process's peak resident memory (host)
        "gpu_peak_mb",  # torch's peak allocation on the GPU
    ),
}

GROUPS = tuple(_CATALOGUE)

#: every grouped name a run can log (besides the patterns below)
LOGGED: tuple[str, ...] = tuple(f"{group}/{name}" for group, names in _CATALOGUE.items() for name in names)

#: names logged once per item of a list, ``<name>`` standing for the item: each function of ``reward.functions``
#: (``reward/correctness_mean``, ``reward/format_mean``, a reward file's function name), and each k of the
#: initial and the trained policy's pass@k (``eval/pass@4``; ``eval.pass_k_samples``)
PATTERNS: tuple[str, ...] = (
    "reward/<name>_mean",
    "reward/<name>_errors",
    "reward/<name>_timeouts",
    "eval/pass@<name>",
)


def in_group(group: str, metrics: dict, *, drop_prefix: str = "") -> dict:
    """``metrics`` named in ``group`` (one of :data:`GROUPS`): ``clip_frac_high`` -> ``update/clip_frac_high``,
    with ``drop_prefix="parity_"`` ``parity_gap`` -> ``parity/gap``. For the phase that logs the values of a
    function that names its own (a loss, the parity guard, the mismatch metrics)."""
    if group not in _CATALOGUE:
        raise ValueError(f"unknown metric group {group!r}; groups: {', '.join(GROUPS)}")
    return {f"{group}/{key.removeprefix(drop_prefix)}": value for key, value in metrics.items()}


def ungrouped(keys) -> list[str]:
    """The keys among ``keys`` that are neither ``step`` nor grouped (a ``/`` in the name): a test asserts that a
    training step and the trainer write none."""
    return [k for k in keys if k != STEP and "/" not in k]
