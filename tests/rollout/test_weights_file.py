"""The weight-sync file (issue #54): created once, then overwritten in place, and always a valid safetensors file.

vLLM reads it with safetensors' own loader, so every check reads it back with ``safetensors.torch.load_file``.
"""

from __future__ import annotations

import errno
import json
import os
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from helpers import tiny_llama
from tepo.config import LoraConfig
from tepo.lora import apply_lora, merged_state_dict
from tepo.rollout import weight_sync
from tepo.rollout.weight_sync import WeightsFile, safetensors_header, weights_bytes


def expected(model, dtype):
    tensors = {name: t.detach().to(dtype) for name, t in merged_state_dict(model).items()}
    tensors.setdefault("lm_head.weight", model.get_output_embeddings().weight.detach().to(dtype))
    return tensors


def assert_file_holds(path, tensors):
    loaded = load_file(str(path))
    assert sorted(loaded) == sorted(tensors)
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_file_holds_the_weights_with_the_head_untied(tmp_path, dtype):
    model = tiny_llama(0, tie=True)
    weights = WeightsFile(tmp_path, dtype)
    written = weights.write(model)
    tensors = expected(model, dtype)
    assert_file_holds(weights.path, tensors)
    assert torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])
    header_length = struct.unpack("<Q", weights.path.read_bytes()[:8])[0]
    assert header_length % 8 == 0  # every tensor starts aligned
    assert written == weights_bytes(model, dtype) == weights.path.stat().st_size - 8 - header_length
    with safe_open(str(weights.path), framework="pt") as handle:
        assert handle.metadata() == {"format": "pt"}
    assert json.loads((tmp_path / "config.json").read_text())["tie_word_embeddings"] is False


def test_a_sync_overwrites_the_same_file_in_place(tmp_path):
    model = tiny_llama(0)
    weights = WeightsFile(tmp_path, torch.bfloat16)
    weights.write(model)
    inode, size = weights.path.stat().st_ino, weights.path.stat().st_size
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(-2.0).add_(0.25)
    weights.write(model)
    assert weights.path.stat().st_ino == inode and weights.path.stat().st_size == size
    assert_file_holds(weights.path, expected(model, torch.bfloat16))
    assert sorted(os.listdir(tmp_path)) == ["config.json", "generation_config.json", "model.safetensors"]


def test_a_lora_model_writes_its_merged_weights_under_the_base_names(tmp_path):
    model = apply_lora(tiny_llama(0), LoraConfig(rank=2, alpha=4.0, target_modules="all-linear"))
    weights = WeightsFile(tmp_path, torch.float32)
    weights.write(model)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.add_(0.5)  # B starts at zero: now the adapters change the weights
    weights.write(model)
    tensors = expected(model, torch.float32)
    assert not any(".lora_" in name or ".base_layer." in name for name in tensors)
    assert_file_holds(weights.path, tensors)


def test_another_layout_or_a_released_file_is_created_anew(tmp_path):
    weights = WeightsFile(tmp_path, torch.float32)
    weights.write(tiny_llama(0))
    inode = weights.path.stat().st_ino
    wider = tiny_llama(1, vocab_size=101)
    weights.write(wider)
    assert weights.path.stat().st_ino != inode
    assert_file_holds(weights.path, expected(wider, torch.float32))
    weights.release()
    inode = weights.path.stat().st_ino
    weights.write(wider)
    assert weights.path.stat().st_ino != inode


def test_no_room_fails_at_creation_with_an_oserror_and_leaves_nothing(tmp_path, monkeypatch):
    """Pages are reserved when the file is created: a full /dev/shm is an OSError there, never a SIGBUS later
    from a write through the mapping."""

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weight_sync.os, "posix_fallocate", full)
    with pytest.raises(OSError, match="No space left"):
        WeightsFile(tmp_path, torch.bfloat16).write(tiny_llama(0))
    assert not any(name.endswith(".safetensors") or ".tmp-" in name for name in os.listdir(tmp_path))


def test_the_header_is_what_safetensors_writes_for_the_same_tensors(tmp_path):
    from safetensors.torch import save_file

    shapes = {"b": (3, 2), "a": (5,), "c": (1, 1, 7)}
    header, ranges = safetensors_header(shapes, torch.bfloat16)
    tensors = {
        name: torch.arange(torch.Size(shape).numel(), dtype=torch.bfloat16).view(shape)
        for name, shape in shapes.items()
    }
    save_file(tensors, str(tmp_path / "reference.safetensors"), metadata={"format": "pt"})
    data = b"".join(tensors[name].view(torch.uint8).numpy().tobytes() for name in shapes)
    (tmp_path / "ours.safetensors").write_bytes(header + data)
    assert_file_holds(tmp_path / "ours.safetensors", tensors)
    assert ranges == {"b": (0, 12), "a": (12, 22), "c": (22, 36)}


@pytest.mark.model
def test_the_sync_benchmark_compares_the_kept_file_with_a_new_one(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_weight_sync.py"
    command = [sys.executable, str(script), "--rounds", "1", "--write-only", "--threads", "1"]
    printed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert printed.returncode == 0, printed.stderr[-3000:]
    line = next(x for x in printed.stdout.splitlines() if x.startswith("write:"))
    new, kept = (float(x.split(" s")[0]) for x in (line.split("new file ")[1], line.split("kept file ")[1]))
    assert new > 0 and kept > 0 and "kept / new = " in line
