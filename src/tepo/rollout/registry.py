"""Which rollout backends exist, and building one from ``rollout.*`` config: the single place backend names live.

Config validation (``rollout.backend``), ``tepo eval --rollout`` choices and the trainer's construction all read
this table. Adding a backend is one module with a class that implements :class:`tepo.rollout.base.RolloutBackend`
plus the three classmethods below, and one :func:`register_rollout_backend` line at the end of this file:

- ``from_config(rollout_config, model, tokenizer, *, seed, run_dir=None, log=print) -> backend``
- ``availability(rollout_config) -> (bool, reason)``: whether it can run here (what "auto" asks)
- ``config_errors(rollout_config) -> list[str]``: problems with its own ``rollout.*`` keys, one message each

The table holds ``"module:Class"`` strings, imported on first use: this module imports neither torch nor a
backend until a backend is asked for, so ``tepo --help`` stays cheap.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class RolloutBackendEntry:
    """One registered backend. ``auto_priority``: None if "auto" never picks it; else higher is tried first."""

    name: str
    target: str | type
    auto_priority: int | None = None

    def load(self) -> type:
        """The backend class (imported now if registered by its ``"module:Class"`` path)."""
        if not isinstance(self.target, str):
            return self.target
        module, _, attr = self.target.partition(":")
        return _checked(self.name, getattr(importlib.import_module(module), attr))


HOOKS = ("from_config", "availability", "config_errors")
METHODS = ("generate", "weights_updated", "close", "__enter__", "__exit__")


def _checked(name: str, cls: type) -> type:
    missing = [m for m in (*HOOKS, *METHODS) if not callable(getattr(cls, m, None))]
    if missing:
        raise TypeError(
            f"rollout backend {name!r} ({cls.__module__}.{cls.__qualname__}) lacks {', '.join(missing)}: a backend "
            "implements tepo.rollout.base.RolloutBackend and the hooks listed in tepo.rollout.registry"
        )
    return cls


_BACKENDS: dict[str, RolloutBackendEntry] = {}


def register_rollout_backend(name: str, target: str | type, *, auto_priority: int | None = None) -> None:
    """Register a backend class (or its ``"module:Class"`` path, imported lazily) under ``name``.

    The name becomes valid for ``rollout.backend`` and ``tepo eval --rollout``. ``auto_priority`` makes it a
    candidate for ``rollout.backend=auto``: the available candidate with the highest priority is chosen.
    """
    if not isinstance(name, str) or not name.isidentifier() or name == AUTO:
        raise ValueError(f"a rollout backend name must be an identifier other than {AUTO!r}; got {name!r}")
    if name in _BACKENDS:
        raise ValueError(f"rollout backend {name!r} is already registered ({_BACKENDS[name].target})")
    if isinstance(target, str):
        if ":" not in target:
            raise ValueError(f"rollout backend target must be 'module:Class' or a class; got {target!r}")
    else:
        _checked(name, target)
    _BACKENDS[name] = RolloutBackendEntry(name, target, auto_priority)


def rollout_backend_names() -> tuple[str, ...]:
    """The registered backend names, in registration order."""
    return tuple(_BACKENDS)


def rollout_backend_choices() -> tuple[str, ...]:
    """Every accepted ``rollout.backend`` value: the registered names, then "auto"."""
    return (*_BACKENDS, AUTO)


def rollout_backend_class(name: str) -> type:
    """The class registered as ``name``; ``ValueError`` naming the valid ones otherwise."""
    if name not in _BACKENDS:
        raise ValueError(f"unknown rollout backend {name!r}; expected one of {list(rollout_backend_names())}")
    return _BACKENDS[name].load()


def rollout_config_errors(rollout_config) -> list[str]:
    """``rollout.backend`` is a known name, and every registered backend's own keys are valid."""
    choices = rollout_backend_choices()
    errors = []
    if rollout_config.backend not in choices:
        expected = ", ".join(choices[:-1]) + f" or {choices[-1]}"
        errors.append(f"rollout.backend: expected {expected}, got {rollout_config.backend!r}")
    for entry in _BACKENDS.values():
        errors += entry.load().config_errors(rollout_config)
    return errors


def choose_rollout_backend(rollout_config) -> tuple[str, str]:
    """``(name, why)``: the backend ``rollout_config.backend`` names, or for "auto" the available candidate with
    the highest ``auto_priority`` (why says what was found, and why better candidates were passed over)."""
    name = rollout_config.backend
    if name != AUTO:
        rollout_backend_class(name)  # unknown names fail here, with the list
        return name, f"rollout.backend={name}"
    passed_over = []
    candidates = sorted(
        (e for e in _BACKENDS.values() if e.auto_priority is not None), key=lambda e: -e.auto_priority
    )
    for entry in candidates:
        ok, reason = entry.load().availability(rollout_config)
        if ok:
            why = "; ".join([f"rollout.backend=auto: {reason}", *passed_over])
            return entry.name, why
        passed_over.append(f"not {entry.name}: {reason}")
    raise ValueError(
        "rollout.backend=auto found no available backend:\n" + "\n".join(f"  - {p}" for p in passed_over)
    )


def make_rollout_from_config(rollout_config, model, tokenizer, *, seed: int, run_dir=None, log=print):
    """Build the rollout backend ``rollout_config`` asks for (resolving "auto"), and log which one and why.

    ``seed`` seeds an engine of its own (vLLM); ``run_dir`` is where such an engine writes its log; ``log`` gets
    one line naming the backend and the reason. Returns a :class:`tepo.rollout.base.RolloutBackend`: use it as a
    context manager, or call ``close()``.
    """
    name, why = choose_rollout_backend(rollout_config)
    log(f"rollout: {name} ({why})")
    return rollout_backend_class(name).from_config(
        rollout_config, model, tokenizer, seed=seed, run_dir=run_dir, log=log
    )


# ---- the built-in backends ----------------------------------------------------------------------------------
# hf: transformers' generate on the trainer's own model (runs anywhere; auto's fallback).
register_rollout_backend("hf", "tepo.rollout.hf:HFRollout", auto_priority=0)
# vllm: a vLLM engine in a server process with a synced copy of the weights (auto's choice where installed).
register_rollout_backend("vllm", "tepo.rollout.vllm:VLLMRollout", auto_priority=10)
