"""The compiled CPU engine (rollout.vllm.compile): vLLM's inductor graph, its cache under tepo's cache root, samples
the weights it is sent; a weight sync reaches the compiled graph as it reaches the eager one."""

from __future__ import annotations

import pytest

from helpers import raise_one_answer, vllm_python_or_skip
from tepo.rollout.parity import ParityGuard

pytestmark = pytest.mark.model


@pytest.mark.slow  # compiles the engine: 75-85 s the first time on a machine, 15-20 s from the compile cache
def test_the_compiled_engine_follows_a_weight_sync_through_the_parity_guard():
    python = vllm_python_or_skip()
    import torch

    from tepo.config import RolloutConfig
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout.vllm import VLLMRollout

    model, tokenizer = load_model_and_tokenizer(None)
    torch.manual_seed(0)
    with VLLMRollout(model, tokenizer, python=python, dtype="bfloat16", compile_cpu=True) as rollout:
        assert rollout.compilation not in (None, "NONE")  # the engine really runs a compiled graph
        max_gap = RolloutConfig().parity.max_gap
        rollout.parity_guard = ParityGuard(max_gap)
        assert rollout.parity_guard.check(rollout).gap < max_gap
        raise_one_answer(model, tokenizer, lr=2e-3)
        # The guard's share test stops a sync that the compiled graph did not take (ParityError).
        assert rollout.sync_weights(force=True)
        assert rollout.parity_guard.last_gap < max_gap and rollout.parity_guard.checks == 2
