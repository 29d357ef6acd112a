"""The cases behind docs/parity.md: per name, what TRL and verl compute, what tepo computes, the settings that
make them agree, the differences, and the test that shows it (equality at float64, or the documented difference).

docs/parity.md is generated from `ROWS` (``python tests/parity_rows.py > docs/parity.md``);
tests/integrations/test_parity_doc.py fails when the page is stale or when a row names a test that does not exist. Add a row
with each parity test; keep the cells short (the test's docstring holds the detail).
"""

from __future__ import annotations

import re
from pathlib import Path

FIELDS = ("name", "trl", "verl", "tepo", "agree", "differences", "tests")
HEADERS = (
    "name",
    "TRL 1.16",
    "verl 0.9.1",
    "tepo",
    "settings that make them agree",
    "differences",
    "test (runs by default?)",
)

_TRL_KL = "tests/integrations/test_parity_trl_estimators.py"
_TRL_CFG = "tests/integrations/test_integration_trl_config.py"
_VERL = "tests/integrations/test_integration_verl_estimators.py::test_verl_estimators_rejections_and_normalisation_equal_ours"
_VERL26 = "tests/integrations/test_integration_verl_objectives.py::test_verl_2026_losses_equal_ours_or_differ_as_documented"
_MORE = "tests/integrations/test_integration_verl_parity_more.py"
_OPEN_PR = "tests/losses/test_losses_open_prs_parity.py"
_OPEN_FORMS = "tests/losses/test_losses_open_prs.py"
_T39 = "tests/integrations/test_integration_verl_framework_estimators.py::test_verl_estimators_and_losses_of_issue_39_equal_ours"

# Token-level estimators (issue #44): where they run besides tepo's trainer, and at what cost.
_TRL_TOKEN_LEVEL = (
    "none of its own; runs in TRL as `TepoGRPOTrainer(advantage_estimator=...)`: per generation, at most one "
    "no-grad policy pass (none when TRL makes its old-policy pass: `num_iterations > 1`, vLLM correction) and, "
    "for `ref_logp`, one reference pass (none with `beta > 0`; adapter-off with PEFT): docs/integrations.md"
)
_TEPO_TOKEN_LEVEL = (
    "the trainer's pre-update pass (entropies) each step, plus the reference pass for `ref_logp`"
)
_TRL_TOKEN_ADV = "tests/integrations/test_integration_trl_token_advantages.py"
_TRL_TOKEN_TESTS = [
    f"{_TRL_TOKEN_ADV}::test_one_process_loss_receives_compute_advantages",
    f"{_TRL_TOKEN_ADV}::test_two_processes_loss_receives_compute_advantages",
    "tests/integrations/test_integration_trl_token_runs.py::test_lora_reference_is_the_adapter_off_model",
]

# tepo's token-level estimators inside verl (#44): the verl cell of their rows, and the tests behind it.
_VERL_TOKEN_LEVEL = (
    "{names} (`algorithm.adv_estimator`, options `+algorithm.tepo_advantage.*`): tepo's own function in verl's "
    "registry, on verl's `old_log_probs`, pi_old's entropies (verl's pi_old pass computes them anyway: no extra "
    "forward) and `ref_log_prob`; needs `trainer.v1.trainer_mode=tepo_sync` (v1 driver) or "
    "`python -m tepo.integrations.verl_main` (legacy), and for {ref} a reference pass "
    "(`actor.use_kl_loss=true`, `kl_loss_coef=0` if no KL loss is wanted: one reference forward per rollout)"
)
_VERL_ADV = "tests/integrations/test_integration_verl_advantages.py::test_verl_advantage_step_computes_tepo_estimators"
_VERL_ADV_BRIDGE = (
    "tests/integrations/test_verl_advantages_bridge.py::"
    "test_erpo_through_the_bridge_equals_compute_advantages_in_tepos_layout"
)

