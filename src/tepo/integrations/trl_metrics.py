"""TRL 1.16's own loss metrics, under TRL's names and with TRL's meaning, for `TepoGRPOTrainer`.

TRL's ``_compute_loss`` logs ``kl`` (beta > 0), ``entropy``, ``clip_ratio/{low_mean,high_mean,region_mean,
low_min,high_max}`` (its ratio-clipped losses), ``cispo_clip_ratio`` (cispo), ``vespo/phi_seq_mean`` (vespo) and,
with an entropy bonus, ``policy_loss`` and ``entropy_coef``. Dashboards and callbacks read those names, so the
adapter logs them beside its ``tepo/*`` metrics, computed as TRL computes them from the same tensors (tested
equal to TRL's logged values on the same batch):

- token means are over all processes' loss tokens (TRL's ``global_masked_mean``: sums and counts reduced
  jointly); a sequence-level ratio counts one value per sequence;
- ``clip_ratio/low_mean``: share with ratio < 1 - eps_low and A < 0; ``high_mean``: ratio > 1 + eps_high and
  A > 0; ``region_mean``: either; ``low_min`` / ``high_max``: the smallest / largest per-sequence share over all
  processes' sequences. The ratio is the token ratio for ``grpo``/``dapo``/``dr_grpo`` and the sequence ratio
  ``s_i`` for ``tepo``/``gspo``/``luspo``, with the loss's own eps;
- ``cispo_clip_ratio``: share with the ratio above cispo's ceiling (``cap``, else 1 + eps_high) and A > 0: the
  token ratio for ``cispo``, the sequence ratio (one value per sequence) for ``cispo_seq``;
- ``kl``: the token mean of the KL term's per-token estimate (k3, ``r * k3`` for k3_unbiased), before beta;
- ``policy_loss``: the loss without the entropy bonus, normalised as TRL's loss type normalises it (the
  per-micro-batch mean for TRL's grpo/sapo/bnpo/dr_grpo/luspo and any non-token-mean registry loss, i.e. the
  adapter's share times gradient accumulation; the window share for dapo/cispo/vespo and token-mean losses).

Masks are the adapter's loss mask (TRL's completion and tool masks, minus groups the DAPO filter dropped).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tepo.integrations.trl_config import LossPlan
from tepo.losses import kl_estimate

ReduceSum = Callable[[torch.Tensor], torch.Tensor]


def column(advantages: torch.Tensor) -> torch.Tensor:
    return advantages.unsqueeze(1) if advantages.dim() == 1 else advantages


def _nan_extreme(values: torch.Tensor, largest: bool) -> float:
    finite = values[~torch.isnan(values)]
    if finite.numel() == 0:
        return float("nan")
    return float(finite.max() if largest else finite.min())


class TrlMetrics:
    """TRL's metric values for one micro-batch; ``reduce_sum`` / ``gather`` are the accelerator's collectives."""

    def __init__(self, mask: torch.Tensor, reduce_sum: ReduceSum, gather: ReduceSum) -> None:
        self.mask = mask.bool()
        self.reduce_sum = reduce_sum
        self.gather = gather

    def global_mean(self, x: torch.Tensor) -> float:
        """TRL's ``global_masked_mean``: [N, 1] is one value per sequence, [N, T] a token mean over the mask."""
        x = x.detach().double()
        if x.shape[1] == 1:
            local = torch.stack([x.sum(), torch.tensor(float(x.shape[0]), dtype=x.dtype, device=x.device)])
        else:
            local = torch.stack([torch.where(self.mask, x, 0.0).sum(), self.mask.sum().to(x.dtype)])
        totals = self.reduce_sum(local)
        return float(totals[0] / totals[1].clamp(min=1.0))

    def seq_means(self, x: torch.Tensor) -> torch.Tensor:
        """TRL's ``masked_seq_mean`` (NaN for a sequence without loss tokens), gathered over processes."""
        x = x.detach().double()
        if x.shape[1] == 1:
            local = x.squeeze(1)
        else:
            local = torch.where(self.mask, x, 0.0).sum(-1) / self.mask.sum(-1).to(x.dtype)
        return self.gather(local)

    def clip_ratios(
        self, plan: LossPlan, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor
    ) -> dict[str, float]:
        log_ratio = (logp.detach() - old_logp).double()
        adv = column(advantages.detach())
        out: dict[str, float] = {}
        if plan.clip_level is not None:
            ratio = self._ratio(log_ratio, plan.clip_level)
            low = ((ratio < 1 - plan.eps_low) & (adv < 0)).double()
            high = ((ratio > 1 + plan.eps_high) & (adv > 0)).double()
            out["clip_ratio/low_mean"] = self.global_mean(low)
            out["clip_ratio/high_mean"] = self.global_mean(high)
            out["clip_ratio/region_mean"] = self.global_mean(torch.maximum(low, high))
            out["clip_ratio/low_min"] = _nan_extreme(self.seq_means(low), largest=False)
            out["clip_ratio/high_max"] = _nan_extreme(self.seq_means(high), largest=True)
        if plan.cispo_cap is not None:
            clipped = ((self._ratio(log_ratio, plan.cispo_level) > plan.cispo_cap) & (adv > 0)).double()
            out["cispo_clip_ratio"] = self.global_mean(clipped)
        return out

    def _ratio(self, log_ratio: torch.Tensor, level: str) -> torch.Tensor:
        """TRL's ``coef_1``: the token ratio [N, T], or the sequence ratio ``s_i`` [N, 1] (one value per row)."""
        if level == "token":
            return torch.exp(log_ratio)
        zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
        lengths = self.mask.sum(-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
        return torch.exp(torch.where(self.mask, log_ratio, zero).sum(-1, keepdim=True) / lengths)

    def kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, old_logp: torch.Tensor, estimator: str) -> float:
        per_token = kl_estimate(logp.detach(), ref_logp, estimator, old_logp=old_logp)
        return self.global_mean(per_token)
