"""Fixtures of the update tests (tests/training/test_training_update*.py): the tiny Llama they update and the
random batch they update it on (tests/update_runs.py runs the update)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def model():
    """A 2-layer random Llama in train mode (helpers.tiny_llama(0)); the tests deep-copy it before updating."""
    from helpers import tiny_llama

    return tiny_llama(0).train()


@pytest.fixture(scope="module")
def batch():
    """update_runs' GROUPS x G random rows (helpers.random_rollout_batch, seed 1)."""
    from helpers import random_rollout_batch
    from update_runs import GROUPS, PROMPT, RESPONSE, G

    return random_rollout_batch(GROUPS, G, PROMPT, RESPONSE, seed=1)