ROWS: list[dict] = [
    {
        "name": "`k3_unbiased` (KL)",
        "trl": "`beta > 0`, `use_bias_correction_kl=True` (the default): `k3 * coef_1`, gradient through `coef_1`",
        "verl": "none (its `kl_loss_type` has no ratio-corrected k3)",
        "tepo": "`kl_estimator: k3_unbiased`: `exp(logp - old) * k3`, gradient through the ratio",
        "agree": "TRL `importance_sampling_level=token`, `loss_type=bnpo`, eps 0.2/0.28 = tepo `dapo`, "
        "eps 0.2/0.28, `kl_coef=beta`",
        "differences": "TRL `importance_sampling_level=sequence` weights k3 by the sequence ratio `s_i`: the loss "
        "differs by `beta * sum m * k3 * (s_i - r_t) / T_tot` (asserted)",
        "tests": [
            f"{_TRL_KL}::test_kl_estimator_equals_trls_kl",
            f"{_TRL_KL}::test_sequence_level_trl_weights_its_kl_by_the_sequence_ratio",
        ],
    },
    {
        "name": "`k3` (KL)",
        "trl": "`beta > 0`, `use_bias_correction_kl=False`",
        "verl": "`kl_loss_type: k3` / `low_var_kl`",
        "tepo": "`kl_estimator: k3`: `exp(ref - logp) - (ref - logp) - 1`",
        "agree": "TRL as for `k3_unbiased` with `use_bias_correction_kl=False`; verl as is",
        "differences": "verl clamps `ref - logp` to [-20, 20] and k3 to [-10, 10]; tepo does not clamp "
        "(equal inside, asserted outside)",
        "tests": [f"{_TRL_KL}::test_kl_estimator_equals_trls_kl", _VERL],
    },
    {
        "name": "`k1`, `k2` (KL)",
        "trl": "none",
        "verl": "`kl_loss_type: k1` / `kl`, `k2` / `mse`",
        "tepo": "`kl_estimator: k1` (`logp - ref`), `k2` (`(logp - ref)^2 / 2`)",
        "agree": "as is",
        "differences": "none",
        "tests": [_VERL],
    },
    {
        "name": "`k1+`, `k2+`, `k3+` (KL)",
        "trl": "none",
        "verl": "`kl_loss_type: k1+` etc.: value of k1/k2/k3, gradient of k2 (straight-through)",
        "tepo": "`kl_estimator: k1+` etc.: the same",
        "agree": "as is",
        "differences": "`k3+` carries verl's k3 clamp (see `k3`)",
        "tests": [_VERL],
    },
    {
        "name": "`grpo_batch_std` (advantage)",
        "trl": "`scale_rewards=batch`: `(R - mean_g R) / (std_batch R + 1e-4)`, unbiased std",
        "verl": "none",
        "tepo": "`advantage: grpo_batch_std`: the same with `eps` 1e-6 (as `grpo`)",
        "agree": "`advantage_options.eps: 1e-4`",
        "differences": "the constant: default results differ by `(std + 1e-4) / (std + 1e-6)` (asserted); TRL's "
        "`nanstd` takes Bessel's `n / (n - 1)` in float32 even for float64 rewards: its std is relative < 4e-8 off "
        "(asserted at float64, TRL's scaling fed float64 rewards)",
        "tests": [f"{_TRL_KL}::test_grpo_batch_std_equals_trls_batch_scaled_advantage"],
    },
    {
        "name": "`maxrl` (advantage)",
        "trl": "none",
        "verl": "none",
        "tepo": "`advantage: maxrl`: `(R - mean_g R) / (mean_g R + 1e-6)`, 0 when the mean is 0",
        "agree": "no framework ships it: closed-form tests only",
        "differences": "refuses negative rewards",
        "tests": ["tests/advantages/test_advantages_group_baselines.py::test_maxrl_hand_values"],
    },
    {
        "name": "`opo` (advantage)",
        "trl": "none",
        "verl": "`adv_estimator: opo`: `R - sum_j L_j R_j / sum_j L_j` per `index` group",
        "tepo": "`advantage: opo`: the same over contiguous groups, `L_j = sum_t mask`",
        "agree": "the G responses of a prompt in contiguous rows (tepo's batch layout), G >= 2",
        "differences": "G = 1: verl A = R, tepo 0; a group of empty responses: verl NaN, tepo the plain mean",
        "tests": [
            _VERL,
            "tests/advantages/test_advantages_group_baselines.py::test_opo_zero_groups_and_empty_responses",
        ],
    },
    {
        "name": "`seq_k3` (rollout rejection)",
        "trl": "none",
        "verl": "`rollout_rs: seq_mean_k3` (preset `decoupled_k3_rs`, threshold 0.01)",
        "tepo": "`rollout_correction: seq_k3`, `threshold` 0.01: drop a row whose mean k3 of `old - rollout_logp` "
        "exceeds it",
        "agree": "the same threshold; verl decoupled mode (tepo compares the sampler with pi_old once per batch)",
        "differences": "verl's mean divides by `count + 1e-8` (a row at the threshold can fall differently); "
        "verl's bypass mode (against the current policy, per micro-batch) has no tepo equal",
        "tests": [
            _VERL,
            "tests/losses/test_correction_rejections.py::test_seq_k3_drops_rows_by_their_mean_token_k3",
        ],
    },
    {
        "name": "`seq_mask` (rollout rejection)",
        "trl": "none",
        "verl": "`rollout_rs: seq_mean_k1` (preset `decoupled_geo_rs`, `0.999_1.001`): keep a row when "
        "`log lower <= mean_t(-log rho) <= log upper` (`log rho` clamped to +-20)",
        "tepo": "`rollout_correction: seq_mask`: keep a row when `c_low <= exp(mean_t log rho) <= c_high` (`log rho` "
        'clamped to +-20); `verl_threshold: "lower_upper"` takes verl\'s string',
        "agree": "`c_low = 1/upper`, `c_high = 1/lower` (what `verl_threshold` does); the default (1/1.001, "
        "1/0.999) is verl's preset mapped; decoupled mode",
        "differences": "the same numbers keep mirror-image rows: on mean log-ratios -0.0010003, -0.0009998, "
        "+0.0009998, +0.0010003, `c_low/c_high` 0.999/1.001 keep [T, T, F, F], verl's `0.999_1.001` [F, F, T, T] "
        "(asserted); verl's mean divides by `count + 1e-8`",
        "tests": [
            "tests/integrations/test_integration_verl_rollout_rs.py::test_seq_mask_and_mis_keep_what_verls_k1_rejection_keeps",
            "tests/losses/test_correction_verl_threshold.py::test_the_same_numbers_keep_mirror_image_rows_and_verl_threshold_maps_them",
        ],
    },
    {
        "name": "`seq_max_k2` (rollout rejection)",
        "trl": "none",
        "verl": "`rollout_rs: seq_max_k2` (no preset; its docs' example 2.5)",
        "tepo": "`rollout_correction: seq_max_k2`, `threshold` 2.5: drop a row with any token's "
        "`(log rho)^2 / 2` above it",
        "agree": "the same threshold",
        "differences": "none (both clamp `log rho` to [-20, 20])",
        "tests": [
            _VERL,
            "tests/losses/test_correction_rejections.py::test_seq_max_k2_vetoes_a_row_for_one_far_token",
        ],
    },
    {
        "name": "`normalize: true` (IS weights)",
        "trl": "none",
        "verl": "`rollout_is_batch_normalize: true`: token IS over valid tokens, sequence IS over sequences",
        "tepo": "`rollout_correction_options.normalize: true` for `tis`, `mis`, `seq_tis`, over the step's batch",
        "agree": "`tis` = `rollout_is=token`, `seq_tis` = `rollout_is=sequence`, `cap` = `rollout_is_threshold`",
        "differences": "verl's `+ 1e-8` in its means (relative 1e-8 / count); verl's IcePop weights average over "
        "every valid token, tepo's `mis` over the kept ones: verl = tepo * valid / kept (asserted)",
        "tests": [
            _VERL,
            "tests/losses/test_correction_rejections.py::test_seq_tis_normalize_averages_one_weight_per_sequence_not_per_token",
        ],
    },
    # TRL's GRPOConfig through TepoGRPOTrainer(loss_name=None) (issue #25 item 3): tests/integrations/test_integration_trl_config.py
    {
        "name": "`grpo`, `dapo`, `dr_grpo` (TRL `GRPOConfig`)",
        "trl": "`loss_type` `grpo` / `dapo`, `bnpo` / `dr_grpo` (or `luspo`) at `importance_sampling_level=token`",
        "verl": "not compared in this row",
        "tepo": "`TepoGRPOTrainer(loss_name=None)`: `grpo` / `dapo` / `dr_grpo` (`luspo`: `grpo` with "
        "`agg=seq-mean-token-sum`)",
        "agree": "`eps_low = epsilon`, `eps_high = epsilon_high` (or `epsilon`), `max_len = max_completion_length`",
        "differences": "`bnpo` divides each micro-batch by its own token count, the adapter by the optimizer "
        "window's (equal with one micro-batch per window); TRL's `dapo` count is the window's expected one",
        "tests": [f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls"],
    },
    {
        "name": "`gspo`, `tepo`, `luspo` (TRL `GRPOConfig`)",
        "trl": "`importance_sampling_level=sequence` with `loss_type` `grpo` / `dapo`, `bnpo`, `dr_grpo` / `luspo`",
        "verl": "not compared in this row",
        "tepo": "`gspo` / `tepo` (`dr_grpo`: `tepo` with `agg=seq-mean-token-sum-norm`) / `luspo`",
        "agree": "eps as above; no KL bias correction with `beta > 0` (TRL weights k3 by the sequence ratio: "
        "refused, see `k3_unbiased`)",
        "differences": "none on a micro-batch at float64; TRL warns that this length-weights each sequence: for "
        "`tepo` that is the method (docs/integrations.md)",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_tepo_explains_trls_length_weighting_warning",
        ],
    },
    {
        "name": "`cispo`, `cispo_seq` (TRL `GRPOConfig`)",
        "trl": "`loss_type=cispo`: `-sg[clamp(r, max=epsilon_high)] * A * logp`, no lower clip, token-mean",
        "verl": "not compared in this row",
        "tepo": "`cispo`: `-sg[min(r, cap)] * A * logp` (`cap` in place of `1 + eps_high`, any `cap > 0`); "
        "sequence level: `cispo_seq`, the same weight of `s_i = exp(mean_t log r)`",
        "agree": "`cap = epsilon_high` (TRL's ceiling itself: 0.2, its `epsilon`, when unset; 5.0 recommended), "
        "`importance_sampling_level=sequence` = `cispo_seq`",
        "differences": "none at float64 (token and sequence level, caps 1.2, 1.025 and 0.2 asserted); TRL warns "
        "that the sequence level length-weights each sequence (token-mean): `cispo_seq` does the same",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_trls_cispo_cases_are_not_vacuous",
            "tests/losses/test_losses_cispo.py::test_cispo_weight_is_the_clipped_token_ratio_under_any_cap",
            "tests/losses/test_losses_cispo.py::test_cispo_seq_weights_every_token_by_the_clipped_sequence_ratio",
        ],
    },
    {
        "name": "`sapo` (TRL `GRPOConfig`)",
        "trl": "`loss_type=sapo`, `sapo_temperature_pos` / `_neg` (1.0 / 1.05), seq-mean-token-mean",
        "verl": "not compared in this row",
        "tepo": "`sapo`, `tau_pos` / `tau_neg`",
        "agree": "`tau_* = sapo_temperature_*`; token level only (sequence-level SAPO refused)",
        "differences": "TRL builds the temperatures in float32: its 1.05 is float32(1.05); equal at float64 "
        "with that value, relative 5e-7 apart with 1.05 (asserted)",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_sapo_default_differs_only_by_trls_float32_temperature",
        ],
    },
    {
        "name": "`vespo` (TRL `GRPOConfig`)",
        "trl": "`loss_type=vespo`, `vespo_k_*` / `vespo_lambda_*`, token-mean",
        "verl": "not compared in this row",
        "tepo": "`vespo`, `k_*` / `lam_*`",
        "agree": "the same four parameters; no vLLM IS correction",
        "differences": "TRL also clamps each token's log-ratio to +-20 (equal inside); TRL clamps lambda to at "
        "least 1e-4 (tepo takes lambda as given and refuses lam <= 0: below 1e-4 the two differ, asserted) and builds k, lambda in float32 (equal for values exact in "
        "float32, e.g. the defaults); TRL turns a NaN/inf weight into 0; TRL picks (k, lambda) by each element's "
        "advantage sign, tepo by the row's mean advantage (equal for TRL's per-sequence advantages); with vLLM's "
        "correction TRL folds the sampler ratio into the weight: refused",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_vespo_with_vllms_correction_is_refused",
            f"{_TRL_CFG}::test_vespo_lambda_below_trls_floor_is_where_the_two_differ",
        ],
    },
    {
        "name": "`dual_clip` (option)",
        "trl": "`delta`: `clamp(r, max=delta)` on the unclipped term inside the PPO min",
        "verl": "`clip_ratio_c` (on at 3.0 in `vanilla`); not compared in this row",
        "tepo": "`dual_clip=c` on `grpo` / `dapo` / `dr_grpo`: `min(-c*A, max(-r*A, -clip(r)*A))` where A < 0",
        "agree": "`dual_clip = delta`, `delta > 1 + eps_high`",
        "differences": "`delta <= 1 + eps_high` also caps A > 0 ratios below the clip range: refused; TRL "
        "ignores `delta` for cispo/sapo/vespo: refused",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_each_trl_option_changes_the_loss",
            f"{_TRL_CFG}::test_refuses_what_has_no_equal",
        ],
    },
    {
        "name": "`off_policy_mask` (option)",
        "trl": "`off_policy_mask_threshold`: drop a sequence with A < 0 whose mean `sampling - logp` exceeds it",
        "verl": "not compared in this row",
        "tepo": "`off_policy_mask=delta`, behaviour = `rollout_logp` (TRL's `sampling_per_token_logps`) or pi_old",
        "agree": "as is, with and without TRL's sampling log-probs",
        "differences": "a token vLLM could not score (NaN): TRL counts zero drift, the adapter pi_old's drift "
        "(equal to TRL given pi_old there, asserted)",
        "tests": [
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
            f"{_TRL_CFG}::test_off_policy_mask_reads_trls_sampling_logps",
        ],
    },
    {
        "name": "`top_entropy_quantile` (option)",
        "trl": "`top_entropy_quantile`: keep tokens with H >= the float32 quantile of the micro-batch's entropies "
        "over all processes",
        "verl": "none",
        "tepo": "`top_entropy_quantile=rho`: the same rule; tepo's trainer over the optimizer mini-batch, the "
        "adapter per micro-batch as TRL",
        "agree": "one micro-batch per optimizer mini-batch; the TRL adapter calls TRL's `get_high_entropy_mask` "
        "itself (the selection of any micro-batch)",
        "differences": "tepo's quantile is a float64 sort, TRL's `torch.quantile` of float32 entropies: the "
        "thresholds are within 4 float32 ulps of max H (about 2.4e-7 relative, asserted) and the kept sets differ "
        "only on a token between them: when the quantile is a token's own entropy, TRL drops it if float32 rounds "
        "it up, or also keeps a token just below (both built, asserted); tepo's trainer takes the quantile over the "
        "mini-batch (micro-batch invariant)",
        "tests": [
            "tests/integrations/test_parity_trl_entropy.py::test_tepo_entropy_threshold_keeps_what_trls_get_high_entropy_mask_keeps",
            "tests/integrations/test_parity_trl_entropy.py::test_the_float32_quantile_differs_only_by_rounding",
            "tests/integrations/test_parity_trl_entropy.py::test_tepo_top_entropy_quantile_loss_equals_trls_compute_loss",
            f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls",
        ],
    },
    {
        "name": "`entropy_coef` (regularizer)",
        "trl": "`entropy_coef`: `-coef * sum(m*H) / sum(m)` per micro-batch, / GA, whatever the loss type",
        "verl": "not compared in this row",
        "tepo": "`entropy_coef` option: `-coef * agg(H)` under the loss's aggregation",
        "agree": "the adapter applies TRL's `GRPOConfig.entropy_coef` with TRL's normalisation, and "
        "`use_adaptive_entropy` with TRL's controller",
        "differences": "equal under token-mean (tepo's option vs TRL's `_compute_loss` with `dapo`, value and "
        "gradients, asserted); the option differs for non-token-mean losses: `dr_grpo` gives `sum(m) / (N * L_max)` "
        "of TRL's (0.5x on the test batch, asserted); TRL's bonus acts only on the tokens its entropy quantile "
        "keeps, tepo's option on every token",
        "tests": [
            "tests/integrations/test_parity_trl_entropy.py::test_tepo_entropy_coef_under_token_mean_equals_trls_bonus",
            f"{_TRL_CFG}::test_trl_entropy_coef_is_a_token_mean_not_the_losss_aggregation",
            f"{_TRL_CFG}::test_trl_adaptive_entropy_controller_equals_trls",
        ],
    },
    {
        "name": "TRL's metrics (`kl`, `entropy`, `clip_ratio/*`, `cispo_clip_ratio`, `policy_loss`)",
        "trl": "logged by `_compute_loss` (token means over all processes; one value per sequence for a "
        "sequence ratio)",
        "verl": "none",
        "tepo": "the adapter logs the same names with TRL's meaning beside `tepo/*` (recomputed in "
        "`tepo.integrations.trl_metrics`: TRL has no callable piece for them, they are inline in `_compute_loss`)",
        "agree": "as is: every name and value TRL's real `_compute_loss` logs on the test batch is logged equal",
        "differences": "TRL averages its clip indicators in float32 (relative 1e-7)",
        "tests": [f"{_TRL_CFG}::test_trl_config_maps_to_a_registry_loss_equal_to_trls"],
    },
    {
        "name": "`sapo` (verl)",
        "trl": "see the TRL `GRPOConfig` row",
        "verl": "`sapo`: `-(4/tau) sigmoid(tau (r - 1)) * A`, `actor.tau_pos` / `tau_neg` (1.0 / 1.05), always "
        "seq-mean-token-mean",
        "tepo": "`tepo.sapo` (bare `sapo` stays verl's), `tau_pos` / `tau_neg` (1.0 / 1.05)",
        "agree": "as is (the defaults are equal); `tau_* = actor.tau_*`",
        "differences": "verl ignores `loss_agg_mode` (tepo's `agg` is honoured); verl's row mean divides by "
        "`count + 1e-8` (relative 1e-8); verl clamps the log-ratio to +-20",
        "tests": [_VERL26],
    },
    {
        "name": "`dppo_tv`, `dppo_kl` (verl)",
        "trl": "none",
        "verl": "`dppo_tv` / `dppo_kl`: `-A * sg[min(r, C)] * M * logp`, thresholds `clip_ratio_low` / `_high` "
        "(0.2), `C = clip_ratio_c` (3.0)",
        "tepo": "`tepo.dppo_tv` / `tepo.dppo_kl`: `-M * r * A`, `delta_low` / `delta_high` 0.15, `delta` 0.05",
        "agree": "gradient: `clip_ratio_low/high = delta_low/high` (`= delta`), `clip_ratio_c` above every ratio",
        "differences": "values: tepo `sum g`, verl `sum g * logp` (g the shared gradient); verl's default C = 3 "
        "scales the gradient by `3 / r` where r > 3; verl's default thresholds 0.2 (asserted); verl's mask reads "
        "pi_old, tepo's `rollout_logp` when given; verl clamps the log-ratio to +-20 (ratios beyond `e^20` differ)",
        "tests": [_VERL26],
    },
    {
        "name": "`gspo_token` (verl `gspo`)",
        "trl": "experimental `gspo_token`; not compared in this row",
        "verl": "`gspo`: ratio `sg[s_i] * pi / sg[pi]` with token advantages, `actor.loss_agg_mode` as given",
        "tepo": "`gspo_token`: the same ratio, eps 3e-4 / 4e-4, seq-mean-token-mean",
        "agree": "`clip_ratio_low=3e-4`, `clip_ratio_high=4e-4`, `loss_agg_mode=seq-mean-token-mean` (or "
        "token-mean on both)",
        "differences": "verl 0.9.1 does not force the paper's aggregation (its default is token-mean); verl "
        "clamps the token's `log s` at 10 (`clamp(max=10)`), which also zeroes its gradient there: value and "
        "gradient differ for ratios above `e^10` (asserted: a row with log s = 12 and A < 0 has no gradient in verl, one in tepo); seq-mean's `+ 1e-8` (relative 1e-8)",
        "tests": [_VERL26],
    },
    {
        "name": "`dual_clip` (verl `vanilla`)",
        "trl": "see the `dual_clip` (option) row",
        "verl": "`vanilla` with `clip_ratio_c` (3.0 by default, on)",
        "tepo": "`grpo` / `dapo` with `dual_clip=3`, `agg: token-mean`",
        "agree": "`dual_clip = clip_ratio_c`, `eps_low/high = clip_ratio_low/high`",
        "differences": "tepo's `grpo` / `dapo` without `dual_clip` differ from verl's default `vanilla` on exactly "
        "the tokens with A < 0 and r > 3 (asserted)",
        "tests": [_VERL26],
    },
    {
        "name": "`cispo` (verl)",
        "trl": "see the TRL `GRPOConfig` row",
        "verl": "`cispo`: `-sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * logp` (0.2 / 0.2)",
        "tepo": "`tepo.cispo` (bare `cispo` stays verl's): no lower clip by default; `eps_low` set clips below",
        "agree": "`eps_low = clip_ratio_low`, `eps_high = clip_ratio_high`; tepo's default = verl "
        "`clip_ratio_low=1.0` and `clip_ratio_high=0.28` (verl's default is 0.2)",
        "differences": "the default lower clip (verl clips at 0.8, MiniMax / TRL / tepo do not) and upper clip "
        "(verl 0.2, tepo 0.28); verl clamps the log-ratio to +-20 (ratios beyond `e^20` differ)",
        "tests": [_VERL26],
    },
    # verl 0.9.1's own functions, continued: tests/integrations/test_integration_verl_parity_more.py
    {
        "name": "`grpo`, `dapo`, `dr_grpo` (verl `vanilla`)",
        "trl": "see the TRL `GRPOConfig` row",
        "verl": "`vanilla` with `loss_agg_mode` `seq-mean-token-mean` / `token-mean` / `seq-mean-token-sum-norm`",
        "tepo": "`grpo` (eps 0.2, seq-mean-token-mean) / `dapo` (0.2 / 0.28, token-mean) / `dr_grpo` (0.2, "
        "`sum / (N * max_len)`)",
        "agree": "`clip_ratio_c` above every ratio (1e9: dual clip off), `clip_ratio_low/high = eps_low/high`, "
        "`loss_scale_factor = max_len` (both default to the padded width), `global_batch_size` = N",
        "differences": "verl's default `clip_ratio_c` 3.0 (see `dual_clip`); without `global_batch_size` verl's "
        "seq-mean divides by the non-empty rows, tepo by N (asserted); seq-mean-token-mean's `+ 1e-8`",
        "tests": [f"{_MORE}::test_grpo_dapo_dr_grpo_equal_verl_vanilla_without_dual_clip"],
    },
    {
        "name": "`clip_cov` (verl)",
        "trl": "none",
        "verl": "`clip_cov`: zeroes (`* 0`) a random `clip_cov_ratio` share of the unclipped tokens with cov in "
        "(lb, ub), `torch.randperm` on torch's global generator",
        "tepo": "`clip_cov`: detaches the same share (value kept, zero gradient), `seed` / `generator` for the draw",
        "agree": "gradient: `torch.manual_seed(s)` before verl's call and `seed=s` (the same draw over the same "
        "candidates); or `clip_cov_ratio` 1.0 (every candidate, no draw)",
        "differences": "values: verl's loss is tepo's minus the picked tokens' terms / T_tot (asserted); verl's "
        "band is open, tepo's closed",
        "tests": [f"{_MORE}::test_clip_cov_and_kl_cov_equal_verls"],
    },
    {
        "name": "`kl_cov` (verl)",
        "trl": "none",
        "verl": "`kl_cov`: `-r A + ppo_kl_coef * abs(log r)` on the top `kl_cov_ratio` tokens by cov; configured "
        "defaults 2e-4 / 0.1",
        "tepo": "`kl_cov`: the same, `kl_cov_ratio` / `kl_cov_coef` 2e-4 / 1.0 (the paper's beta)",
        "agree": "`kl_cov_coef = ppo_kl_coef`, `kl_cov_ratio` as is",
        "differences": "the default coefficient: verl's `PolicyLossConfig.ppo_kl_coef` is 0.1 (its function's "
        "fallback 1.0 is never reached): verl's default = tepo `kl_cov_coef=0.1` (asserted)",
        "tests": [f"{_MORE}::test_clip_cov_and_kl_cov_equal_verls"],
    },
    {
        "name": "`gmpo` (verl `geo_mean`)",
        "trl": "none",
        "verl": "`geo_mean`: `-A_i exp(mean_t sgn(A) min(sgn(A) d, sgn(A) clamp(d)))`, log-space bounds "
        "`clip_ratio_low/high` (0.2), mean over rows",
        "tepo": "`gmpo`: the same, log-space `eps_low/high` 0.4 (the paper's), seq-mean-token-mean",
        "agree": "`clip_ratio_low/high = eps_low/high`; sequence advantages (or one sign per row)",
        "differences": "verl's default bounds 0.2; token advantages of mixed sign in a row: verl clips each token "
        "by its own sign, tepo by the row mean's (asserted to differ); `+ 1e-8` in verl's means",
        "tests": [f"{_MORE}::test_gmpo_equals_verl_geo_mean"],
    },
    {
        "name": "`grpo`, `dr_grpo`, `rloo` (advantage)",
        "trl": "not compared in this row",
        "verl": "`adv_estimator: grpo` (`norm_adv_by_std_in_grpo`), `rloo`, `grpo_vectorized`, `rloo_vectorized`",
        "tepo": "`advantage: grpo` (unbiased std, eps 1e-6) / `dr_grpo` / `rloo`",
        "agree": "`grpo` = verl `grpo`; `dr_grpo` = verl `grpo` with `norm_adv_by_std_in_grpo=False`; the G "
        "responses of a prompt in contiguous rows",
        "differences": "G = 1: verl's `grpo` gives `R / (1 + 1e-6)` (float32 sum), its `rloo` `R`, tepo 0 (asserted; verl's "
        "`rloo_vectorized` 0 too); `grpo_vectorized` computes the group statistics in float32 (equal to 1e-6)",
        "tests": [f"{_MORE}::test_advantage_estimators_equal_verls"],
    },
    {
        "name": "`tis`, `seq_tis`, `mis` (rollout IS weights)",
        "trl": "not compared in this row",
        "verl": "`rollout_is: token` / `sequence`, `rollout_is_threshold: C`; IcePop `lo_hi`; "
        "`rollout_rs: token_k1`",
        "tepo": "`rollout_correction: tis` / `seq_tis` (`cap`), `mis` (`c_low`, `c_high`)",
        "agree": "`cap = rollout_is_threshold`; `mis` weights = IcePop `c_low_c_high`, its kept tokens = "
        "`token_k1` with `1/c_high_1/c_low` (`verl_threshold` takes `token_k1`'s string and maps it)",
        "differences": "verl's k1 is `-log rho`: the same `token_k1` string keeps `1/c_high <= rho <= 1/c_low` "
        "(asserted); verl clamps `log rho` (token) or its row sum (sequence) at -20: weights below `exp(-20)` "
        "differ (asserted)",
        "tests": [
            f"{_MORE}::test_tis_seq_tis_mis_equal_verls_rollout_is_weights",
            "tests/integrations/test_integration_verl_rollout_rs.py::test_seq_mask_and_mis_keep_what_verls_k1_rejection_keeps",
        ],
    },
    # Names no framework ships: closed-form tests only (tests/integrations/test_parity_doc.py wants a row for every name)
    {
        "name": "`tepo_token`, `reinforce_is`, `prefix_is`, `cov_gauss` (TEPO / 2026 losses)",
        "trl": "none (TRL's experimental `gspo_token` is `gspo_token`'s row)",
        "verl": "none",
        "tepo": "`tepo_token` (TEPO's ratio with token advantages), `reinforce_is`, `prefix_is` (TEPO 4.3.2), "
        "`cov_gauss` (Gaussian covariance weight): docs/algorithms.md",
        "agree": "no framework ships them: closed-form tests only",
        "differences": "none to compare",
        "tests": [
            "tests/losses/test_losses_objectives.py::test_tepo_token_with_token_level_advantages",
            "tests/losses/test_losses.py::test_reinforce_is_detached_sequence_weight",
            "tests/losses/test_losses.py::test_prefix_is_running_mean_ratio",
            "tests/losses/test_losses.py::test_cov_gauss_gaussian_weights",
        ],
    },
    {
        "name": "`entropy_adv`, `erpo` (advantage)",
        "trl": _TRL_TOKEN_LEVEL,
        "verl": _VERL_TOKEN_LEVEL.format(
            names="`tepo.entropy_adv`, `tepo.erpo`", ref="erpo (its default `progress_baseline: ref`)"
        ),
        "tepo": "`advantage: entropy_adv` (Cheng et al.), `erpo` (our reading of 2603.28204): docs/algorithms.md; "
        + _TEPO_TOKEN_LEVEL,
        "agree": "no framework ships them: closed-form tests; in TRL and verl the adapters' `[B, T]` advantages "
        "equal `compute_advantages` on the same inputs (TRL: 1 and 2 processes; verl: its own advantage step)",
        "differences": "none to compare",
        "tests": [
            "tests/advantages/test_advantages.py::test_entropy_adv_hand_values_with_nan_padding",
            "tests/advantages/test_advantages.py::test_erpo_relu_gate_hand_values",
            *_TRL_TOKEN_TESTS,
            _VERL_ADV,
            _VERL_ADV_BRIDGE,
        ],
    },
    {
        "name": "`ep_grpo` (advantage)",
        "trl": _TRL_TOKEN_LEVEL,
        "verl": _VERL_TOKEN_LEVEL.format(names="`tepo.ep_grpo`", ref="ep_grpo"),
        "tepo": "`advantage: ep_grpo` (our reading of EP-GRPO 2605.04960, fixed in ALGORITHMS.md): "
        "docs/algorithms.md#ep_grpo; " + _TEPO_TOKEN_LEVEL,
        "agree": "no framework ships it (the authors' code is not public): closed-form tests; in TRL and verl the "
        "adapters' `[B, T]` advantages equal `compute_advantages` on the same inputs",
        "differences": "none to compare",
        "tests": [
            "tests/advantages/test_advantages_ep_grpo.py::test_entropy_gate_hand_values",
            "tests/advantages/test_advantages_ep_grpo.py::test_buckets_follow_the_entropy_before_each_token",
            "tests/training/test_train_e2e.py::"
            "test_ep_grpo_gives_all_equal_groups_a_gradient_after_the_first_update_and_pass_at_k_is_scored",
            *_TRL_TOKEN_TESTS,
            _VERL_ADV,
        ],
    },
    {
        "name": "`reinforce_plus_plus`, `reinforce_plus_plus_baseline` (advantage)",
        "trl": "none",
        "verl": "`adv_estimator: reinforce_plus_plus` (discounted return, `gamma`), `..._baseline` (minus group mean); both `masked_whiten` over the batch's tokens",
        "tepo": "`advantage: reinforce_plus_plus` (token-level, option `gamma`), `reinforce_plus_plus_baseline`",
        "agree": "the same `gamma`; contiguous groups, G >= 2 for the baseline form",
        "differences": "G = 1: verl baseline 0, tepo refuses (group-relative)",
        "tests": [
            _T39,
            "tests/advantages/test_advantages_frameworks.py::test_reinforce_plus_plus_whitens_returns_over_tokens",
        ],
    },
    {
        "name": "`grpo_passk`, `gpg` (advantage)",
        "trl": "none",
        "verl": "`adv_estimator: grpo_passk` (best response gets `(r_max - r_2nd) / (std + eps)`), `gpg` (`alpha (R - mean)`)",
        "tepo": "`advantage: grpo_passk` (option `norm_by_std`), `gpg` (option `f_norm`)",
        "agree": "`norm_by_std` = `norm_adv_by_std_in_grpo`; contiguous groups",
        "differences": "gpg: verl's `alpha` is float32 (relative 1.5e-8), tepo's float64",
        "tests": [
            _T39,
            "tests/advantages/test_advantages_frameworks.py::test_grpo_passk_only_the_best_learns",
        ],
    },
    {
        "name": "`optimal_token_baseline`, `tir_optimal_token_baseline` (advantage)",
        "trl": "none",
        "verl": "`adv_estimator: optimal_token_baseline` / `tir_...`: `B_t = sum G W / sum W` per group, `W` cumulative `1 - 2 pi + sum pi^2`",
        "tepo": "the same names; `sum_pi_squared` from the trainer's pre-update pass",
        "agree": "`rollout_is_weights=None`; `handle_zero_tail` the same",
        "differences": "verl scales `W` by squared rollout IS weights when given; tepo passes none",
        "tests": [
            _T39,
            "tests/advantages/test_advantages_frameworks.py::test_optimal_token_baseline_by_hand",
        ],
    },
    {
        "name": "`gdpo` (advantage)",
        "trl": '`multi_objective_aggregation="normalize_then_sum"`: `(r_k - mean_g) / (std_g + 1e-4)`, `sum_k w_k`, then `(x - mean) / (std + 1e-4)` over responses (inline in `_generate_and_score_completions`: no callable piece)',
        "verl": "`adv_estimator: gdpo` (`gdpo_reward_keys`, `gdpo_reward_weights`): GRPO per reward, `sum_k w_k`, `masked_whiten` over the batch's tokens",
        "tepo": "`advantage: gdpo` over `reward.functions` (`[N, K]` columns, their weights); options `eps`, `norm_by_std`, `batch_norm` (`token` verl, `sequence` TRL/paper, `none`)",
        "agree": "verl: defaults (float64 one-reward path 1e-12; two-reward path at float32); TRL: `eps=1e-4, batch_norm=sequence` (its formula by value)",
        "differences": "verl computes the multi-reward path in float32 (casts the columns and weights); an all-equal group of one reward is exactly 0 in tepo (verl: float residue / (std + eps)); fewer than two reward functions refused by config",
        "tests": [
            "tests/integrations/test_integration_verl_gdpo.py::test_verl_gdpo_equals_ours",
            "tests/training/test_gdpo.py::test_trl_normalize_then_sum_formula",
            "tests/training/test_gdpo.py::test_each_reward_is_normalised_in_its_group_before_the_weighted_sum",
        ],
    },
    {
        "name": "`remax` (advantage)",
        "trl": "none",
        "verl": "`adv_estimator: remax`: reward minus a greedy rollout's reward per prompt",
        "tepo": "refused with one line (no greedy baseline rollout in tepo's trainer)",
        "agree": "not offered",
        "differences": "use `rloo` or `grpo`",
        "tests": ["tests/advantages/test_advantages_frameworks.py::test_remax_refused_by_config_in_one_line"],
    },
    {
        "name": "`gpg`, `dro` (policy loss)",
        "trl": "none",
        "verl": "`loss_mode: gpg` (`-A logp`), `dro` (`-(A logp - beta/2 (logp - old)^2)`, `dro_beta`)",
        "tepo": "`loss: gpg`, `loss: dro` (option `beta`)",
        "agree": "token-mean, `beta` = `dro_beta`, the global token count",
        "differences": "dro: verl has no default `dro_beta`; tepo's default 0.1 is ours",
        "tests": [
            _T39,
            "tests/losses/test_losses_objectives.py::test_gpg_and_dro_value_and_gradient_by_hand",
        ],
    },
    {
        "name": "`bypass_mode` (policy loss)",
        "trl": "none",
        "verl": "`loss_mode: bypass_mode`: old = rollout log-probs; `ppo_clip` (vanilla) or `reinforce` with IS weights",
        "tepo": "not a loss name: `algorithm.rollout_correction` weights `pi_old / pi_rollout` with the old policy recomputed",
        "agree": "on-policy with equal numerics `ppo_clip` bypass = `grpo`; `reinforce` = `gpg` x IS weights with old = rollout",
        "differences": "tepo has no switch that clips against the sampler's log-probs (tepo.losses.plain_gradient.BYPASS_MODE)",
        "tests": ["tests/losses/test_losses_objectives.py::test_gpg_and_dro_value_and_gradient_by_hand"],
    },
    # The objectives of open pull requests: no released TRL or verl has them; each row names the PR and the head
    # commit whose code made the fixtures (tests/fixtures/open_prs/), so a user knows where a name may move when
    # upstream merges.
    {
        "name": "`up` (open PRs verl #7022, TRL #6579)",
        "trl": "none in 1.16. PR #6579 (`trl/experimental/up`, `UPTrainer`): its head is not in the snapshot read here (code read at `d8415581`): no log-ratio clamp, no dual clip, TRL's `delta`",
        "verl": "none in 0.9.1. PR #7022 head `0257b18e`: `loss_mode: up`, REINFORCE where A > 0, vanilla's clip and dual clip (`clip_ratio_c` 3.0) elsewhere, log-ratio clamped at +-20",
        "tepo": "`loss: up`: `-A exp(logp - sg[logp])` where A > 0, `max(-A min(r, delta), -A clip(r))` elsewhere (`dual_clip` None: the paper's), token-mean",
        "agree": "verl: `dual_clip: 3.0`, `eps = clip_ratio`, the same `loss_agg_mode` (`num_seqs` = non-empty rows for verl's local seq-mean); TRL: `dual_clip: null`, `log_ratio_clamp: null`, `delta` = TRL's `delta`",
        "differences": "verl's seq-mean-token-mean divides by `L_i + 1e-8` (<= 1e-9 abs on the fixtures); TRL #6579 not pinned by a fixture (its head is not available)",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_FORMS}::test_up_verl_dual_clip_three_caps_a_negative_token_past_three",
            f"{_OPEN_FORMS}::test_up_delta_binds_below_one_plus_eps_high_and_the_clamp_is_verls",
        ],
    },
    {
        "name": "`cppo` (open PR verl #6731)",
        "trl": "none",
        "verl": "none in 0.9.1. PR #6731 head `7528d2ef`: `loss_mode: cppo`, `-A sg[min(r, clip_ratio_c)] M logp`, M the position-weighted cumulative Binary-TV mask (`policy_loss.cppo.*`)",
        "tepo": "`loss: cppo`: the same mask M; value `-A r sg[min(r, C)/r] M` (gradient identical; `value_form: verl` gives verl's value)",
        "agree": "`delta = clip_ratio`, `tis_cap = clip_ratio_c` (verl's default 3.0; the recipe's 20 is tepo's default), `w_min`, `delta_b`, `delta_b_q`, `delta_b_k` = `cppo_*`, `value_form: verl`, fixed-width padding (`horizon` = the padded width)",
        "differences": "verl computes the position weights in float32 (a token within ~1e-7 of its threshold can fall differently); verl's engine path pads each micro-batch to its own width: set `horizon: max_response_length` for a fixed schedule",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_PR}::test_cppo_ratio_value_form_has_verls_gradient",
            f"{_OPEN_FORMS}::test_cppo_keeps_the_tokens_within_the_cumulative_budget",
        ],
    },
    {
        "name": "`topr` (open PR verl #6986)",
        "trl": "none",
        "verl": "none in 0.9.1. PR #6986 head `dbeb49b4`: `loss_mode: topr`, weight `clip(exp(mean_t log r), lower, upper)` on negative sequences, seq-mean-token-mean whatever `loss_agg_mode`",
        "tepo": "`loss: topr`: the paper's defaults, product ratio (`seq_ratio: sum`) and seq-mean-token-sum",
        "agree": "`seq_ratio: mean`, `agg: seq-mean-token-mean`, `lower`/`upper` = `topr_negative_ratio_lower/upper`, `num_seqs` = non-empty rows",
        "differences": "verl's seq-mean-token-mean divides by `L_i + 1e-8` (<= 1e-9 abs); the paper splits by reward sign, both codes by advantage sign",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_FORMS}::test_topr_tapers_the_negative_sequence_only",
        ],
    },
    {
        "name": "`stare` (open PR TRL #6167)",
        "trl": "none in 1.16. PR #6167 head `22337c61`: `loss_type=stare`, the top `ceil(p n)` surprisal tokens per advantage sign of the micro-batch reweighted while its mean entropy < target, bnpo aggregation",
        "verl": "none (the authors' `hp-luo/STARE` @ `bffb9e79` is a verl fork: dual clip 3, step-level entropy, `int(n p + 0.999999)` tokens)",
        "tepo": "`loss: stare` (`variant`, `p`, `W`, `M`, `H_tgt`, `delta`, `dual_clip`, `batch_entropy`, `k_rounding`); selection and gate over the optimizer mini-batch in tepo's trainer, over the call elsewhere",
        "agree": "TRL: the same `W, M, p, H_tgt, epsilon, delta`, beta 0, one micro-batch (`stare_*` = tepo's options); the authors: `dual_clip: 3.0`, `batch_entropy` = their step entropy, `k_rounding: authors`",
        "differences": "TRL's gate compares a float32 mean (a batch entropy within 1e-6 of `H_tgt` can fall differently); TRL's ties in surprisal go to `torch.topk`'s order, tepo's to the lower index; in TepoGRPOTrainer the sum is divided by the window's tokens (TRL's bnpo: each micro-batch by its own, / GA)",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_PR}::test_stare_token_weights_equal_trls",
            f"{_OPEN_PR}::test_stare_authors_reading_equals_their_code",
            f"{_OPEN_FORMS}::test_stare_authors_reading_dual_clip_three_and_their_rounding",
        ],
    },
    {
        "name": "`fipo` (open PR TRL #5434)",
        "trl": "none in 1.16. PR #5434 head `20463989`: `loss_type=fipo`, future-KL influence weights on the advantage, dual clip `fipo_clip_ratio_c`, rows with more than one dual-clipped token dropped, bnpo over the kept tokens",
        "verl": "none",
        "tepo": "`loss: fipo` (`clip_ratio_c`, `decay_rate`, `influence_clip`, `high_only`, `safety_threshold`); the kept-token count over the optimizer mini-batch in tepo's trainer, the call's share elsewhere",
        "agree": "`epsilon`/`epsilon_high` = `eps_low`/`eps_high`, `fipo_*` = the same options (`fipo_influence_clip_ratio` = `influence_clip`), beta 0, no vLLM IS, one micro-batch",
        "differences": "none on the fixtures (influence weights by recursion vs TRL's chunked matmul: ~1e-15); TRL divides each micro-batch by its own kept tokens and by GA",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_PR}::test_fipo_influence_weights_and_kept_rows_equal_trls",
            f"{_OPEN_FORMS}::test_fipo_drops_a_row_with_two_tokens_past_the_dual_clip_from_value_gradient_and_count",
        ],
    },
    {
        "name": "`dapo_zv` (open PR TRL #6365)",
        "trl": "none in 1.16. PR #6365 head `c17988de`: `loss_type=dapo_zv`, DAPO's sum over `num_items_in_batch_zv`, the tokens of rows whose group rewards are not all equal (within 1e-6)",
        "verl": "none",
        "tepo": "`loss: dapo_zv`: the same sum over the tokens of rows with a non-zero advantage (`tol` 1e-6), counted over the optimizer mini-batch in tepo's trainer",
        "agree": "`epsilon_high: 0.28`, beta 0, group advantages that are 0 exactly on all-equal groups (TRL's with 0/1 rewards; tepo's `grpo`)",
        "differences": "TRL tests the rewards, tepo the advantages: a non-zero-variance row whose advantage is exactly 0 (a reward equal to its group mean) counts in TRL only; TRL's count spans the generation batch, tepo's the optimizer mini-batch (in TepoGRPOTrainer, the micro-batch's share)",
        "tests": [
            f"{_OPEN_PR}::test_loss_gradient_and_metrics_equal_the_upstream_code",
            f"{_OPEN_PR}::test_dapo_zv_token_count_equals_trls",
            f"{_OPEN_FORMS}::test_dapo_zv_leaves_zero_variance_rows_out_of_the_count",
        ],
    },
    {
        "name": "`codapo` (advantage) (open PR verl #7497)",
        "trl": "none",
        "verl": "none in 0.9.1. PR #7497 head `cb85d41a`: `adv_estimator: codapo`, GRPO times `c_g 4 acc_g (1 - acc_g) + codapo_weight_offset`; CoDaSampling's focused second step in its trainer",
        "tepo": "`advantage: codapo` (`delta`, `eps`, `norm_by_std`, `correct_reward`); in verl as `tepo.codapo`; `focused_step: true` refused (no second rollout inside a step)",
        "agree": "`delta = codapo_weight_offset`, `norm_by_std = norm_adv_by_std_in_grpo`, verl's `acc` = the reward (0/1 verifier), the G responses of a prompt in contiguous rows",
        "differences": "verl reads correctness from the reward's `acc` field, tepo from the reward itself; an all-equal group is exactly 0 in tepo (verl: float residue / (std + eps)); CoDaSampling not offered",
        "tests": [
            f"{_OPEN_PR}::test_codapo_advantages_equal_verls",
            "tests/advantages/test_advantages_codapo.py::test_codasampling_is_refused_and_options_checked",
        ],
    },
]

