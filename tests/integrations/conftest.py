"""Fixtures of the integration tests: the verl environment (the runner itself is tests/verl_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """Python of ``.venv-verl`` with verl 0.9.1 and this checkout of tepo (editable), built once per session."""
    from verl_runner import build_verl_python

    return build_verl_python()


@pytest.fixture(scope="module")
def build_trl_trainer(tiny_model_dir, tmp_path_factory, one_torch_thread):
    """``build_trl_trainer(loss_name=None, loss_options=None, **grpo_config)``: a `TepoGRPOTrainer` of one window
    (tests/trl_runner.py's `tiny_trainer`, completions of `trl_runner.T` tokens) with those GRPOConfig settings, on
    one tiny Llama shared by the module's trainers (their tests replace the log-prob pass; weights never change)."""
    pytest.importorskip("trl")
    from transformers import AutoTokenizer, LlamaForCausalLM

    from trl_runner import T, tiny_trainer

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)

    def build(loss_name=None, loss_options=None, **config):
        return tiny_trainer(
            tiny_model_dir,
            tmp_path_factory.mktemp("out"),
            T,
            model=model,
            tokenizer=tokenizer,
            config=config,
            loss_name=loss_name,
            loss_options=loss_options,
        )

    return build
