"""What the vLLM engine holds of the trainer's weights, and what the next sync must send it.

:class:`EngineWeights` owns the folder the server starts from and reloads (``/dev/shm`` where it fits,
:mod:`tepo.rollout.weight_sync` writes it), the weights version the engine last loaded, whether the model changed
since, and a staged copy: with overlapped rollouts (``rollout.async_steps=1``) the weights are written once
before the background rollout, which then samples that copy while the model is mid-update in another thread.
:meth:`EngineWeights.to_load` is the one decision of a sync: which version to load, written where it must be.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from tepo.rollout.weight_sync import (
    WEIGHTS_DIR_PREFIX,
    WeightsFile,
    choose_weights_root,
    sweep_orphaned_weight_dirs,
    weights_bytes,
    weights_version,
)


class EngineWeights:
    """The engine's copy of ``model``'s weights in ``dtype`` (a torch dtype name), in a fresh folder, written
    at once (the server starts from it); ``log`` says where, when not in memory."""

    def __init__(self, model, dtype: str, log, *, keep_file: bool = True):
        self.model = model
        # rollout.vllm.keep_weights_file. True: one file for the run, overwritten in place (faster; one copy of the
        # weights held in RAM). False: deleted once the engine has loaded it, written anew at the next sync.
        self.keep_file = keep_file
        self.dtype = getattr(torch, dtype)
        self.synced_version = weights_version(model)
        self.stale = False  # the model changed since the last sync (weights_updated)
        self.use_staged = False  # the next syncs load the staged copy (stage), not the model
        self.staged_version = None
        weights_root, note = choose_weights_root(weights_bytes(model, self.dtype))
        if note:
            log(note)
        sweep_orphaned_weight_dirs(weights_root)
        self.dir = Path(tempfile.mkdtemp(prefix=WEIGHTS_DIR_PREFIX, dir=weights_root))
        self.file = WeightsFile(self.dir, self.dtype)
        self.file.write(model)

    def stage(self) -> None:
        """Write the model's weights now, if they changed; until :meth:`end_staging` a sync loads this copy."""
        version = weights_version(self.model)
        if self.stale or version != self.synced_version:
            self.file.write(self.model)
            self.staged_version = version
        self.stale = False
        self.use_staged = True

    def end_staging(self) -> None:
        self.use_staged = False

    def to_load(self, force: bool = False):
        """The weights version a sync sends the engine now, written into the folder; None when there is none.

        While staging: the staged copy, once (every generate of the background rollout samples it; the first
        loads it), and the model is not read. Otherwise the model's weights, when they changed since the last
        sync (or ``force``)."""
        if self.use_staged:
            version, self.staged_version = self.staged_version, None
            return version
        version = weights_version(self.model)
        if not (force or self.stale or version != self.synced_version):
            return None
        self.file.write(self.model)
        return version

    def started(self) -> None:
        """The engine started from the file."""
        self._drop_unless_kept()

    def loaded(self, version, *, staged: bool) -> None:
        """The engine loaded ``version``; a change of the model during staging still waits for the next sync."""
        self._drop_unless_kept()
        self.synced_version = version
        if not staged:
            self.stale = False

    def _drop_unless_kept(self) -> None:
        # Without keep_file the engine has copied the weights into its own tensors and the file (RAM, in /dev/shm)
        # is deleted until the next sync writes it again. The config files stay: vLLM's reload reads them.
        if not self.keep_file:
            self.file.delete()

    def release(self) -> None:
        """Unmap the weights file (the folder itself goes with the server: tepo.rollout.vllm_pipe)."""
        self.file.release()
