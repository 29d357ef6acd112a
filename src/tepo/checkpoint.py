"""Atomic training checkpoints that a killed run can always resume from.

A checkpoint is a directory ``checkpoints/step_000012/`` holding:
- ``model.safetensors``: the policy's weights (safetensors only: loading it runs no code),
- ``state.pt``: optimizer, scheduler, RNG states, data position, step and counters (loaded with
  ``torch.load(weights_only=True)``),
- ``manifest.json``: written last, with the SHA-256 of every other file.

It is written into ``step_000012.tmp-<pid>`` and renamed into place, so a kill during the write leaves either no
checkpoint or a complete one. On resume, checkpoints are tried newest first; one with a missing or mismatching
manifest (torn by a kill, corrupted on disk) is reported and skipped for the previous one.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

MANIFEST = "manifest.json"
CHECKPOINT_FILES = ("model.safetensors", "state.pt")


class CheckpointError(RuntimeError):
    pass


@dataclass
class Checkpoint:
    path: Path
    step: int


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that a kill leaves the old content or the new, never a torn file
    (for small run files such as ``eval_before.json`` and ``summary.json``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def rng_state() -> dict:
    return {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
        "numpy": np.random.get_state()[1].tolist(),
        "numpy_pos": int(np.random.get_state()[2]),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))


def model_state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict without tied duplicates (safetensors refuses shared storage), contiguous, on CPU."""
    seen: set[tuple[int, tuple]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue  # tied weight (lm_head = embed_tokens); tie_weights restores it on load
        seen.add(key)
        out[name] = tensor.detach().contiguous().cpu()
    return out


def save_checkpoint(run_dir: Path, step: int, model: torch.nn.Module, state: dict, keep: int = 2) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_into(tmp, step, model, state)
    except (OSError, SafetensorError) as err:
        # A full disk (or a file-size limit) mid-write: remove the half-written copy so it does not hold the space
        # a retry needs, and say what is intact. safetensors reports I/O errors as SafetensorError, not OSError.
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failure_message(root, final, err)) from err
    if final.exists():  # a previous attempt at this step (resumed run): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _prune(root, keep)
    return final


def _write_into(tmp: Path, step: int, model: torch.nn.Module, state: dict) -> None:
    tmp.mkdir()
    save_file(model_state_for_saving(model), str(tmp / "model.safetensors"))
    torch.save({**state, "step": step}, tmp / "state.pt")
    files = {name: _sha256(tmp / name) for name in CHECKPOINT_FILES}
    for name in files:
        with open(tmp / name, "rb") as handle:
            os.fsync(handle.fileno())
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"step": step, "files": files}))
    with open(manifest, "rb") as handle:
        os.fsync(handle.fileno())
    _fsync_dir(tmp)


def _save_failure_message(root: Path, final: Path, err: BaseException) -> str:
    complete = sorted(p.name for p in root.glob("step_*") if p.is_dir() and ".tmp" not in p.name)
    intact = (
        f"the last complete checkpoint, {complete[-1]}, is intact"
        if complete
        else "no earlier checkpoint exists"
    )
    previous = [root / name for name in complete[-1:]]
    size = sum(f.stat().st_size for p in previous for f in p.iterdir() if f.is_file())
    free = shutil.disk_usage(root).free
    sizes = f"{free / 1e9:.2f} GB free there" + (
        f"; one checkpoint of this run takes {size / 1e9:.2f} GB" if size else ""
    )
    return (
        f"could not write checkpoint {final.name} under {root}: {err} ({sizes}). The half-written copy was removed "
        f"and {intact}. Free disk space (or lower train.keep_checkpoints) and resume with "
        f"`tepo train --resume {root.parent}`."
    )


def _prune(root: Path, keep: int) -> None:
    complete = sorted(p for p in root.glob("step_*") if p.is_dir() and ".tmp" not in p.name)
    for old in complete[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for torn in root.glob("step_*.tmp-*"):
        shutil.rmtree(torn, ignore_errors=True)  # left by a kill mid-write


def verify_checkpoint(path: Path) -> str | None:
    """None when complete and intact, else the reason it cannot be used."""
    manifest = path / MANIFEST
    if not manifest.exists():
        return "no manifest (the write was interrupted)"
    try:
        files = json.loads(manifest.read_bytes())["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):  # ValueError covers bad JSON and bytes that are not UTF-8
        return "unreadable manifest"
    missing = [name for name in CHECKPOINT_FILES if name not in files]
    if missing:
        return f"manifest does not list {', '.join(missing)}"
    for name, digest in files.items():
        if not (path / name).exists():
            return f"{name} is missing"
        if _sha256(path / name) != digest:
            return f"{name} does not match its checksum (corrupt)"
    return None


def find_latest_checkpoint(run_dir: Path, warn=print) -> Checkpoint | None:
    """The newest intact checkpoint; corrupt or partial ones are reported through ``warn`` and skipped."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return None
    candidates = sorted((p for p in root.glob("step_*") if p.is_dir()), reverse=True)
    for path in candidates:
        if ".tmp" in path.name:
            warn(f"skipping {path.name}: partial checkpoint left by an interrupted write")
            continue
        problem = verify_checkpoint(path)
        if problem:
            warn(f"skipping checkpoint {path.name}: {problem}; trying the previous one")
            continue
        return Checkpoint(path=path, step=int(path.name.split("_")[1]))
    return None


def load_checkpoint(checkpoint: Checkpoint, model: torch.nn.Module) -> dict:
    weights = load_file(str(checkpoint.path / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = {name for name in missing if "lm_head" in name}
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"{checkpoint.path}: weights do not fit the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    if tied:
        model.tie_weights()
    return torch.load(checkpoint.path / "state.pt", weights_only=True)