INTRO = """\
# Parity: what each name computes in TRL, verl and tepo

One row per name that tepo shares with TRL (1.16) or verl (0.9.1). Each row names the test that feeds the same
tensors to the framework's own code and to tepo's, and asserts equality at float64 under the settings in the
"agree" column, or the documented difference. Generated from `tests/parity_rows.py`
(`python tests/parity_rows.py > docs/parity.md`); `tests/integrations/test_parity_doc.py` fails when this page is stale, when
a row names a test that does not exist, and when a registered loss, advantage estimator, KL estimator or rollout
correction has no row. Each test says whether it runs by default: TRL tests (and closed-form tests) run in the
default suite (TRL 1.16 is the `[trl]` extra); verl tests are opt-in, `pytest -m slow <file>`, and build
`.venv-verl` (verl 0.9.1 and its pins) on their first run, which needs a package index; a fresh checkout has
none, so without that run the verl rows are backed by tests that were skipped.

The rows marked "open PR" are objectives that no released TRL or verl has: they come from pull requests, and each
row names the PR and the head commit whose code computed the numbers the tests compare with
(`tests/fixtures/open_prs/`, float64, run outside the repository). If the PR changes before it merges, or merges
under another name or option set, those rows are where tepo may move.
"""


_KIND_MARKS = {"advantage": "(advantage)", "KL": "(KL)", "rollout correction": "(rollout"}


