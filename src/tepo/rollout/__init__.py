"""Generation backends behind one interface (:class:`RolloutBackend`), built from config with
:func:`make_rollout_from_config`; the backends are registered in :mod:`tepo.rollout.registry`.

This package imports no torch by itself (the CLI's parser reads the backend names from it): the classes below are
imported on first use.
"""

from __future__ import annotations

import importlib

from tepo.rollout.registry import (
    choose_rollout_backend,
    make_rollout_from_config,
    register_rollout_backend,
    rollout_backend_choices,
    rollout_backend_class,
    rollout_backend_names,
    rollout_config_errors,
)

__all__ = [
    "HFRollout",
    "RolloutBackend",
    "RolloutBatch",
    "RolloutError",
    "choose_rollout_backend",
    "make_rollout",
    "make_rollout_from_config",
    "register_rollout_backend",
    "rollout_backend_choices",
    "rollout_backend_class",
    "rollout_backend_names",
    "rollout_config_errors",
]

_LAZY = {
    "RolloutBackend": "tepo.rollout.base",
    "RolloutBatch": "tepo.rollout.base",
    "RolloutError": "tepo.rollout.base",
    "HFRollout": "tepo.rollout.hf",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tepo.rollout' has no attribute {name!r}")


def make_rollout(name: str, model, tokenizer, **kw):
    """The registered backend ``name`` built from its constructor's own arguments ``kw`` (no config, no "auto").

    For library use and tests; the trainer and ``tepo eval`` use :func:`make_rollout_from_config`.
    """
    return rollout_backend_class(name)(model, tokenizer, **kw)
