"""The advantage-estimator registry: name -> function, what it needs from the trainer, its default options.

A registered estimator is a function ``fn(rewards, group_size, *, <inputs>=None, option=default, ...) -> Tensor``.
Its keyword-only parameters named like a per-token input (`TENSOR_INPUTS`) receive tensors; all others *are*
its options, their defaults the documented defaults. Each entry declares what it needs, so that a trainer can
call `tepo.advantages.compute_advantages` with every tensor it has without knowing the estimator's name, and ask
`estimator_requires` which passes (old policy, reference model) to run:

* ``requires``: the per-token inputs the estimator reads, a set of `TENSOR_INPUTS` names, or a function of the
  estimator's options (defaults filled in) returning one when the need depends on them (ERPO reads
  ``ref_logp`` only with ``progress_baseline="ref"``).
* ``group_relative``: the advantage compares the responses of one prompt, so ``group_size = 1`` makes it 0.
* ``token_level``: the result is ``[N, T]`` rather than ``[N]``.

Like the policy-loss registry, registering a name twice raises (delete the entry from `ADVANTAGE_ESTIMATORS` to
replace it) and names are listed in registration order.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

# Per-token tensors a trainer can hand to an estimator, all [N, T] and aligned with the response tokens:
# logp     log-probs of the sampled tokens under the current policy when advantages are computed;
# old_logp log-probs under the policy that sampled the batch (in the built-in trainer advantages are computed
#          before any update of the rollout, so this is the same tensor as logp);
# ref_logp log-probs under the frozen reference model (a copy of the initial policy);
# entropy  the current policy's token entropy; mask 1 for response tokens, 0 for padding;
# sum_pi_squared  sum over the vocabulary of pi(v)^2 at each position under the pre-update policy (the optimal
#          token baseline's path variance; computed by the trainer's pre-update pass only when an estimator asks).
# Two are not per-token: reward_components [N, K], each response's reward from each of the K functions of
# reward.functions (rewards [N] is their weighted sum), and reward_weights [K], those functions' weights (GDPO).
TENSOR_INPUTS = (
    "logp",
    "old_logp",
    "ref_logp",
    "entropy",
    "mask",
    "sum_pi_squared",
    "reward_components",
    "reward_weights",
)
# The shape each input has, for messages.
INPUT_SHAPES = {"reward_components": "[N, K]", "reward_weights": "[K]"}

# Names a framework registers that tepo refuses, with the reason (the registry decides, so looking a name up needs
# no import of the estimator modules).
REFUSED_ESTIMATORS = {
    "remax": "ReMax (2310.10505) subtracts the reward of a greedy rollout of each prompt, and tepo's trainer "
    "generates no greedy baseline rollout during training; use rloo or grpo (a baseline from the group's samples)",
}

Requires = Iterable[str] | Callable[[Mapping[str, Any]], Iterable[str]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """One registry entry.

    ``fn(rewards, group_size, **inputs, **options)`` receives validated, detached float64 rewards ``[N]``, the
    group size, the tensors named by ``requires`` and the options.
    """

    name: str
    fn: Callable[..., Tensor]
    token_level: bool
    paper: str
    defaults: dict[str, Any] = field(default_factory=dict)  # option -> default, inputs excluded
    accepts_any_option: bool = False
    requires: Requires = frozenset()
    group_relative: bool = False
    nonnegative_rewards: bool = False  # refuses rewards < 0; config validation refuses negative shaping
    inputs: frozenset[str] = frozenset()  # the TENSOR_INPUTS fn can take as keywords

    @property
    def options(self) -> list[str]:
        return sorted(self.defaults)

    @property
    def summary(self) -> str:
        doc = inspect.getdoc(self.fn) or ""
        return doc.splitlines()[0] if doc else ""

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Raise ValueError naming any option this estimator does not have."""
        if self.accepts_any_option:
            return
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for advantage estimator {self.name!r}; "
                f"valid options: {', '.join(self.options) or '(none)'}"
            )

    def requires_for(self, options: Mapping[str, Any]) -> frozenset[str]:
        """The tensors this estimator reads with ``options`` (defaults filled in for the missing ones)."""
        if callable(self.requires):
            needed = frozenset(self.requires({**self.defaults, **options}))
        else:
            needed = frozenset(self.requires)
        _check_input_names(self.name, needed, self.inputs, self.accepts_any_option)
        return needed


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}


def _check_input_names(name: str, needed: frozenset[str], accepted: frozenset[str], any_kw: bool) -> None:
    unknown = sorted(needed - set(TENSOR_INPUTS))
    if unknown:
        raise ValueError(
            f"advantage estimator {name!r} requires {unknown}: expected names among {', '.join(TENSOR_INPUTS)}"
        )
    not_taken = sorted(needed - accepted)
    if not_taken and not any_kw:
        raise TypeError(
            f"advantage estimator {name!r} requires {not_taken} but its function has no keyword parameter "
            f"for {'it' if len(not_taken) == 1 else 'them'}"
        )


