"""What a step's updates add up to: each micro-batch's values read to the host once per optimizer step, folded
into the step's metrics by the early-stop rule (:meth:`UpdateTotals.fold`), and the :class:`UpdateResult`
``tepo.training.update.update_policy`` returns."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tepo.losses._common import resolve_values
from tepo.losses.rollout_correction import CorrectionTokens, rollout_correction_metrics
from tepo.metrics.catalogue import in_group
from tepo.rollout.base import RolloutBatch


@dataclass
class MicroResult:
    """One micro-batch's values, still on the device until :func:`read_once`."""

    finite: Tensor
    loss: Tensor
    tokens: Tensor
    entropy_sum: Tensor
    metrics: dict
    written: tuple | None  # (rows, cols) of token_entropy / token_logp written by this micro-batch


@dataclass(frozen=True)
class _MicroValues:
    """One micro-batch's values read to the host: its finite flag, loss, loss-mask tokens, entropy sum, metrics."""

    finite: bool
    loss: float
    tokens: float
    entropy_sum: float
    metrics: dict


@dataclass(frozen=True)
class _HostValues:
    """A mini-batch's values read to the host in one transfer: each micro-batch's, and the gradient norm."""

    micro: list[_MicroValues]
    grad_norm: float


@dataclass(frozen=True)
class UpdateResult:
    """What :func:`update_policy` hands the step.

    ``metrics``: named in the ``update/`` group (the loss's, token-weighted over the applied micro-batches;
    ``update/grad_norm``, ``update/optimizer_updates``, ``update/skipped_updates``; ``update/padding_share``: the
    share of the tokens the update's forward passes computed that were padding). ``token_entropy`` /
    ``token_logp``: the epoch-0 (pre-update) policy's per-token entropy and log-probs ``[N, T]``.
    ``correction_metrics``: with an in-update correction, the metrics of the weights it computed over the whole
    batch; None otherwise."""

    metrics: dict
    token_entropy: Tensor
    token_logp: Tensor
    correction_metrics: dict | None = None


def read_once(pending: list[MicroResult], grad_norm: Tensor) -> _HostValues:
    """Every micro-batch's flag, loss, counts and metrics, and the gradient norm, as python values in one read."""
    flat, keys = [grad_norm], []
    for r in pending:
        names = list(r.metrics)
        keys.append(names)
        flat.extend([r.finite, r.loss, r.tokens, r.entropy_sum, *(r.metrics[k] for k in names)])
    values = resolve_values(flat)
    micro, i = [], 1
    for names in keys:
        finite, loss, tokens, entropy_sum = values[i : i + 4]
        metrics = dict(zip(names, values[i + 4 : i + 4 + len(names)]))
        i += 4 + len(names)
        micro.append(_MicroValues(bool(finite), loss, tokens, entropy_sum, metrics))
    return _HostValues(micro, values[0])


@dataclass
class UpdateTotals:
    """What the step's updates add up to: the loss metrics (token-weighted over the applied micro-batches), the
    gradient norms, updates applied and skipped, the epoch-0 policy's per-token views, the in-loop correction's
    whole-batch tokens, and the padding of the epoch-0 micro-batches."""

    token_entropy: Tensor
    token_logp: Tensor
    sums: defaultdict = field(default_factory=lambda: defaultdict(float))
    counts: defaultdict = field(default_factory=lambda: defaultdict(float))
    grad_norms: list = field(default_factory=list)
    updates: int = 0
    skipped: int = 0
    # plan.correction's tokens, put together micro-batch by micro-batch
    correction: CorrectionTokens | None = None
    computed_tokens: int = 0
    real_tokens: int = 0

    @property
    def attempts(self) -> int:
        return self.updates + self.skipped

    def fold(self, pending: list[MicroResult], host: _HostValues) -> bool:
        """Add one mini-batch's micro-batches (read to the host); True when its update is to be applied.

        The early-stop rule: a mini-batch with a non-finite loss in any micro-batch is not applied, and it counts
        as if it had stopped at that micro-batch: the metrics take the micro-batches before the first non-finite
        one, and the pre-update token views of those after it stay 0 (the non-finite one's own are kept)."""
        first_bad = next((i for i, r in enumerate(host.micro) if not r.finite), None)
        finite = first_bad is None
        sums, counts = self.sums, self.counts
        for r in host.micro[: len(host.micro) if finite else first_bad]:
            sums["loss"] += r.loss
            for key, value in r.metrics.items():
                if isinstance(value, int | float) and key != "loss":
                    sums[key] += value * r.tokens
                    counts[key] += r.tokens
            sums["entropy_mean"] += r.entropy_sum
            counts["entropy_mean"] += r.tokens
        if not finite:
            for r in pending[first_bad + 1 :]:
                if r.written is not None:
                    self.token_entropy[r.written[0], r.written[1]] = 0.0
                    self.token_logp[r.written[0], r.written[1]] = 0.0
        norm = host.grad_norm
        if finite and math.isfinite(norm):
            self.grad_norms.append(norm)
            self.updates += 1
            return True
        self.skipped += 1
        return False

    def result(self, batch: RolloutBatch) -> UpdateResult:
        """What :func:`update_policy` returns (:class:`UpdateResult`)."""
        sums, counts, norms = self.sums, self.counts, self.grad_norms
        # The loss's metrics by the names the loss gives them, in the update's group (update/clip_frac_high).
        out = in_group("update", {key: sums[key] / counts[key] for key in counts if counts[key] > 0})
        out["update/loss"] = sums["loss"] / max(self.updates, 1)
        out["update/grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
        out["update/grad_norm_max"] = max(norms) if norms else float("nan")
        out["update/optimizer_updates"] = self.updates
        out["update/skipped_updates"] = self.skipped
        if self.computed_tokens:
            out["update/padding_share"] = 1.0 - self.real_tokens / self.computed_tokens
        correction = None
        if self.correction is not None:
            correction = rollout_correction_metrics(self.correction, batch.response_mask)
        return UpdateResult(out, self.token_entropy, self.token_logp, correction)


def place(
    whole: CorrectionTokens | None, part: CorrectionTokens, where: tuple, shape: torch.Size
) -> CorrectionTokens:
    """``whole`` (zeros and False where no micro-batch wrote yet, made on first use in ``part``'s dtype) with
    ``part`` written at ``where`` = (rows, cols): the whole batch's correction, for its metrics, computed once.

    Each token's weight comes from its own row only (token modes: its own ratio; sequence modes: its row's), so
    the assembled weights are those of one whole-batch call (bit for bit in token modes; in sequence modes up to
    the summation order of a row's log-ratios over its trimmed columns)."""
    if whole is None:
        weights = torch.zeros(shape, dtype=part.weights.dtype, device=part.weights.device)
        flags = torch.zeros(shape, dtype=torch.bool, device=part.weights.device)
        whole = CorrectionTokens(weights, flags, flags.clone())
    rows, cols = where
    whole.weights[rows, cols] = part.weights
    whole.keep[rows, cols] = part.keep
    whole.truncated[rows, cols] = part.truncated
    return whole
