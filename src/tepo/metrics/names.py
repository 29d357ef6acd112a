"""Metric names are grouped by the phase that computes them, and named so where they are computed (verl logs
``actor/pg_clipfrac`` the same way):

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
(``tepo.training.update``), the step (``tepo.training.step``) and the trainer write these names; a library
function that names its own values (a loss's ``clip_frac_high``, the guard's ``parity_gap``) is put in its group
by the phase that logs it (:func:`in_group`). The log writes rows as they come.

What stays here is the reading map: runs written before the grouping (2026-12-05) have flat names, and
:func:`canonical`, which ``tepo.metrics.read_metrics`` applies to every row, gives them the grouped ones, so every
reader (``tepo compare``, ``tepo report``, the scripts of the results pages) is written against the grouped names
only and still reads old runs. The table is that map, old flat name -> grouped name, and nothing writes by it.
"""

from __future__ import annotations

STEP = "step"

_GROUPS: dict[str, dict[str, str]] = {
    "rollout": {
        "policy_lag": "policy_lag",  # 1: sampled during the previous update (overlapped rollouts)
        "rounds": "rounds",  # sampling rounds (dynamic sampling refills)
        "groups_total": "groups_total",
        "groups_dropped": "groups_dropped",
        "frac_groups_dropped": "frac_groups_dropped",
        "num_sequences": "num_sequences",
        "gen_tokens": "gen_tokens",
        "response_length_mean": "response_length_mean",
        "response_length_max": "response_length_max",
        "frac_truncated": "frac_truncated",
    },
    "reward": {
        "reward_mean": "mean",
        "reward_std": "std",
        "accuracy": "accuracy",
        "no_answer": "no_answer",
        "reward_timeouts": "timeouts",
        "reward_errors": "errors",
        "overlong_penalty_mean": "overlong_penalty_mean",
        # Groups whose G rewards are all equal (GRPO: no gradient), and the share of their tokens that the
        # estimator still gave a nonzero advantage (EP-GRPO's polarity fallback; tepo.advantages.filtering).
        "frac_groups_all_equal": "frac_groups_all_equal",
        "frac_all_equal_tokens_advantaged": "frac_all_equal_tokens_advantaged",
        "reward_timeouts_total": "timeouts_total",  # the run's running totals, across resumes
        "reward_parse_failures": "parse_failures_total",
    },
    "update": {
        # The loss (tepo.losses.compute_policy_loss and the registered losses' own metrics), token-weighted
        # over the micro-batches of the step.
        "loss": "loss",
        "policy_loss": "policy_loss",
        "clip_frac_low": "clip_frac_low",
        "clip_frac_high": "clip_frac_high",
        "clip_frac_dual": "clip_frac_dual",
        "seq_clip_frac_low": "seq_clip_frac_low",
        "seq_clip_frac_high": "seq_clip_frac_high",
        "approx_kl": "approx_kl",
        "ratio_mean": "ratio_mean",
        "ratio_max": "ratio_max",
        "seq_ratio_mean": "seq_ratio_mean",
        "seq_ratio_max": "seq_ratio_max",
        "seq_ratio_min": "seq_ratio_min",
        "seq_ratio_p10": "seq_ratio_p10",
        "seq_ratio_p50": "seq_ratio_p50",
        "seq_ratio_p90": "seq_ratio_p90",
        "entropy": "entropy",
        "entropy_bonus": "entropy_bonus",
        "kl_ref": "kl_ref",
        "tepo_kl_mask": "tepo_kl_mask",
        "tepo_kl_mask_frac": "tepo_kl_mask_frac",
        "cov_clip_frac": "cov_clip_frac",
        "kl_cov_frac": "kl_cov_frac",
        "kl_cov_abs_kl": "kl_cov_abs_kl",
        "cov_weight_mean": "cov_weight_mean",
        "off_policy_mask_frac": "off_policy_mask_frac",
        "top_entropy_kept_frac": "top_entropy_kept_frac",
        "m2po_drop_frac": "m2po_drop_frac",
        "dro_log_ratio_mean": "dro_log_ratio_mean",
        "sapo_gate_mean": "sapo_gate_mean",
        "vespo_phi_mean": "vespo_phi_mean",
        # The objectives of open TRL / verl pull requests (up, cppo, topr, stare, fipo): their upstream metrics.
        "ppo_kl": "ppo_kl",
        "up_clipfrac": "up_clipfrac",
        "up_clipfrac_lower": "up_clipfrac_lower",
        "up_low_mean": "up_low_mean",
        "up_low_min": "up_low_min",
        "cppo_masked_frac": "cppo_masked_frac",
        "cppo_tis_capped_frac": "cppo_tis_capped_frac",
        "topr_negative_seq_frac": "topr_negative_seq_frac",
        "topr_taper_weight_mean": "topr_taper_weight_mean",
        "stare_gate_on": "stare_gate_on",
        "stare_batch_entropy": "stare_batch_entropy",
        "stare_positive_reweight_ratio": "stare_positive_reweight_ratio",
        "stare_negative_reweight_ratio": "stare_negative_reweight_ratio",
        "stare_mean_weight": "stare_mean_weight",
        "fipo_influence_weights_mean_raw": "fipo_influence_weights_mean_raw",
        "fipo_influence_weight_clip_ratio_upper": "fipo_influence_weight_clip_ratio_upper",
        "fipo_influence_weight_clip_ratio_lower": "fipo_influence_weight_clip_ratio_lower",
        "fipo_sequence_drop_ratio": "fipo_sequence_drop_ratio",
        # The update loop (tepo.training.update) and the trainer around it.
        "entropy_mean": "entropy_mean",
        "grad_norm": "grad_norm",
        "grad_norm_max": "grad_norm_max",
        "optimizer_updates": "optimizer_updates",
        "skipped_updates": "skipped_updates",  # optimizer steps not applied (non-finite loss or gradient)
        "update_padding_share": "padding_share",
        "lr": "lr",
        "bad_steps_in_row": "bad_steps_in_row",
        "skipped_update": "skipped_update",  # no update at all this step (dynamic sampling kept no group)
        "skip_reason": "skip_reason",
    },
    "mismatch": {
        # tepo.losses.rollout_mismatch_metrics: the sampler pi_s against the trainer's pi_old.
        "mismatch_kl_k1": "kl_k1",
        "mismatch_kl_k3": "kl_k3",
        "mismatch_abs_log_ratio_mean": "abs_log_ratio_mean",
        "mismatch_abs_log_ratio_max": "abs_log_ratio_max",
        "mismatch_token_out_frac": "token_out_frac",
        "mismatch_seq_token_out_frac": "seq_token_out_frac",
        "mismatch_seq_out_frac": "seq_out_frac",
        "mismatch_seq_ratio_mean": "seq_ratio_mean",
        "mismatch_seq_ratio_std": "seq_ratio_std",
        "mismatch_seq_ratio_min": "seq_ratio_min",
        "mismatch_seq_ratio_max": "seq_ratio_max",
        # tepo.losses.rollout_correction_weights: what the correction of that gap did.
        "is_weight_mean": "is_weight_mean",
        "is_weight_min": "is_weight_min",
        "is_weight_max": "is_weight_max",
        "is_truncated_frac": "is_truncated_frac",
        "is_dropped_frac": "is_dropped_frac",
        "is_dropped_seq_frac": "is_dropped_seq_frac",
        "is_batch_norm_factor": "is_batch_norm_factor",
    },
    "parity": {
        "parity_gap": "gap",
        "parity_share": "share",
        "parity_shift": "shift",
        "parity_residual": "residual",
        "parity_decided": "decided",
        "parity_frozen": "frozen",
        "parity_undecided_total": "undecided_total",
    },
    "eval": {
        "eval_greedy_accuracy": "greedy_accuracy",
        "eval_sampled_accuracy": "sampled_accuracy",
        "eval_sampled_cons": "sampled_cons",
    },
    "time": {
        "step_seconds": "step_seconds",  # the whole step, waiting for an overlapped batch included
        "gen_seconds": "gen_seconds",
        "reward_seconds": "reward_seconds",
        "logprob_seconds": "logprob_seconds",
        "update_seconds": "update_seconds",
        "eval_seconds": "eval_seconds",
        "rollout_sync_seconds": "rollout_sync_seconds",  # included in gen_seconds
        "rollout_wait_seconds": "rollout_wait_seconds",
        "rollout_stage_seconds": "rollout_stage_seconds",
        "gen_tokens_per_s": "gen_tokens_per_s",
        "logprob_tokens_per_s": "logprob_tokens_per_s",
        "update_tokens_per_s": "update_tokens_per_s",
    },
    "memory": {
        "peak_memory_mb": "peak_rss_mb",  # the process's peak resident memory (host)
        "gpu_peak_memory_mb": "gpu_peak_mb",  # torch's peak allocation on the GPU
    },
}

