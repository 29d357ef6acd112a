"""Shared fixtures: the real embedded model (SmolLM2-135M-Instruct), loaded once per test session."""

from __future__ import annotations

import pytest


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
