"""Atomic training checkpoints that a killed run can always resume from.

A checkpoint is a directory ``checkpoints/step_000012/`` holding:
- ``model.safetensors``: the policy's weights (safetensors only: loading it runs no code); for a LoRA run
  (``model.lora.rank > 0``) only the adapters' weights (a few MB; the base model is ``model.name``),
- ``state.pt``: optimizer, scheduler, RNG states, data position, step and counters (loaded with
  ``torch.load(weights_only=True)``),
- ``manifest.json``: written last, with the SHA-256 of every other file and whether the optimizer's moments are in
  ``state.pt`` (``"optimizer_state"``).

It is written into ``step_000012.tmp-<pid>`` and renamed into place, so a kill during the write leaves either no
checkpoint or a complete one. On resume, checkpoints are tried newest first; one with a missing or mismatching
manifest (torn by a kill, corrupted on disk) is reported and skipped for the previous one.

With ``save_optimizer=False`` (``train.save_optimizer: false``) the optimizer's per-parameter state (AdamW's two
moments and step counts: two thirds of a checkpoint of an fp32 model) is left out and only its hyper-parameters
(``param_groups``) are kept. Such a checkpoint is a complete record of the weights, but a resume from it is not an
exact continuation: the moments restart from zero. ``load_checkpoint`` reports it (``.optimizer_state``) and
:func:`resume_without_optimizer_note` refuses such a resume unless the user acknowledged it
(``train.resume_without_optimizer: true``).

Retention: after each save the newest ``keep`` intact checkpoints stay (the one just written always among them)
and the rest is deleted, broken ones included: a corrupt copy is never counted as one of the ``keep``.
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

from tepo.files import atomic_write_text, fsync_folder  # noqa: F401  (atomic_write_text: re-exported)

MANIFEST = "manifest.json"
CHECKPOINT_FILES = ("model.safetensors", "state.pt")


# The keys of the state a trainer saves with its weights (state.pt), named in this one place.
OPTIMIZER_KEY = "optimizer"  # optimizer.state_dict()
SCHEDULER_KEY = "scheduler"  # the learning-rate schedule's state_dict()
RNG_KEY = "rng"  # rng_state()
STREAM_KEY = "stream"  # the prompt stream's position
STEP_KEY = "step"  # steps done (written by save_checkpoint)
BAD_STEPS_KEY = "bad_steps_in_row"  # steps in a row without an applied update
REWARD_TOTALS_KEY = "reward_totals"  # the reward pool's counters of the run so far
PARITY_GUARD_KEY = "parity_guard"  # the rollout parity guard's state, where the run has one


class CheckpointError(RuntimeError):
    pass


class OptimizerStateMissing(CheckpointError):
    """A resume from a checkpoint saved without the optimizer's moments, not acknowledged by the user."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    # False: saved with save_optimizer=False (from the manifest; checkpoints from before that field hold it)
    optimizer_state: bool = True


class CheckpointState(dict):
    """What ``load_checkpoint`` returns: the state dict that was saved (plus ``"step"``), a plain ``dict`` to
    index, with where it came from and whether the optimizer's moments are in it."""

    def __init__(self, state: dict, *, path: Path, step: int, optimizer_state: bool):
        super().__init__(state)
        self.path = path
        self.step = step
        self.optimizer_state = optimizer_state


