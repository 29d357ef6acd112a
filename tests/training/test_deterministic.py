"""``train.deterministic`` (issue #35, item 6): the switches a bit-exact resume on CUDA needs, set without a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from tepo.config import load_config
from tepo.training.determinism import make_deterministic


@pytest.fixture
def restore_switches(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.flash_sdp_enabled(),
        torch.backends.cuda.mem_efficient_sdp_enabled(),
        torch.backends.cuda.cudnn_sdp_enabled(),
        torch.backends.cuda.math_sdp_enabled(),
    )
    yield
    torch.use_deterministic_algorithms(saved[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[1], saved[2]
    torch.backends.cuda.enable_flash_sdp(saved[3])
    torch.backends.cuda.enable_mem_efficient_sdp(saved[4])
    torch.backends.cuda.enable_cudnn_sdp(saved[5])
    torch.backends.cuda.enable_math_sdp(saved[6])


def test_off_by_default_and_settable():
    assert load_config(None, []).train.deterministic is False
    assert load_config(None, ["train.deterministic=true"]).train.deterministic is True


def test_cuda_switches(restore_switches):
    line = make_deterministic(torch.device("cuda", 0))
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    # only the math attention kernel: memory-efficient / flash / cuDNN backward kernels are not deterministic
    assert torch.backends.cuda.math_sdp_enabled()
    assert not torch.backends.cuda.flash_sdp_enabled()
    assert not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert "math SDPA" in line


def test_cpu_keeps_the_attention_kernels_and_a_step_still_runs(restore_switches):
    from helpers import tiny_llama
    from tepo.logprobs import response_logprobs

    flash = torch.backends.cuda.flash_sdp_enabled()
    make_deterministic(torch.device("cpu"))
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.backends.cuda.flash_sdp_enabled() == flash
    # the update's ops (including the shared-prompt index_select backward) have deterministic CPU kernels
    model = tiny_llama(0).train()
    ids = torch.randint(1, 97, (4, 10), generator=torch.Generator().manual_seed(0))
    ids[1:, :5] = ids[0, :5]
    logp, _, _ = response_logprobs(
        model, ids, torch.ones_like(ids), 5, prompt_groups=torch.zeros(4, dtype=torch.long)
    )
    logp.sum().backward()
