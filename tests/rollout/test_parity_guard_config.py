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


def test_the_guard_checks_the_first_two_syncs_then_every_nth():
    """rollout.parity.every=4: syncs 1, 2, 4, 8, 12 are checked; every=1 checks each one."""
    guard = parity_guard_from_config(ParityConfig(every=4), torch.bfloat16)
    assert [n for n in range(1, 13) if guard.due()] == [1, 2, 4, 8, 12]
    every_sync = parity_guard_from_config(ParityConfig(every=1), torch.bfloat16)
    assert all(every_sync.due() for _ in range(5))
    assert ParityConfig().every == 8


def test_the_backend_asks_the_guard_only_when_a_check_is_due(monkeypatch):
    """VLLMRollout.sync_weights runs the check on the guard's schedule, and only for a sync that happened."""
    rollout = VLLMRollout.__new__(VLLMRollout)
    checked = []

    class Weights:
        use_staged = False

        def to_load(self, force=False):
            return 1

        def loaded(self, version, staged):
            pass

    guard = parity_guard_from_config(ParityConfig(every=3), torch.bfloat16)
    monkeypatch.setattr(guard, "check", lambda backend: checked.append(backend.sync_count))
    rollout._weights, rollout.parity_guard, rollout.sync_count = Weights(), guard, 0
    rollout._weights_dir, rollout.model = "unused", torch.nn.Linear(2, 2)
    monkeypatch.setattr(rollout, "_call", lambda request: {"ok": True, "seconds": 0.0})
    for _ in range(7):
        assert rollout.sync_weights()
    assert checked == [1, 2, 3, 6]
