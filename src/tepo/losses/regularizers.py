"""Regularizers composable with any policy loss (docs/algorithms.md#regularizers); each is off by default."""

from __future__ import annotations

import torch

from tepo.losses.aggregation import aggregate
from tepo.losses.inputs import LossInputs

# k1/k2/k3: Schulman's estimators. k3_unbiased: DeepSeek-V3.2's importance-corrected k3 (TRL
# use_bias_correction_kl). k1+/k2+/k3+: verl's straight-through forms (value of k*, gradient of k2).
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3", "k3_unbiased", "k1+", "k2+", "k3+")


def _schulman(diff: torch.Tensor, estimator: str) -> torch.Tensor:
    if estimator == "k1":
        return -diff
    if estimator == "k2":
        return 0.5 * diff**2
    return torch.exp(diff) - diff - 1.0


def kl_estimate(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    estimator: str,
    *,
    old_logp: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from log-probs of the sampled tokens (Schulman, 2020).

    With d = ref - logp: k1 = -d = logp - ref; k2 = d^2 / 2; k3 = exp(d) - d - 1 (>= 0; DeepSeekMath Eq. 4).

    ``k3_unbiased`` (DeepSeek-V3.2, arXiv 2512.02556, "unbiased KL estimate"): ``r * k3`` with
    ``r = exp(logp - old_logp)``, the importance ratio that corrects k3 for tokens sampled from pi_old rather
    than pi_theta. The gradient flows through ``r`` as well as through k3 (TRL ``use_bias_correction_kl``
    multiplies ``coef_1`` in without detaching it): d/dlogp = r * k3 + r * (1 - exp(d)). Needs ``old_logp``.
    TRL's ``coef_1`` is the sequence ratio under ``importance_sampling_level="sequence"``; ours is always the
    token ratio.

    ``k1+``, ``k2+``, ``k3+`` (verl ``kl_penalty`` with a ``+`` suffix): the value of k1/k2/k3 and the gradient
    of k2, ``k2 - sg[k2] + sg[k*]``, so d/dlogp = logp - ref whatever the value's estimator (k2's gradient is the
    unbiased one; Schulman 2020). ``k2+`` is k2. verl's k3 (also under ``k3+``) clamps d to [-20, 20] and k3
    to [-10, 10]; ours does not clamp, so the two agree wherever |ref - logp| <= 20 and k3 <= 10.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown kl_estimator {estimator!r}; expected one of: {', '.join(KL_ESTIMATORS)}")
    diff = ref_logp - logp
    if estimator == "k3_unbiased":
        if old_logp is None:
            raise ValueError("kl_estimator 'k3_unbiased' needs old_logp (its ratio r = exp(logp - old_logp))")
        return torch.exp(logp - old_logp) * _schulman(diff, "k3")
    if estimator.endswith("+"):
        value = _schulman(diff, estimator[:-1])
        k2 = _schulman(diff, "k2")
        return k2 - k2.detach() + value.detach()
    return _schulman(diff, estimator)


def entropy_term(inputs: LossInputs, agg: str) -> torch.Tensor:
    """agg(H): the mean entropy under the loss's aggregation (the loss adds ``-entropy_coef * agg(H)``).

    TEPO v1 Table 2 "w. Max-Entropy": maximising entropy, hence the minus sign in the minimised loss.
    """
    return aggregate(
        inputs.entropy,
        inputs.mask,
        agg,
        num_tokens=inputs.num_tokens,
        num_seqs=inputs.num_seqs,
        max_len=inputs.max_len,
    )


def kl_ref_term(inputs: LossInputs, agg: str, estimator: str) -> torch.Tensor:
    """agg(KL_est(pi_theta || pi_ref)) (the loss adds ``kl_coef`` times this; TEPO Table 2 "w. KL-Divergence")."""
    return aggregate(
        kl_estimate(inputs.logp, inputs.ref_logp, estimator, old_logp=inputs.old_logp),
        inputs.mask,
        agg,
        num_tokens=inputs.num_tokens,
        num_seqs=inputs.num_seqs,
        max_len=inputs.max_len,
    )


def tepo_kl_mask_set(inputs: LossInputs) -> torch.Tensor:
    """M = {(i,t) valid : A[i,t] > 0 and H[i,t] < H_old[i,t]} (positive advantage, falling entropy)."""
    return inputs.mask & (inputs.advantages > 0) & (inputs.entropy.detach() < inputs.old_entropy)


def tepo_kl_mask_term(inputs: LossInputs, estimator: str = "k3") -> tuple[torch.Tensor, torch.Tensor]:
    """TEPO v2 (arXiv 2604.12736) token-level KL mask: ``sum_{(i,t) in M} k(pi_theta || pi_old)[i,t] / T_tot``.

    ``k`` is ``estimator`` (:func:`kl_estimate`) with d = old - logp; the default k3 is exp(d) - d - 1. Only the
    v2 abstract is public ("a token-level KL-Divergence mask constraint that targets tokens with positive
    advantages and decreasing entropy"); the set M, the k3 estimator against pi_old and the division by the
    global token count T_tot (whatever the loss's own aggregation) are OUR reading. Returns (term, M).

    Why the estimator is an option: k3's gradient, d/dlogp = 1 - exp(d) = 1 - pi_old/pi_theta, is unbounded for a
    token in M whose probability the previous update cut (a token at pi_theta = pi_old / 1000 pulls with -999).
    M can hold such tokens from a rollout's second update on (on the first, pi_theta = pi_old and the term is 0).
    k2 (d^2 / 2, gradient logp - old) and the straight-through ``k3+`` (k3's value, k2's gradient) grow only
    linearly in d.
    """
    in_set = tepo_kl_mask_set(inputs)
    kl = kl_estimate(inputs.logp, inputs.old_logp, estimator, old_logp=inputs.old_logp)
    total = torch.where(in_set, kl, torch.zeros((), dtype=kl.dtype, device=kl.device)).sum()
    return total / inputs.num_tokens, in_set
