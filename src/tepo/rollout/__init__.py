"""Generation backends behind one interface (:class:`RolloutBackend`), chosen by name with :func:`make_rollout`."""

from __future__ import annotations

import importlib.util

from tepo.rollout.base import RolloutBackend, RolloutBatch
from tepo.rollout.hf import HFRollout

ROLLOUT_BACKENDS = ("hf", "vllm")

__all__ = ["ROLLOUT_BACKENDS", "HFRollout", "RolloutBackend", "RolloutBatch", "make_rollout"]


def make_rollout(name: str, model, tokenizer, **kw) -> RolloutBackend:
    """The rollout backend ``name`` ("hf"; "vllm" is planned) for ``model``; ``kw`` go to its constructor."""
    if name == "hf":
        return HFRollout(model, tokenizer, **kw)
    if name == "vllm":
        installed = importlib.util.find_spec("vllm") is not None
        raise NotImplementedError(
            "rollout backend 'vllm' is not available on this machine: "
            + (
                "vllm is installed but tepo's vllm backend is not implemented yet; use rollout 'hf'"
                if installed
                else "the vllm package is not installed (install it on a GPU machine, e.g. `pip install vllm`) "
                "and tepo's vllm backend is not implemented yet; use rollout 'hf'"
            )
        )
    raise ValueError(f"unknown rollout backend {name!r}; expected one of {list(ROLLOUT_BACKENDS)}")
