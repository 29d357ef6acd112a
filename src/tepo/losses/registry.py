"""The policy-loss registry: name -> function, its default aggregation and its default options.

A registered loss is a pure function ``fn(inputs: LossInputs, *, opt1=default1, ...) -> (loss_mat, metrics)``:
``loss_mat`` is the per-token loss ``l[i,t]`` of docs/algorithms.md ([N, T]; masked entries are ignored) and
``metrics`` a dict of python floats. Its keyword-only parameters *are* its options: their defaults are the
documented defaults and any other name is rejected. `tepo.losses.compute_policy_loss` aggregates ``loss_mat``
and adds the regularizers, so a loss never deals with either.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from tepo.losses.aggregation import check_agg_mode

LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

_TENSOR_FIELDS = ("ref_logp", "entropy", "old_entropy")


@dataclass(frozen=True)
class PolicyLossSpec:
    """One registry entry."""

    name: str
    fn: LossFn
    default_agg: str
    defaults: MappingProxyType  # option name -> default value, read from fn's keyword-only parameters
    paper: str = ""
    requires: tuple[str, ...] = field(default=())  # optional LossInputs tensors the loss cannot work without
    # Mini-batch statistics (see `tepo.losses.mini_batch_stats`): fn(inputs, **options) -> stats, and the option
    # of ``fn`` that receives them. None for losses whose per-token terms need nothing beyond their own rows.
    batch_stats: Callable[..., Any] | None = None
    batch_stats_option: str | None = None
    # Options whose default is a number but that also take None (off): their annotation includes None.
    nullable: frozenset = frozenset()

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(self.fn) or ""
        return doc.splitlines()[0] if doc else ""

    @property
    def needs_batch_stats(self) -> bool:
        """True when the loss depends on statistics of the whole optimizer mini-batch: compute them once per
        mini-batch with `tepo.losses.mini_batch_stats` and pass ``batch_stats=`` to every micro-batch call."""
        return self.batch_stats is not None

    @property
    def has_clip_pair(self) -> bool:
        """True when the loss takes both eps_low and eps_high, so the symmetric alias ``eps`` is accepted.

        Not when one of them defaults to None (off: cispo's optional lower clip), where ``eps`` would turn it on.
        """
        return all(self.defaults.get(key) is not None for key in ("eps_low", "eps_high"))


POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


def _allows_none(annotation: Any) -> bool:
    """True when a parameter's annotation (a string under ``from __future__ import annotations``) admits None."""
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        parts = re.split(r"[|\[\],]", annotation)
        return any(part.strip().rsplit(".", 1)[-1] in ("None", "Optional") for part in parts)
    return annotation is None or type(None) in typing.get_args(annotation)


def _nullable_options(fn: LossFn) -> frozenset:
    params = list(inspect.signature(fn).parameters.values())[1:]
    return frozenset(p.name for p in params if _allows_none(p.annotation))


def _options_of(fn: LossFn, name: str) -> dict[str, Any]:
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise TypeError(f"policy loss {name!r}: the first parameter must take the LossInputs positionally")
    options = {}
    for param in params[1:]:
        if param.kind is not param.KEYWORD_ONLY or param.default is param.empty:
            raise TypeError(
                f"policy loss {name!r}: option {param.name!r} must be keyword-only with a default "
                "(write `def fn(inputs, *, {param.name}=...)`)"
            )
        options[param.name] = param.default
    return options


def register_policy_loss(
    name: str,
    *,
    default_agg: str = "token-mean",
    paper: str = "",
    requires: tuple[str, ...] = (),
    batch_stats: Callable[..., Any] | None = None,
    batch_stats_option: str | None = None,
) -> Callable[[LossFn], LossFn]:
    """Decorator adding ``fn`` to `POLICY_LOSSES` under ``name``.

    ``fn(inputs: LossInputs, *, option=default, ...) -> (loss_mat [N, T], metrics)``. ``requires`` names optional
    tensors (``ref_logp``, ``entropy``, ``old_entropy``) the loss needs; a call without them raises ValueError.
    ``batch_stats`` (with ``batch_stats_option``, the name of the loss option that receives its result) declares
    that the loss needs statistics of the whole optimizer mini-batch: ``batch_stats(inputs, **options)`` computes
    them from the mini-batch's `LossInputs` and the loss's own options (see `tepo.losses.mini_batch_stats`).
    Registering a name twice raises ValueError (remove the old entry from ``POLICY_LOSSES`` first to replace it).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a policy loss name must be a non-empty string, got {name!r}")
    check_agg_mode(default_agg)
    unknown = [r for r in requires if r not in _TENSOR_FIELDS]
    if unknown:
        raise ValueError(f"requires={unknown!r}: expected names among {', '.join(_TENSOR_FIELDS)}")
    if (batch_stats is None) != (batch_stats_option is None):
        raise ValueError("pass batch_stats and batch_stats_option together (or neither)")

    def decorator(fn: LossFn) -> LossFn:
        if name in POLICY_LOSSES:
            raise ValueError(f"policy loss {name!r} is already registered")
        defaults = _options_of(fn, name)
        if batch_stats_option is not None and batch_stats_option not in defaults:
            raise ValueError(
                f"policy loss {name!r}: batch_stats_option {batch_stats_option!r} is not one of its options"
            )
        POLICY_LOSSES[name] = PolicyLossSpec(
            name=name,
            fn=fn,
            default_agg=default_agg,
            defaults=MappingProxyType(defaults),
            paper=paper,
            requires=tuple(requires),
            batch_stats=batch_stats,
            batch_stats_option=batch_stats_option,
            nullable=_nullable_options(fn),
        )
        return fn

    return decorator


def list_policy_losses() -> list[str]:
    """Registered loss names, in registration order."""
    return list(POLICY_LOSSES)


def get_policy_loss(name: str) -> PolicyLossSpec:
    try:
        return POLICY_LOSSES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy loss {name!r}; registered losses: {', '.join(POLICY_LOSSES)}"
        ) from None


def describe() -> list[dict[str, Any]]:
    """One row per registered loss: name, default aggregation, default options, paper, one-line summary."""
    return [
        {
            "name": spec.name,
            "default_agg": spec.default_agg,
            "defaults": dict(spec.defaults),
            "paper": spec.paper,
            "summary": spec.summary,
        }
        for spec in POLICY_LOSSES.values()
    ]


def _fmt_default(value: Any) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def describe_table(*, markdown: bool = False) -> str:
    """`describe()` as a plain-text table (what ``tepo losses`` prints), or a Markdown one (``--markdown``)."""
    from tepo.metrics.tables import text_table

    header = ("name", "default agg", "defaults", "paper")
    rows = [
        (
            row["name"],
            row["default_agg"],
            ", ".join(f"{k}={_fmt_default(v)}" for k, v in row["defaults"].items()) or "-",
            row["paper"] or "-",
        )
        for row in describe()
    ]
    return text_table(header, rows, markdown=markdown)
