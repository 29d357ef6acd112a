"""tepo.checkpoint unit tests: round trip of weights (tied lm_head included), optimizer and RNG state; pruning;
state loaded with ``weights_only=True`` (a pickle in ``state.pt`` is refused, not run)."""

from __future__ import annotations

import json
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from tepo.checkpoint import (
    MANIFEST,
    CheckpointError,
    _sha256,
    find_latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    verify_checkpoint,
)


def tiny_llama(seed: int, *, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), random.gauss(0, 1), np.random.rand(2).tolist()


def test_round_trip_restores_weights_tied_head_optimizer_and_rng(tmp_path):
    model = tiny_llama(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    random.gauss(0, 1)  # leaves a cached second Gaussian in Python's state: it must survive too
    state = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "stream": {"epoch": 1, "offset": 3}}
    path = save_checkpoint(tmp_path, 7, model, state)
    expected_draws = _draws()

    saved = load_file(str(path / "model.safetensors"))
    assert "lm_head.weight" not in saved, "the tied head is stored once, as embed_tokens"
    assert verify_checkpoint(path) is None

    other = tiny_llama(1)  # different weights everywhere
    other_optimizer = torch.optim.AdamW(other.parameters(), lr=1e-2)
    checkpoint = find_latest_checkpoint(tmp_path)
    assert checkpoint.step == 7 and checkpoint.path == path
    loaded = load_checkpoint(checkpoint, other)
    for name, tensor in model.state_dict().items():
        assert torch.equal(other.state_dict()[name], tensor), name
    # Still tied after loading: one tensor, so an update to the embedding is an update to the head.
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()

    other_optimizer.load_state_dict(loaded["optimizer"])
    for (_, a), (_, b) in zip(optimizer.state.items(), other_optimizer.state.items()):
        assert torch.equal(a["exp_avg"], b["exp_avg"]) and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
    assert loaded["step"] == 7 and loaded["stream"] == {"epoch": 1, "offset": 3}

    _draws()  # move every generator on
    set_rng_state(loaded["rng"])
    assert _draws() == expected_draws


def test_untied_model_round_trip_keeps_separate_head(tmp_path):
    model, other = tiny_llama(0, tied=False), tiny_llama(1, tied=False)
    path = save_checkpoint(tmp_path, 1, model, {"rng": rng_state()})
    assert "lm_head.weight" in load_file(str(path / "model.safetensors"))
    load_checkpoint(find_latest_checkpoint(tmp_path), other)
    assert torch.equal(other.lm_head.weight, model.lm_head.weight)
    assert other.lm_head.weight.data_ptr() != other.model.embed_tokens.weight.data_ptr()


def test_weights_that_do_not_fit_the_model_are_an_error(tmp_path):
    save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {})
    with pytest.raises(CheckpointError, match="weights do not fit the model"):
        load_checkpoint(find_latest_checkpoint(tmp_path), tiny_llama(0))


def test_keep_prunes_old_checkpoints_and_torn_temporaries(tmp_path):
    model = torch.nn.Linear(3, 2)
    torn = tmp_path / "checkpoints" / "step_000002.tmp-99999"
    torn.mkdir(parents=True)
    (torn / "model.safetensors").write_bytes(b"half")
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step_000003", "step_000004"]
    for step in (5, 6):
        save_checkpoint(tmp_path, step, model, {}, keep=0)  # 0 keeps all
    assert len(list((tmp_path / "checkpoints").iterdir())) == 4


def test_saving_a_step_again_replaces_it(tmp_path):
    model = torch.nn.Linear(3, 2)
    save_checkpoint(tmp_path, 1, model, {"n": 1})
    with torch.no_grad():
        model.weight.add_(1)
    save_checkpoint(tmp_path, 1, model, {"n": 2})
    loaded = load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(3, 2))
    assert loaded["n"] == 2


class _TouchOnUnpickle:
    """A pickle payload: unpickling it creates a file (``Path.touch``), proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_state_is_loaded_with_weights_only_so_a_pickle_payload_never_runs(tmp_path):
    """A forged checkpoint (valid manifest, state.pt holding a code-running pickle) is refused, and nothing runs."""
    marker = tmp_path / "pwned"
    path = save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {})
    torch.save({"step": 1, "evil": _TouchOnUnpickle(marker)}, path / "state.pt")
    manifest = json.loads((path / MANIFEST).read_text())
    manifest["files"]["state.pt"] = _sha256(path / "state.pt")
    (path / MANIFEST).write_text(json.dumps(manifest))
    assert verify_checkpoint(path) is None  # the forgery passes the checksum: only weights_only stops it
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_checkpoint(find_latest_checkpoint(tmp_path), torch.nn.Linear(2, 2))
    assert not marker.exists()
    # The same file with weights_only=False would run the payload: the test above is not vacuous.
    torch.load(path / "state.pt", weights_only=False)
    assert marker.exists()