def register_advantage_estimator(
    name: str,
    *,
    requires: Requires = (),
    group_relative: bool = False,
    token_level: bool = False,
    nonnegative_rewards: bool = False,
    paper: str = "",
) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Decorator adding ``fn(rewards, group_size, *, <input>=None, option=default, ...) -> Tensor`` as ``name``.

    ``requires``: the `TENSOR_INPUTS` the estimator reads, or ``options -> names`` when that depends on the
    options; `compute_advantages` hands ``fn`` exactly those (and raises when one is missing). ``group_relative``:
    the advantage compares responses within a group (``group_size = 1`` is then refused by config validation).
    ``nonnegative_rewards``: the estimator refuses rewards < 0 (it divides by a mean reward read as a success
    rate); config validation then refuses reward shaping that can make a reward negative, before step 1.
    ``token_level`` estimators return ``[N, T]``, others ``[N]``. Options are ``fn``'s keyword-only parameters
    other than inputs; `compute_advantages` rejects any other keyword unless ``fn`` takes ``**kwargs``.
    Registering a name twice raises ValueError (remove the old entry from ``ADVANTAGE_ESTIMATORS`` first to
    replace it), as for policy losses.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"estimator name must be a non-empty string, got {name!r}")
    if not callable(requires):
        if isinstance(requires, str):
            raise ValueError(
                f"advantage estimator {name!r}: requires must be a collection of names, not a string"
            )
        requires = frozenset(requires)

    def decorator(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage estimator {name!r} is already registered "
                "(remove it from ADVANTAGE_ESTIMATORS first to replace it)"
            )
        params = inspect.signature(fn).parameters.values()
        positional = [
            p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if len(positional) != 2 or any(p.kind == p.VAR_POSITIONAL for p in positional):
            raise TypeError(
                f"advantage estimator {name!r} must take exactly two positional parameters "
                f"(rewards, group_size) and keyword-only options, got signature {inspect.signature(fn)}"
            )
        keywords = {p.name: p.default for p in params if p.kind == p.KEYWORD_ONLY}
        entry = AdvantageEstimator(
            name=name,
            fn=fn,
            token_level=bool(token_level),
            paper=paper,
            defaults={k: v for k, v in keywords.items() if k not in TENSOR_INPUTS},
            accepts_any_option=any(p.kind == p.VAR_KEYWORD for p in params),
            requires=requires,
            group_relative=bool(group_relative),
            nonnegative_rewards=bool(nonnegative_rewards),
            inputs=frozenset(k for k in keywords if k in TENSOR_INPUTS),
        )
        entry.requires_for({})  # a declaration that cannot be met with the defaults fails now, not at step 1
        ADVANTAGE_ESTIMATORS[name] = entry
        return fn

    return decorator


def list_advantage_estimators() -> list[str]:
    """Registered estimator names, in registration order."""
    return list(ADVANTAGE_ESTIMATORS)


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The registry entry of ``name``; ValueError listing the valid names when there is none."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except (KeyError, TypeError):
        if isinstance(name, str) and name in REFUSED_ESTIMATORS:
            raise ValueError(
                f"advantage estimator {name!r} is not offered: {REFUSED_ESTIMATORS[name]}"
            ) from None
        raise ValueError(
            f"unknown advantage estimator {name!r}; valid names: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
        ) from None


def estimator_requires(name: str, options: Mapping[str, Any] | None = None) -> frozenset[str]:
    """The per-token tensors estimator ``name`` reads with ``options``: a subset of `TENSOR_INPUTS`.

    A trainer runs the reference model when this holds ``"ref_logp"``, and a pre-update pass of the policy when
    it holds any of ``"logp"``, ``"old_logp"``, ``"entropy"``. Unknown names or options raise ValueError.
    """
    est = get_advantage_estimator(name)
    options = dict(options or {})
    est.check_options(options)
    return est.requires_for(options)


def zero_log_ratio_problem(name: str, options: Mapping[str, Any] | None = None) -> str | None:
    """Why estimator ``name`` with ``options`` cannot run where advantages are computed once per rollout, before
    any update (the built-in trainer, TRL): there ``logp`` and ``old_logp`` are one tensor, so a term built from
    their difference is 0 at every step. None when it does not read both. The one rule every host applies; each
    prefixes the key it was given by."""
    needs = estimator_requires(name, options)
    if not {"logp", "old_logp"} <= needs:
        return None
    defaults = ADVANTAGE_ESTIMATORS[name].defaults
    changed = {k: v for k, v in (options or {}).items() if k not in defaults or defaults[k] != v}
    fix = (
        f" Drop {', '.join(f'{k}={v!r}' for k, v in changed.items())}: with the defaults {name!r} does not read "
        "old_logp."
        if changed and not {"logp", "old_logp"} <= estimator_requires(name, {})
        else ""
    )
    return (
        f"{name!r} with these options compares logp with old_logp, but the trainer computes advantages from the "
        "pre-update policy (once per rollout, before any update), where the two are the same tensor: their "
        f"difference is exactly 0 at every step and that term would silently do nothing.{fix}"
    )


def describe() -> list[dict[str, Any]]:
    """One row per estimator, in registration order.

    Keys: ``name``, ``token_level``, ``group_relative``, ``requires`` (sorted, with the default options),
    ``defaults`` (option -> default), ``paper``, ``summary`` (the docstring's first line).
    """
    return [
        {
            "name": est.name,
            "token_level": est.token_level,
            "group_relative": est.group_relative,
            "requires": sorted(est.requires_for({})),
            "defaults": dict(est.defaults),
            "paper": est.paper,
            "summary": est.summary,
        }
        for est in ADVANTAGE_ESTIMATORS.values()
    ]


def describe_table(*, markdown: bool = False) -> str:
    """`describe()` as a plain-text table (what ``tepo estimators`` prints), or a Markdown one (``--markdown``)."""
    header = ("name", "level", "needs", "defaults", "paper")
    lines = [
        (
            r["name"],
            "token" if r["token_level"] else "sequence",
            ",".join(r["requires"]) or "-",
            ", ".join(f"{k}={v!r}" for k, v in r["defaults"].items()) or "-",
            r["paper"] or "-",
        )
        for r in describe()
    ]
    if markdown:
        from tepo.metrics.tables import text_table

        return text_table(header, lines, markdown=True)
    widths = [max(len(row[c]) for row in [header, *lines]) for c in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row).rstrip() for row in [header, *lines])