GROUPS = tuple(_GROUPS)

#: flat name (what runs before the grouping logged) -> grouped name (what is written now)
NAMES: dict[str, str] = {
    flat: f"{group}/{name}" for group, names in _GROUPS.items() for flat, name in names.items()
}

#: grouped name -> flat name
FLAT_NAMES: dict[str, str] = {grouped: flat for flat, grouped in NAMES.items()}


def metric_name(key: str) -> str:
    """The grouped name of ``key``: an old flat name by the table, a grouped name (or ``step``, or a key the table
    does not know) as it is. Readers use it to accept either spelling of a metric (``reward_mean`` or
    ``reward/mean``)."""
    return NAMES.get(key, key)


def flat_name(key: str) -> str:
    """The old flat name of ``key`` (``reward/mean`` -> ``reward_mean``); a key without one as it is. Figures are
    named after it (``curve_reward_mean.png``), so the files of pages made before the grouping keep their names."""
    return FLAT_NAMES.get(key, key)


def canonical(row: dict) -> dict:
    """A row read from a log, old (flat names) or new (grouped names), with the grouped names, in the same order.
    The table's two sides never share a name (every grouped name holds a ``/``, no flat one does): grouped names
    and unknown keys pass through."""
    return {metric_name(key): value for key, value in row.items()}


