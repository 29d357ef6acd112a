"""The reading map of old logs: runs written before metric names were grouped by phase hold flat names
(``reward_mean``, ``clip_frac_high``), and :func:`canonical`, which ``tepo.metrics.read_metrics`` applies to every
row, gives them the grouped ones (``reward/mean``, ``update/clip_frac_high``), so every reader (``tepo compare``,
``tepo report``, the scripts of the results pages) is written against the grouped names only and still reads old
runs. The table is that map, old flat name -> grouped name, per group, and nothing writes by it; a metric logged
only under its grouped name has no entry (the names a run logs: ``tepo.metrics.catalogue``).
"""

from __future__ import annotations

_OLD_NAMES: dict[str, dict[str, str]] = {
    "rollout": {
        "policy_lag": "policy_lag",
        "rounds": "rounds",
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
        "reward_timeouts_total": "timeouts_total",
        "reward_parse_failures": "parse_failures_total",
    },
    "update": {
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
        "entropy_mean": "entropy_mean",
        "grad_norm": "grad_norm",
        "grad_norm_max": "grad_norm_max",
        "optimizer_updates": "optimizer_updates",
        "skipped_updates": "skipped_updates",
        "update_padding_share": "padding_share",
        "lr": "lr",
        "bad_steps_in_row": "bad_steps_in_row",
        "skipped_update": "skipped_update",
        "skip_reason": "skip_reason",
    },
    "mismatch": {
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
        "step_seconds": "step_seconds",
        "gen_seconds": "gen_seconds",
        "reward_seconds": "reward_seconds",
        "logprob_seconds": "logprob_seconds",
        "update_seconds": "update_seconds",
        "eval_seconds": "eval_seconds",
        "rollout_sync_seconds": "rollout_sync_seconds",
        "rollout_wait_seconds": "rollout_wait_seconds",
        "rollout_stage_seconds": "rollout_stage_seconds",
        "gen_tokens_per_s": "gen_tokens_per_s",
        "logprob_tokens_per_s": "logprob_tokens_per_s",
        "update_tokens_per_s": "update_tokens_per_s",
    },
    "memory": {
        "peak_memory_mb": "peak_rss_mb",
        "gpu_peak_memory_mb": "gpu_peak_mb",
    },
}


#: flat name (what runs before the grouping logged) -> grouped name
NAMES: dict[str, str] = {
    flat: f"{group}/{name}" for group, names in _OLD_NAMES.items() for flat, name in names.items()
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
