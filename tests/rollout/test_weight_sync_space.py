"""The weight-sync folder (issue #35, item 4): /dev/shm only when it has room, else a folder on disk, said once.

A default Docker container's /dev/shm is 64 MB; Qwen2.5-1.5B's sync file is 3 GB in bf16.
"""

from __future__ import annotations

import contextlib
import shutil
from types import SimpleNamespace

import torch

from helpers import tiny_llama
from tepo.rollout import vllm, vllm_weights
from tepo.rollout.weight_sync import choose_weights_root, weights_bytes


def _free(monkeypatch, free_bytes):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: SimpleNamespace(total=0, used=0, free=free_bytes))


def test_shm_with_room_is_used(tmp_path, monkeypatch):
    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    _free(monkeypatch, 10 * 2**30)
    assert choose_weights_root(3 * 2**30, shm=shm, fallback=disk) == (shm, None)


def test_a_small_shm_falls_back_to_disk_with_one_line(tmp_path, monkeypatch):
    shm, disk = tmp_path / "shm", tmp_path / "disk"
    shm.mkdir()
    _free(monkeypatch, 64 * 2**20)  # Docker's default
    root, note = choose_weights_root(3 * 2**30, shm=shm, fallback=disk)
    assert root == disk
    assert "\n" not in note and "64 MB" not in note and "0.06 GiB free" in note and str(disk) in note
    # the file is overwritten in place, so room for one copy and a margin is enough, and less is not
    _free(monkeypatch, 3 * 2**30 + 64 * 2**20)
    assert choose_weights_root(3 * 2**30, shm=shm, fallback=disk)[0] == shm
    _free(monkeypatch, 3 * 2**30 + 2**20)
    assert choose_weights_root(3 * 2**30, shm=shm, fallback=disk)[0] == disk


def test_no_shm_uses_the_fallback_silently(tmp_path):
    assert choose_weights_root(1, shm=tmp_path / "absent", fallback=tmp_path) == (tmp_path, None)


def test_weights_bytes_counts_the_untied_head_copy():
    untied, tied = tiny_llama(0), tiny_llama(0, tie=True)
    n_untied = sum(p.numel() for p in untied.parameters())
    assert weights_bytes(untied, torch.bfloat16) == 2 * n_untied
    n_tied = sum(p.numel() for p in tied.parameters())  # the shared tensor once
    head = tied.get_output_embeddings().weight.numel()
    assert weights_bytes(tied, torch.float32) == 4 * (n_tied + head)


def test_the_engine_asks_before_writing(monkeypatch, tmp_path):
    """VLLMRollout writes its weights where choose_weights_root says (checked up to the write, no server; the
    engine's weights live in tepo.rollout.vllm_weights)."""
    seen = {}

    def fake_root(needed):
        seen["needed"] = needed
        return tmp_path, "weight sync: test note"

    class Stop(Exception):
        pass

    class StopAtWrite:
        def __init__(self, folder, dtype):
            seen["folder"] = folder

        def write(self, model):
            raise Stop

    monkeypatch.setattr(vllm_weights, "choose_weights_root", fake_root)
    monkeypatch.setattr(vllm_weights, "WeightsFile", StopAtWrite)
    monkeypatch.setattr(vllm, "find_vllm_python", lambda python: "/bin/true")
    logged = []
    model = tiny_llama(0)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    with contextlib.suppress(Stop):
        vllm.VLLMRollout(model, tokenizer, dtype="float32", log=logged.append)
    assert seen["needed"] == weights_bytes(model, torch.float32)
    assert seen["folder"].parent == tmp_path
    assert logged == ["weight sync: test note"]
    shutil.rmtree(seen["folder"], ignore_errors=True)


def test_keep_weights_file_reaches_the_engines_weights(monkeypatch, tmp_path):
    """rollout.vllm.keep_weights_file goes from the config to EngineWeights (checked up to the write, no server)."""
    from tepo.config import load_config

    kept = []

    class Stop(Exception):
        pass

    def record(self, model, dtype, log, *, keep_file=True):
        kept.append(keep_file)
        raise Stop

    monkeypatch.setattr(vllm, "find_vllm_python", lambda python: "/bin/true")
    monkeypatch.setattr(vllm_weights.EngineWeights, "__init__", record)
    monkeypatch.setattr(vllm, "EngineWeights", vllm_weights.EngineWeights)
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=1)
    for value in ("true", "false"):
        rollout = load_config("tepo", [f"rollout.vllm.keep_weights_file={value}"]).rollout
        with contextlib.suppress(Stop):
            vllm.VLLMRollout.from_config(rollout, tiny_llama(0), tokenizer, seed=0, log=lambda *_: None)
    assert kept == [True, False]