def in_group(group: str, metrics: dict, *, drop_prefix: str = "") -> dict:
    """``metrics`` named in ``group`` (one of :data:`GROUPS`): ``clip_frac_high`` -> ``update/clip_frac_high``,
    with ``drop_prefix="parity_"`` ``parity_gap`` -> ``parity/gap``. For the phase that logs the values of a
    function that names its own (a loss, the parity guard, the mismatch metrics)."""
    if group not in _GROUPS:
        raise ValueError(f"unknown metric group {group!r}; groups: {', '.join(GROUPS)}")
    return {f"{group}/{key.removeprefix(drop_prefix)}": value for key, value in metrics.items()}


def unplaced(keys) -> list[str]:
    """The keys among ``keys`` that the table does not place: neither ``step``, nor a flat name of the table, nor
    already grouped (a ``/`` in the name). A test asserts that a training step returns none."""
    return [k for k in keys if k != STEP and k not in NAMES and "/" not in k]


#: names logged once per item of a list in the config, ``<name>`` standing for the item's name: each function of
#: ``reward.functions`` (``reward/correctness_mean``, ``reward/format_mean``, a reward file's function name)
PATTERNS: tuple[str, ...] = ("reward/<name>_mean", "reward/<name>_errors", "reward/<name>_timeouts")


def ungrouped(keys) -> list[str]:
    """The keys among ``keys`` that are neither ``step`` nor grouped (a ``/`` in the name): a test asserts that a
    training step and the trainer write none."""
    return [k for k in keys if k != STEP and "/" not in k]
