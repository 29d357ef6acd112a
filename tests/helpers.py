"""Plain helpers shared by several test modules (fixtures are in conftest.py): ``from helpers import ...``."""

from __future__ import annotations

import pytest


def tiny_llama(seed: int = 0, *, tie: bool = False, vocab_size: int = 97):
    """A real (randomly initialised) 2-layer Llama small enough for exact float32 checks in milliseconds."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def vllm_python_or_skip() -> str:
    """The Python that runs vLLM, or skip the test (with the reason) where vLLM is not installed."""
    from tepo.rollout.vllm import VLLMServerError, find_vllm_python

    try:
        return find_vllm_python()
    except VLLMServerError as err:
        pytest.skip(f"vLLM is not installed: {err}")
