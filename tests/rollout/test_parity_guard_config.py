"""The parity guard is built from ``rollout.parity`` and handed to the vLLM backend when it is built (#45), not
attached to it afterwards: ``parity_guard_from_config`` and ``VLLMRollout.from_config``, without an engine."""

from __future__ import annotations

import dataclasses

import torch

from tepo.config import ParityConfig, RolloutConfig, VllmConfig
from tepo.rollout.parity import ParityGuard, parity_guard_from_config
from tepo.rollout.vllm import VLLMRollout


def test_the_guard_carries_the_configured_thresholds_and_the_engine_dtype():
    config = ParityConfig(check=True, max_gap=0.25, min_shift=0.1, min_share=0.6)
    guard = parity_guard_from_config(config, torch.float32)
    assert isinstance(guard, ParityGuard)
    assert (guard.max_gap, guard.min_shift, guard.min_share) == (0.25, 0.1, 0.6)
    assert guard.engine_dtype is torch.float32
    assert parity_guard_from_config(dataclasses.replace(config, check=False), torch.float32) is None


def test_from_config_hands_the_guard_to_the_backend_it_builds(monkeypatch):
    handed = []

    def record(self, model, tokenizer, **kwargs):
        handed.append(kwargs)

    monkeypatch.setattr(VLLMRollout, "__init__", record)
    model = torch.nn.Linear(2, 2)
    for check in (True, False):
        config = RolloutConfig(
            backend="vllm", vllm=VllmConfig(dtype="bfloat16"), parity=ParityConfig(check=check, max_gap=0.3)
        )
        VLLMRollout.from_config(config, model, object(), seed=0, log=lambda *_: None)
    with_guard, without = handed
    assert isinstance(with_guard["parity_guard"], ParityGuard)
    assert (
        with_guard["parity_guard"].max_gap == 0.3
        and with_guard["parity_guard"].engine_dtype is torch.bfloat16
    )
    assert without["parity_guard"] is None
