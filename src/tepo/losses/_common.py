"""Small tensor helpers shared by the built-in losses (masked statistics, the PPO clip, clip metrics)."""

from __future__ import annotations

import contextlib
import contextvars
import math
import numbers

import torch

from tepo.losses.inputs import LossInputs


class DeferredValue:
    """A metric still on the device: 0-dim ``tensors`` and ``finish(values) -> float`` that turns their host
    values into the python float the eager path would have returned (the same arithmetic, in the same order).

    Every ``.item()`` waits for the device to finish all queued work; a GPU update that reads ten metrics per
    micro-batch stalls ten times. Under :func:`deferred_metrics` the metric helpers return these instead, and
    the caller reads all of a step's values with one transfer (:func:`resolve_values`).
    """

    __slots__ = ("finish", "tensors")

    def __init__(self, tensors, finish):
        self.tensors = tuple(t.detach() for t in tensors)
        self.finish = finish


_DEFER = contextvars.ContextVar("tepo_deferred_metrics", default=False)


@contextlib.contextmanager
def deferred_metrics():
    """Within the block, ``compute_policy_loss``'s metrics (and these helpers) are :class:`DeferredValue` objects."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)


def deferring() -> bool:
    return _DEFER.get()


def scalar_value(tensor: torch.Tensor):
    """``float(tensor.item())``, or a :class:`DeferredValue` of it under :func:`deferred_metrics`."""
    if _DEFER.get():
        return DeferredValue((tensor,), lambda v: float(v[0]))
    return float(tensor.detach().item())


def resolve_values(values: list) -> list:
    """Python floats for a list of floats / ints / :class:`DeferredValue` / 0-dim tensors, in one host read."""
    tensors = []
    for v in values:
        if isinstance(v, DeferredValue):
            tensors.extend(v.tensors)
        elif isinstance(v, torch.Tensor):
            tensors.append(v.detach())
    if not tensors:
        return list(values)
    # float64 holds every float32 value and every count below 2**53 exactly, so one stacked read gives each
    # value the eager path's .item() gave.
    host = torch.stack([t.reshape(()).to(torch.float64) for t in tensors]).tolist()
    out, i = [], 0
    for v in values:
        if isinstance(v, DeferredValue):
            n = len(v.tensors)
            out.append(v.finish(host[i : i + n]))
            i += n
        elif isinstance(v, torch.Tensor):
            out.append(host[i])
            i += 1
        else:
            out.append(v)
    return out


def _mean_finish(empty: float):
    def finish(v):
        count = int(v[1])
        return empty if count == 0 else float(v[0] / count)

    return finish


def masked_mean_value(values: torch.Tensor, valid: torch.Tensor, empty: float = 0.0) -> float:
    """Mean of ``values`` over ``valid`` as a python float (``empty`` when nothing is valid); for metrics."""
    if _DEFER.get():
        total = torch.where(valid, values.detach(), 0.0).sum()
        return DeferredValue((total, valid.sum()), _mean_finish(empty))
    count = int(valid.sum().item())
    if count == 0:
        return empty
    return float(torch.where(valid, values.detach(), 0.0).sum().item() / count)


def masked_max_value(values: torch.Tensor, valid: torch.Tensor, empty: float = 0.0) -> float:
    if _DEFER.get():
        # No boolean indexing (its output size needs a sync): the max over valid entries, -inf elsewhere.
        fill = torch.full((), float("-inf"), dtype=values.dtype, device=values.device)
        top = torch.where(valid, values.detach(), fill).max()
        return DeferredValue((top, valid.any()), lambda v: float(v[0]) if v[1] else empty)
    if not bool(valid.any()):
        return empty
    return float(values.detach()[valid].max().item())


def masked_quantile_value(values: torch.Tensor, valid: torch.Tensor, q: float, empty: float = 0.0) -> float:
    """The ``q`` quantile (linear interpolation, ``torch.nanquantile``) of ``values`` over ``valid``; ``empty``
    when nothing is valid. No boolean indexing, so it defers like the others."""
    masked = torch.where(valid, values.detach().float(), float("nan"))
    value = torch.nanquantile(masked, q)
    if _DEFER.get():
        return DeferredValue((value, valid.any()), lambda v: float(v[0]) if v[1] else empty)
    return float(value.item()) if bool(valid.any()) else empty


def check_eps(**eps: float) -> None:
    for name, value in eps.items():
        if not value >= 0:
            raise ValueError(f"{name} must be >= 0, got {value}")


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> torch.Tensor:
    """PPO term ``-min(ratio*A, clip(ratio, 1-eps_low, 1+eps_high)*A)`` = ``max(-ratio*A, -clip(ratio)*A)``.

    Inside the clip range both branches are the same function of ``ratio`` (``torch.maximum`` splits the
    gradient between equal branches, which sums to the full gradient); outside it the clipped, constant branch
    wins exactly when the update would move further in the advantage's direction.
    """
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(-adv * ratio, -adv * clipped)


def clip_masks(
    ratio: torch.Tensor, adv: torch.Tensor, valid: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the clipped branch is active (zero gradient): ``A>0, ratio>1+eps_high`` and ``A<0, ratio<1-eps_low``."""
    high = valid & (adv > 0) & (ratio > 1.0 + eps_high)
    low = valid & (adv < 0) & (ratio < 1.0 - eps_low)
    return low, high


