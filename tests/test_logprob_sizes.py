"""Log-prob chunk and block sizes by device (issue #35, item 7): larger on CUDA, the same values.

At Qwen's vocabulary (151,936) the CPU sizes give 220-row lm_head chunks and 27-row blocks, thousands of small
kernel launches for a GPU batch. The sizes only group rows; these tests pin the CUDA sizes (without a GPU: the
device's memory is faked) and that the CPU computes the same log-probs, entropies and gradients with them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import tepo.logprobs
from helpers import tiny_llama
from tepo.logprobs import default_chunk_size, response_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

QWEN_VOCAB = 151_936


def test_cpu_sizes_are_unchanged():
    assert default_chunk_size(QWEN_VOCAB) == 220 == default_chunk_size(QWEN_VOCAB, "cpu")
    assert tepo.logprobs._row_blocks(torch.empty(100, QWEN_VOCAB, device="meta"))[0] == slice(0, 27)


@pytest.mark.parametrize(("gib", "rows"), [(80, 883), (16, 441)])
def test_cuda_sizes_follow_the_gpu_memory(monkeypatch, gib, rows):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=gib * 2**30)
    )
    assert default_chunk_size(QWEN_VOCAB, torch.device("cuda", 0)) == rows
    assert default_chunk_size(QWEN_VOCAB, "cpu") == 220


def test_cuda_block_size_applies_to_cuda_tensors_only():
    class FakeCuda:
        shape = (1000, QWEN_VOCAB)
        device = torch.device("cuda", 0)

    assert tepo.logprobs._row_blocks(FakeCuda())[0] == slice(0, 220)


def _scores(model, ids, chunk_size):
    model.zero_grad(set_to_none=True)
    logp, ent, _ = response_logprobs(
        model, ids, torch.ones_like(ids), 8, chunk_size=chunk_size, temperature=0.9
    )
    (logp.sum() + 0.3 * ent.sum()).backward()
    return logp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]


def test_larger_sizes_give_the_same_values_and_gradients(monkeypatch):
    vocab = 3000
    model = tiny_llama(0, vocab_size=vocab).train()
    ids = torch.randint(1, vocab, (6, 14), generator=torch.Generator().manual_seed(0))
    # CPU sizes scaled to this vocabulary: 5-row chunks, 2-row blocks (many of each)
    monkeypatch.setattr(tepo.logprobs, "_BLOCK_ELEMENTS", 2 * vocab)
    small = _scores(model, ids, chunk_size=5)
    # 8x larger, as CUDA's are: 40-row chunks (all 48 rows in two), 16-row blocks
    monkeypatch.setattr(tepo.logprobs, "_BLOCK_ELEMENTS", 16 * vocab)
    large = _scores(model, ids, chunk_size=40)
    assert torch.equal(small[0], large[0]) and torch.equal(small[1], large[1])
    for a, b in zip(small[2], large[2]):
        # lm_head's weight gradient sums over rows: a different grouping of the sum may round differently
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