def should_save(step: int, total_steps: int, save_every: int, save_final: bool) -> bool:
    """Whether the trainer writes a checkpoint after ``step`` (1-based, just finished): every ``save_every`` steps
    (0: never periodically) and, with ``save_final``, after the last step of the run."""
    return (save_every > 0 and step % save_every == 0) or (save_final and step == total_steps)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def rng_state() -> dict:
    """Every RNG a step may draw from; CUDA's (one state per device) only where CUDA is available, so a CPU
    machine's checkpoints are what they always were."""
    state = {
        "torch": torch.get_rng_state(),
        "python": list(random.getstate()[1]),
        "python_version": random.getstate()[0],
        "python_gauss": random.getstate()[2],
        "numpy": np.random.get_state()[1].tolist(),
        "numpy_pos": int(np.random.get_state()[2]),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`'s record. CUDA states are restored where the machine has CUDA (as many devices as
    both have); a checkpoint without them (written on a CPU machine) leaves CUDA's RNG as it is."""
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = list(state["cuda"])[: torch.cuda.device_count()]
        for index, cuda_state in enumerate(cuda_states):
            torch.cuda.set_rng_state(cuda_state, index)
    random.setstate((state["python_version"], tuple(state["python"]), state["python_gauss"]))
    np.random.set_state(("MT19937", np.array(state["numpy"], dtype=np.uint32), state["numpy_pos"], 0, 0.0))


def model_state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """State dict without tied duplicates (safetensors refuses shared storage), contiguous, on CPU.

    A LoRA model (``model.lora.rank > 0``) saves only its adapters (:func:`tepo.lora.adapter_state_dict`): the
    base weights never change, and the run's ``model.name`` names them."""
    from tepo.lora import adapter_state_dict, is_lora

    seen: set[tuple[int, tuple]] = set()
    out = {}
    state = adapter_state_dict(model) if is_lora(model) else model.state_dict()
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue  # tied weight (lm_head = embed_tokens); tie_weights restores it on load
        seen.add(key)
        out[name] = tensor.detach().contiguous().cpu()
    return out


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    state: dict,
    keep: int = 2,
    *,
    save_optimizer: bool = True,
) -> Path:
    """Write ``run_dir/checkpoints/step_{step:06d}/`` atomically, then keep the newest ``keep`` intact checkpoints
    (0: all; ``train.keep_last``). ``state`` holds ``optimizer.state_dict()`` under ``"optimizer"``; with
    ``save_optimizer=False`` its per-parameter ``"state"`` (the moments) is left out and its ``param_groups``
    kept, and the manifest records ``"optimizer_state": false``."""
    if keep < 0:
        raise ValueError(f"keep must be >= 0 (0 keeps all), got {keep}")
    optimizer_state = OPTIMIZER_KEY in state
    if not save_optimizer and optimizer_state:
        state = {**state, OPTIMIZER_KEY: _without_moments(state[OPTIMIZER_KEY])}
        optimizer_state = False
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:06d}"
    tmp = root / f"step_{step:06d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write_into(tmp, step, model, state, optimizer_state)
    except (OSError, SafetensorError) as err:
        # A full disk (or a file-size limit) mid-write: remove the half-written copy so it does not hold the space
        # a retry needs, and say what is intact. safetensors reports I/O errors as SafetensorError, not OSError.
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failure_message(root, final, err)) from err
    if final.exists():  # a previous attempt at this step (resumed run): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    fsync_folder(root)
    _remember_intact(final)  # its files were hashed just now: pruning need not read 1.6 GB again
    prune_checkpoints(run_dir, keep, newest=final)
    return final


def _without_moments(optimizer_state: dict) -> dict:
    if not isinstance(optimizer_state, dict) or "param_groups" not in optimizer_state:
        raise ValueError(
            f'state["{OPTIMIZER_KEY}"] must be an optimizer.state_dict() (with "state" and "param_groups") '
            "to be saved without its moments"
        )
    return {**optimizer_state, "state": {}}


def _write_into(tmp: Path, step: int, model: torch.nn.Module, state: dict, optimizer_state: bool) -> None:
    tmp.mkdir()
    save_file(model_state_for_saving(model), str(tmp / "model.safetensors"))
    _torch_save({**state, STEP_KEY: step}, tmp / "state.pt")
    files = {name: _sha256(tmp / name) for name in CHECKPOINT_FILES}
    for name in files:
        with open(tmp / name, "rb") as handle:
            os.fsync(handle.fileno())
    manifest = tmp / MANIFEST
    manifest.write_text(json.dumps({"step": step, "files": files, "optimizer_state": optimizer_state}))
    with open(manifest, "rb") as handle:
        os.fsync(handle.fileno())
    fsync_folder(tmp)


def _torch_save(obj: dict, path: Path) -> None:
    """``torch.save``, its write failures raised as OSError. torch reports a full disk (or a file-size limit) as a
    RuntimeError ("basic_ios::clear: iostream error", then "unexpected pos N vs M" from its zip writer); found when
    a study's disk filled while the optimizer state, twice the model in float32, was being written."""
    try:
        torch.save(obj, path)
    except RuntimeError as err:
        cause = err.__context__ if isinstance(err.__context__, RuntimeError) else None
        detail = f"{cause}; {err}" if cause is not None else str(err)
        raise OSError(f"writing {path.name} failed: {detail}") from err


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
        f"and {intact}. Free disk space (or lower train.keep_last, or set train.save_optimizer=false) and resume with "
        f"`tepo train --resume {root.parent}`."
    )


# Checkpoints known intact in this process, by path, with the (inode, size, mtime) of their files when they were
# checked: pruning after every save would otherwise hash every kept checkpoint (1.6 GB each) again. A file
# rewritten since is checked again.
_KNOWN_INTACT: dict[Path, tuple] = {}


def _files_signature(path: Path) -> tuple | None:
    try:
        stats = [(path / name).stat() for name in (MANIFEST, *CHECKPOINT_FILES)]
    except OSError:
        return None
    return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in stats)


def _remember_intact(path: Path) -> None:
    signature = _files_signature(path)
    if signature is not None:
        _KNOWN_INTACT[path.resolve()] = signature


def _is_intact(path: Path) -> bool:
    signature = _files_signature(path)
    if signature is not None and _KNOWN_INTACT.get(path.resolve()) == signature:
        return True
    if verify_checkpoint(path) is not None:
        return False
    _remember_intact(path)
    return True


def _step_dirs(root: Path) -> list[Path]:
    """Checkpoint directories by step, oldest first (temporaries of interrupted writes excluded)."""
    found = []
    for path in root.glob("step_*"):
        if not path.is_dir() or ".tmp" in path.name:
            continue
        try:
            found.append((int(path.name.split("_", 1)[1]), path))
        except ValueError:
            continue  # not one of ours (step_backup, ...): never touched
    return [path for _, path in sorted(found)]


def prune_checkpoints(run_dir: Path, keep: int, newest: Path | None = None) -> list[str]:
    """Keep the ``keep`` newest intact checkpoints of ``run_dir`` (0: keep all) and delete the rest, broken ones
    included, and the temporaries of interrupted writes. ``newest`` (the checkpoint just written) is always kept,
    whatever its step. Returns the names deleted."""
    root = Path(run_dir) / "checkpoints"
    removed = []
    if keep > 0:
        kept = 0
        if newest is not None:
            newest = Path(newest).resolve()
            kept = 1
        for path in reversed(_step_dirs(root)):
            if newest is not None and path.resolve() == newest:
                continue
            if kept < keep and _is_intact(path):
                kept += 1
                continue
            shutil.rmtree(path, ignore_errors=True)
            _KNOWN_INTACT.pop(path.resolve(), None)
            removed.append(path.name)
    for torn in root.glob("step_*.tmp-*"):
        shutil.rmtree(torn, ignore_errors=True)  # left by a kill mid-write
        removed.append(torn.name)
    return removed


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
        return Checkpoint(
            path=path, step=int(path.name.split("_")[1]), optimizer_state=_manifest_says(path) is not False
        )
    return None


def _manifest_says(path: Path) -> bool | None:
    """The manifest's ``optimizer_state`` (None: a manifest from before the field, or unreadable)."""
    try:
        value = json.loads((path / MANIFEST).read_bytes()).get("optimizer_state")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, bool) else None


def load_checkpoint(checkpoint: Checkpoint, model: torch.nn.Module) -> CheckpointState:
    """Load the weights into ``model`` and return the saved state (``torch.load(weights_only=True)``) as a
    :class:`CheckpointState`, whose ``optimizer_state`` says whether the optimizer's moments are in it."""
    load_checkpoint_weights(checkpoint, model)
    return read_checkpoint_state(checkpoint)


def read_checkpoint_state(checkpoint: Checkpoint) -> CheckpointState:
    """The saved state of ``checkpoint`` (optimizer, schedule, RNG, data position, ...; on the CPU) without its
    weights: what a trainer reads first and hands to the parts it builds (``tepo.training.trainer``)."""
    # The state goes to the CPU (RNG states must be CPU tensors, and optimizer.load_state_dict moves the moments
    # next to their parameters), so a checkpoint written on any device resumes on any other (CPU -> CUDA and back).
    state = torch.load(checkpoint.path / "state.pt", weights_only=True, map_location="cpu")
    recorded = _manifest_says(checkpoint.path)
    # Checkpoints from before the manifest field always held the whole optimizer state dict when they held one.
    optimizer_state = recorded if recorded is not None else OPTIMIZER_KEY in state
    return CheckpointState(
        state,
        path=checkpoint.path,
        step=int(state.get(STEP_KEY, checkpoint.step)),
        optimizer_state=optimizer_state,
    )


def load_checkpoint_weights(checkpoint: Checkpoint, model: torch.nn.Module) -> None:
    """Load the weights of ``checkpoint`` into ``model`` (straight to the model's device); CheckpointError when
    they do not fit it (a LoRA checkpoint holds the adapters only: every one of them, nothing else)."""
    from tepo.lora import adapter_state_dict, is_lora

    device = next(model.parameters()).device
    weights = load_file(str(checkpoint.path / "model.safetensors"), device=str(device))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if is_lora(model):
        missing = [name for name in adapter_state_dict(model) if name not in weights]
        if missing or unexpected:
            raise CheckpointError(
                f"{checkpoint.path}: weights do not fit the LoRA model (missing adapters {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}); was it written with the same model.lora settings?"
            )
        missing = []
    tied = {name for name in missing if "lm_head" in name}
    if unexpected or set(missing) - tied:
        raise CheckpointError(
            f"{checkpoint.path}: weights do not fit the model (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    if tied:
        model.tie_weights()


def resume_without_optimizer_note(checkpoint: Checkpoint | CheckpointState, allowed: bool) -> str | None:
    """Check a resume from ``checkpoint`` (found or loaded) against ``train.resume_without_optimizer``.

    None when the checkpoint holds the optimizer's moments (an exact resume). Without them: raises
    :class:`OptimizerStateMissing` unless ``allowed``, and otherwise returns the one-line note the trainer must
    log (and record) saying that this resume is not exact."""
    if checkpoint.optimizer_state:
        return None
    where = f"{checkpoint.path} (step {checkpoint.step})"
    if not allowed:
        raise OptimizerStateMissing(
            f"checkpoint {where} was saved with train.save_optimizer=false: it holds the weights, scheduler, RNG "
            "and data position but not the optimizer's moments, so resuming from it cannot continue the run "
            "exactly. To resume anyway (the moments restart from zero), add train.resume_without_optimizer=true, "
            f"e.g. `tepo train --resume {Path(checkpoint.path).parent.parent} train.resume_without_optimizer=true`."
        )
    return (
        f"resuming from {where} WITHOUT optimizer state (train.resume_without_optimizer=true): the optimizer's "
        "moments restart from zero and its bias correction from step 1, so this run is not an exact continuation "
        "of the one that wrote the checkpoint"
    )
