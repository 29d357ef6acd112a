"""Shared fixtures: the real embedded model (SmolLM2-135M-Instruct), loaded once per test session, and a tiny
random Llama with its tokenizer. Plain helpers shared by test modules are in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Benchmarks and data sets for tests: the data directory beside the repository (../shared/data), unless the caller
# set $TEPO_DATA_DIR. The package itself knows only --data-dir, $TEPO_DATA_DIR and the Hugging Face hub.
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "TEPO_DATA_DIR" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["TEPO_DATA_DIR"] = str(_SHARED_DATA)


@pytest.fixture(scope="session")
def embedded_model_dir():
    """Path of the embedded model's safetensors directory (converted from the GGUF on first use, ~20 s)."""
    from tepo.models import embedded_model_dir as _embedded_model_dir

    return _embedded_model_dir()


@pytest.fixture(scope="session")
def embedded_model(embedded_model_dir):
    """``(model, tokenizer)`` of the embedded model, float32, eval mode. Shared: do not modify its weights."""
    from tepo.models import load_model_and_tokenizer

    return load_model_and_tokenizer(embedded_model_dir)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's model code on one intra-op thread, restoring the setting afterwards.

    On a shared 2-core machine other processes keep the cores busy and two OpenMP threads then wait on each
    other: greedy generation of 4 x 16 tokens measured 12-16 s with 2 threads against 2.4 s with 1.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, embedded_model_dir):
    """A 2-layer Llama (random weights from a config) with the embedded model's tokenizer, saved like any
    checkpoint."""
    from transformers import AutoTokenizer

    from helpers import write_tiny_llama

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer)


@pytest.fixture
def scratch_registry():
    """The policy-loss and advantage-estimator registries put back as they were after the test (which may register
    its own)."""
    from tepo.advantages import ADVANTAGE_ESTIMATORS
    from tepo.losses import POLICY_LOSSES

    saved = [(registry, dict(registry)) for registry in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS)]
    yield
    for registry, before in saved:
        registry.clear()
        registry.update(before)