def clip_metrics(
    low: torch.Tensor, high: torch.Tensor, valid: torch.Tensor, prefix: str = ""
) -> dict[str, float]:
    return {
        f"{prefix}clip_frac_low": masked_mean_value(low.float(), valid),
        f"{prefix}clip_frac_high": masked_mean_value(high.float(), valid),
    }


def token_log_ratio(inputs: LossInputs) -> torch.Tensor:
    """``logp - old_logp`` per token (0 on masked tokens, which the inputs already hold as 0)."""
    return inputs.logp - inputs.old_logp


def row_lengths(inputs: LossInputs) -> torch.Tensor:
    """``|o_i|`` = number of valid tokens per row, as the compute dtype (0 for empty rows)."""
    return inputs.mask.sum(dim=-1).to(inputs.logp.dtype)


def sequence_log_ratio(inputs: LossInputs) -> torch.Tensor:
    """``log s_i = sum_t m*(logp - old) / sum_t m`` per row [N]; 0 for an empty row (so ``s_i = 1``)."""
    return token_log_ratio(inputs).sum(dim=-1) / row_lengths(inputs).clamp(min=1)


def sequence_advantage(inputs: LossInputs) -> torch.Tensor:
    """``A_i`` = mean of the advantage over the row's valid tokens [N] (equals ``A_i`` when it was broadcast)."""
    return inputs.advantages.sum(dim=-1) / row_lengths(inputs).clamp(min=1)


def sequence_ratio_metrics(
    seq_ratio: torch.Tensor, seq_adv: torch.Tensor, inputs: LossInputs, eps_low: float, eps_high: float
) -> dict[str, float]:
    """Sequence-level clip shares and ratio statistics over the non-empty rows."""
    rows = inputs.mask.any(dim=-1)
    low, high = clip_masks(seq_ratio, seq_adv, rows, eps_low, eps_high)
    return {
        **clip_metrics(low, high, rows, prefix="seq_"),
        "seq_ratio_mean": masked_mean_value(seq_ratio, rows, empty=1.0),
        "seq_ratio_max": masked_max_value(seq_ratio, rows, empty=1.0),
        # Where the ratios lie against the clip band [1 - eps_low, 1 + eps_high]: whether the clip can act at all.
        "seq_ratio_min": masked_quantile_value(seq_ratio, rows, 0.0, empty=1.0),
        "seq_ratio_p10": masked_quantile_value(seq_ratio, rows, 0.1, empty=1.0),
        "seq_ratio_p50": masked_quantile_value(seq_ratio, rows, 0.5, empty=1.0),
        "seq_ratio_p90": masked_quantile_value(seq_ratio, rows, 0.9, empty=1.0),
    }


def behaviour_logp(inputs: LossInputs) -> torch.Tensor:
    """The behaviour policy's log-prob per token: the sampler's ``rollout_logp`` when given, else ``old_logp``."""
    return inputs.old_logp if inputs.rollout_logp is None else inputs.rollout_logp


def check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def optional_number(name: str, value: float | None) -> float | None:
    """``value`` as a float, None kept (an option that is off); anything but a finite number is refused."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number or None (off), got {value!r}")
    return float(value)


def masked_min_value(values: torch.Tensor, valid: torch.Tensor, empty: float = 0.0) -> float:
    """Smallest of ``values`` over ``valid`` as a python float (``empty`` when nothing is valid); for metrics."""
    top = masked_max_value(-values, valid, empty=-empty)
    if isinstance(top, DeferredValue):
        finish = top.finish
        return DeferredValue(top.tensors, lambda v: -finish(v))
    return -top


def clamped_log_ratio(inputs: LossInputs, clamp: float | None) -> torch.Tensor:
    """``logp - old`` clamped to ``[-clamp, clamp]`` (verl clamps at 20 before every ``exp``); None: unclamped."""
    log_ratio = token_log_ratio(inputs)
    return log_ratio if clamp is None else log_ratio.clamp(-clamp, clamp)


def check_range(
    name: str, value: float, *, low: float, high: float | None = None, open_low=False, open_high=False
):
    """Refuse ``value`` outside ``[low, high]`` (ends open where asked) with one message naming the range."""
    below = value <= low if open_low else value < low
    above = high is not None and (value >= high if open_high else value > high)
    if below or above:
        lo = "(" if open_low else "["
        hi = "inf)" if high is None else f"{high:g}" + (")" if open_high else "]")
        raise ValueError(f"{name} must be in {lo}{low:g}, {hi}, got {value}")