def covered(kind: str) -> set[str]:
    """The names of ``kind`` the page has a row for: the backticked words of each row's ``name`` cell, where the
    cell carries the kind's mark ("(advantage)", "(KL)", "(rollout ..."); a ``loss`` is any row without those
    marks. tests/integrations/test_parity_doc.py fails for a registered name of that kind missing here."""
    marks = _KIND_MARKS.values()
    names: set[str] = set()
    for row in ROWS:
        cell = row["name"]
        mark = _KIND_MARKS.get(kind)
        if (mark is not None and mark in cell) or (mark is None and not any(m in cell for m in marks)):
            names.update(re.findall(r"`([^`]+)`", cell))
    return names


_ROOT = Path(__file__).resolve().parents[1]


def runs_by_default(test: str) -> bool:
    """False for a test in a slow-marked file (opt-in, ``-m slow``), True otherwise."""
    source = (_ROOT / test.partition("::")[0]).read_text()
    return "pytestmark = pytest.mark.slow" not in source


def _tests_cell(tests: list[str]) -> str:
    return "<br>".join(
        f"`{test}` ({'default' if runs_by_default(test) else 'opt-in: -m slow, .venv-verl'})"
        for test in tests
    )


def _cell(value) -> str:
    if isinstance(value, list):
        value = _tests_cell(value)
    return str(value).replace("|", "\\|")


def render() -> str:
    """docs/parity.md's text."""
    lines = [INTRO, "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(_cell(row[field]) for field in FIELDS) + " |" for row in ROWS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
