"""The verl (0.9.1) batch fields tepo reads besides verl's own, named in one place.

No verl import here, so that verl-free code (`tepo.integrations.verl_advantages`' bridge, its fast tests) can use
the names.
"""

# pi_old's per-token entropies [N, T] (what verl's legacy driver's _compute_old_log_prob returns as "entropys" and
# then pops), kept by `verl_workers.TepoRayPPOTrainer`; read by TEPO v2's KL mask and the token-level estimators.
OLD_ENTROPY_KEY = "old_entropys"
# verl's v1 driver keeps pi_old's entropies itself, as the per-response field "entropy".
V1_OLD_ENTROPY_KEY = "entropy"
# The sampler's per-token log-probs, in the batch when ``actor_rollout_ref.rollout.calculate_log_probs=True``
# (verl's rollout correction needs them too); our losses' ``rollout_logp``.
ROLLOUT_LOGP_KEY = "rollout_log_probs"
