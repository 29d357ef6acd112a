"""Generation backends behind one interface (:class:`RolloutBackend`), chosen by name with :func:`make_rollout`."""

from __future__ import annotations

from tepo.rollout.base import RolloutBackend, RolloutBatch
from tepo.rollout.hf import HFRollout

ROLLOUT_BACKENDS = ("hf", "vllm")

__all__ = [
    "ROLLOUT_BACKENDS",
    "HFRollout",
    "RolloutBackend",
    "RolloutBatch",
    "make_rollout",
    "resolve_rollout_backend",
]


def resolve_rollout_backend(name: str, vllm_python: str | None = None) -> str:
    """``name`` itself, except "auto": "vllm" where an interpreter with vLLM is found, else "hf"."""
    if name != "auto":
        return name
    from tepo.rollout.vllm import VLLMServerError, find_vllm_python

    try:
        find_vllm_python(vllm_python)
    except VLLMServerError:
        return "hf"
    return "vllm"


def make_rollout(name: str, model, tokenizer, **kw) -> RolloutBackend:
    """The rollout backend ``name`` for ``model``; ``kw`` go to its constructor.

    "hf": transformers' ``generate`` in this process, sharing the model. "vllm": a vLLM engine in a server process
    (:class:`tepo.rollout.vllm.VLLMRollout`), synced with the model's weights before each generation.
    """
    if name == "hf":
        return HFRollout(model, tokenizer, **kw)
    if name == "vllm":
        from tepo.rollout.vllm import VLLMRollout

        kw.pop("max_batch_size", None)  # vLLM schedules its own batches
        return VLLMRollout(model, tokenizer, **kw)
    raise ValueError(f"unknown rollout backend {name!r}; expected one of {list(ROLLOUT_BACKENDS)}")
