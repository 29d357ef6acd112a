"""Checkpoints without the optimizer's moments (``train.save_optimizer: false``): smaller by exactly the moments,
marked in the manifest, reported by ``find_latest_checkpoint`` and ``load_checkpoint``, and a resume from one is
refused unless acknowledged (``train.resume_without_optimizer``), with a note that it is not exact, which it is
not: the next update differs from the exactly resumed one."""

from __future__ import annotations

import json

import pytest
import torch

from tepo.checkpoint import (
    MANIFEST,
    CheckpointError,
    OptimizerStateMissing,
    find_latest_checkpoint,
    load_checkpoint,
    resume_without_optimizer_note,
    rng_state,
    save_checkpoint,
)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def _parts(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    return optimizer, scheduler


def _update(model, optimizer, scheduler, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 32, generator=generator)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()
    scheduler.step()


def _trained():
    model = _model()
    optimizer, scheduler = _parts(model)
    for seed in range(3):
        _update(model, optimizer, scheduler, seed)
    state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_state(),
        "stream": {"epoch": 0, "offset": 12},
    }
    return model, optimizer, scheduler, state


def _size(path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def test_without_optimizer_the_checkpoint_is_smaller_by_the_moments_and_says_so(tmp_path):
    model, optimizer, _, state = _trained()
    full = save_checkpoint(tmp_path / "full", 3, model, state)
    slim = save_checkpoint(tmp_path / "slim", 3, model, state, save_optimizer=False)

    # AdamW holds two fp32 moments per parameter: at least that many bytes are gone.
    moment_bytes = 2 * 4 * sum(p.numel() for p in model.parameters())
    assert _size(full) - _size(slim) >= moment_bytes
    assert (full / "model.safetensors").read_bytes() == (slim / "model.safetensors").read_bytes()

    assert json.loads((full / MANIFEST).read_text())["optimizer_state"] is True
    assert json.loads((slim / MANIFEST).read_text())["optimizer_state"] is False
    assert find_latest_checkpoint(tmp_path / "full").optimizer_state is True
    assert find_latest_checkpoint(tmp_path / "slim").optimizer_state is False

    loaded = load_checkpoint(find_latest_checkpoint(tmp_path / "slim"), _model(1))
    assert loaded.optimizer_state is False and loaded.step == 3
    assert loaded["optimizer"]["state"] == {}  # no moments, no step counts
    assert loaded["optimizer"]["param_groups"] == optimizer.state_dict()["param_groups"]  # lr, betas kept
    assert loaded["scheduler"] == state["scheduler"] and loaded["stream"] == state["stream"]
    assert load_checkpoint(find_latest_checkpoint(tmp_path / "full"), _model(1)).optimizer_state is True
    # The caller's state dict is not changed by saving without the moments.
    assert len(state["optimizer"]["state"]) == len(list(model.parameters()))


def test_a_resume_without_optimizer_state_is_refused_unless_acknowledged(tmp_path):
    model, _, _, state = _trained()
    save_checkpoint(tmp_path, 3, model, state, save_optimizer=False)
    found = find_latest_checkpoint(tmp_path)
    with pytest.raises(OptimizerStateMissing) as refused:
        resume_without_optimizer_note(found, allowed=False)
    assert isinstance(refused.value, CheckpointError)  # the CLI's one-line error path
    message = str(refused.value)
    assert "train.save_optimizer=false" in message and str(found.path) in message
    assert f"tepo train --resume {tmp_path} train.resume_without_optimizer=true" in message

    loaded = load_checkpoint(found, _model(1))  # the loaded state answers the same way
    with pytest.raises(OptimizerStateMissing):
        resume_without_optimizer_note(loaded, allowed=False)
    note = resume_without_optimizer_note(loaded, allowed=True)
    assert note.startswith(f"resuming from {found.path} (step 3) WITHOUT optimizer state")
    assert "not an exact continuation" in note


def test_a_checkpoint_with_optimizer_state_needs_no_acknowledgement(tmp_path):
    model, _, _, state = _trained()
    save_checkpoint(tmp_path, 3, model, state)
    found = find_latest_checkpoint(tmp_path)
    assert resume_without_optimizer_note(found, allowed=False) is None
    assert resume_without_optimizer_note(load_checkpoint(found, _model(1)), allowed=True) is None


def test_the_acknowledged_resume_restores_everything_but_the_moments_and_is_not_exact(tmp_path):
    """The trainer's restore path is the same for both kinds (``optimizer.load_state_dict`` of what was saved):
    the learning rate comes back, the moments start from zero, and so the next update differs from an exact
    resume's, which matches the uninterrupted run bit for bit."""
    model, optimizer, scheduler, state = _trained()
    save_checkpoint(tmp_path / "full", 3, model, state)
    save_checkpoint(tmp_path / "slim", 3, model, state, save_optimizer=False)
    _update(model, optimizer, scheduler, seed=99)  # the uninterrupted run's next step

    def resumed(run: str) -> torch.nn.Module:
        other = _model(1)
        other_optimizer, other_scheduler = _parts(other)
        loaded = load_checkpoint(find_latest_checkpoint(tmp_path / run), other)
        resume_without_optimizer_note(loaded, allowed=True)
        other_optimizer.load_state_dict(loaded["optimizer"])
        other_scheduler.load_state_dict(loaded["scheduler"])
        assert other_optimizer.param_groups[0]["lr"] == pytest.approx(
            1e-2 / 4
        )  # the schedule's value at step 3
        _update(other, other_optimizer, other_scheduler, seed=99)
        return other

    exact, inexact = resumed("full"), resumed("slim")
    for a, b, c in zip(model.parameters(), exact.parameters(), inexact.parameters()):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_checkpoints_from_before_the_manifest_field_count_as_holding_the_optimizer(tmp_path):
    model, _, _, state = _trained()
    path = save_checkpoint(tmp_path, 3, model, state)
    manifest = json.loads((path / MANIFEST).read_text())
    del manifest["optimizer_state"]
    (path / MANIFEST).write_text(json.dumps(manifest))
    found = find_latest_checkpoint(tmp_path)
    assert found.optimizer_state is True
    assert load_checkpoint(found, _model(1)).optimizer_state is True


def test_saving_without_optimizer_needs_an_optimizer_state_dict(tmp_path):
    with pytest.raises(ValueError, match=r'state\["optimizer"\] must be an optimizer.state_dict\(\)'):
        save_checkpoint(tmp_path, 1, _model(), {"optimizer": {"lr": 1}}, save_optimizer=False)
    # Nothing under "optimizer" at all: nothing to leave out, and the checkpoint holds no optimizer state.
    save_checkpoint(tmp_path, 1, _model(), {"marker": 1}, save_optimizer=False)
    assert find_latest_checkpoint(tmp_path).optimizer_state is False
