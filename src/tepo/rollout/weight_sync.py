"""The trainer's weights for the vLLM engine (:mod:`tepo.rollout.vllm`): one safetensors file in a folder the
engine starts from and reloads in place at each sync, the file itself overwritten in place (:class:`WeightsFile`).

Where: ``/dev/shm`` (memory, not disk) when it has room for the file, else a folder on disk
(:func:`choose_weights_root`). What: the model's weights in the engine's dtype, a LoRA model's merged into its base
weights (:func:`tepo.lora.merged_state_dict`; docs/performance.md says why), a tied output head written untied
(:func:`engine_tensors`). When: whenever the parameters' version counters moved (:func:`weights_version`). Left-over
folders of runs that were killed with their server are removed by the next run (:func:`sweep_orphaned_weight_dirs`).
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch

from tepo.files import atomic_write_with

WEIGHTS_DIR_PREFIX = "tepo-vllm-weights-"
OWNERS_FILE = "owners.pid"  # the trainer's and the server's pids, one a line: see sweep_orphaned_weight_dirs


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_orphaned_weight_dirs(root: Path) -> list[Path]:
    """Remove weight folders in ``root`` whose trainer and server are both gone; returns the folders removed.

    Each folder holds a model's worth of weights in ``/dev/shm``, i.e. in RAM. The server removes its folder when it
    exits and ``close()`` does too, but a run whose trainer *and* server were SIGKILLed (an OOM kill, a killed job
    group) leaves it behind, 311 MB for the embedded model each time, until the machine reboots. Folders without an
    owners file (another tool's, or one being set up right now) are left alone."""
    removed = []
    for folder in sorted(Path(root).glob(WEIGHTS_DIR_PREFIX + "*")):
        try:
            pids = [int(line) for line in (folder / OWNERS_FILE).read_text().split()]
        except (OSError, ValueError):
            continue
        if pids and not any(_pid_alive(pid) for pid in pids):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


# safetensors' names of the dtypes an engine loads (https://github.com/huggingface/safetensors, "Format").
SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def engine_tensors(model) -> dict[str, torch.Tensor]:
    """What the engine loads, under its checkpoint names, still in the trainer's dtype: a LoRA model's merged
    weights ``W0 + (alpha/r) B A`` under the base model's names (:func:`tepo.lora.merged_state_dict`), and a tied
    output head as an entry of its own (``lm_head.weight``; :class:`WeightsFile` says why)."""
    from tepo.lora import merged_state_dict

    tensors = {name: tensor.detach() for name, tensor in merged_state_dict(model).items()}
    output = model.get_output_embeddings()
    if output is not None and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = output.weight.detach()
    return tensors


def safetensors_header(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype) -> tuple[bytes, dict]:
    """The header of a safetensors file holding ``shapes`` in ``dtype``, in that order, and each tensor's byte
    range in the data that follows it. Layout: an 8-byte little-endian length, then the JSON header padded with
    spaces to a multiple of 8 bytes (so that every tensor starts aligned), then the tensors back to back."""
    size = torch.empty((), dtype=dtype).element_size()
    entries, ranges, offset = {}, {}, 0
    for name, shape in shapes.items():
        nbytes = size * math.prod(shape)
        entries[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]
        }  # fmt: skip
        ranges[name] = (offset, offset + nbytes)
        offset += nbytes
    entries["__metadata__"] = {"format": "pt"}
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, ranges


class WeightsFile:
    """``folder/model.safetensors``, the engine's copy of the weights: created once, then overwritten in place.

    The first :meth:`write` creates the file at its full size (header, then the data as zeros: a temporary name
    renamed into place) and maps it into this process; each write then casts every tensor straight into its
    place in the mapping. A sync so writes the model's bytes once, with no model-sized copy in between and no new
    pages to allocate (allocating 330 MB of fresh /dev/shm pages was most of the 0.26 s a sync's write took when
    each sync wrote a new file: docs/performance.md, "The weight-sync file, kept"). The price: the file stays for
    the run, one copy of the weights in the engine's dtype (311 MB for the embedded model in bf16), which the old
    way deleted after each load and wrote again before the next.

    The engine reads the file only when it is told to reload, after :meth:`write` has returned, so it never
    sees a half-written sync. Tied weights are written *untied* (``lm_head.weight`` as a copy of the input
    embedding, and ``tie_word_embeddings: false`` in the config): vLLM's in-place ``reload_weights`` replaces
    layers one by one and keeps a tied ``lm_head``'s old tensor (measured: vLLM 0.32 logs "ParallelLMHead: Failed
    to load weights" and samples from the stale head), while an untied head is reloaded like any layer.
    """

    def __init__(self, folder: Path, dtype: torch.dtype):
        self.folder, self.dtype = Path(folder), dtype
        self.path = self.folder / "model.safetensors"
        self._views: dict[str, torch.Tensor] | None = None
        self._shapes: dict[str, tuple[int, ...]] | None = None
        self._mapping: mmap.mmap | None = None

    def write(self, model) -> float:
        """Write ``model``'s weights (plus its config, once); returns the bytes of weights written."""
        tensors = engine_tensors(model)
        shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
        if self._views is None or shapes != self._shapes or not self.path.exists():
            self._create(shapes)
        with torch.no_grad():
            for name, tensor in tensors.items():
                self._views[name].copy_(tensor)  # casts to the engine's dtype on the way
        write_config_once(model, self.folder)
        return float(sum(view.numel() * view.element_size() for view in self._views.values()))

    def _create(self, shapes: dict[str, tuple[int, ...]]) -> None:
        self.release()
        self.folder.mkdir(parents=True, exist_ok=True)
        header, ranges = safetensors_header(shapes, self.dtype)
        total = len(header) + (max(end for _, end in ranges.values()) if ranges else 0)

        def blank(tmp: Path) -> None:
            with open(tmp, "wb") as out:
                out.write(header)
                out.flush()
                # Reserve every page now: a full /dev/shm then fails here with ENOSPC, an OSError, instead of
                # killing the process with SIGBUS when a write through the mapping finds no page.
                os.posix_fallocate(out.fileno(), 0, total)

        # Never read after a crash (a resumed run writes a new folder): no fsync (durable=False).
        atomic_write_with(self.path, blank, durable=False)
        with open(self.path, "r+b") as handle:
            self._mapping = mmap.mmap(handle.fileno(), total)
        data = torch.frombuffer(self._mapping, dtype=torch.uint8)[len(header) :]
        self._views = {
            name: data[start:end].view(self.dtype).view(shapes[name]) for name, (start, end) in ranges.items()
        }
        self._shapes = shapes

    def release(self) -> None:
        """Unmap the file (it stays on disk); the next :meth:`write` creates it anew."""
        self._views = self._shapes = None
        if self._mapping is not None:
            mapping, self._mapping = self._mapping, None
            # A view still referenced somewhere keeps the mapping open; it is unmapped with that view.
            with contextlib.suppress(BufferError):
                mapping.close()

    def delete(self) -> None:
        """Unmap and delete the file (its RAM, in /dev/shm, goes back); the next :meth:`write` creates it anew."""
        self.release()
        self.path.unlink(missing_ok=True)


def write_config_once(model, folder: Path) -> None:
    """The engine's ``config.json`` (with ``tie_word_embeddings: false``, as :class:`WeightsFile` writes the
    head) and ``generation_config.json``, written when the folder has none."""
    if (folder / "config.json").exists():
        return
    config = model.config.to_dict()
    config["tie_word_embeddings"] = False
    if isinstance(config.get("text_config"), dict):
        config["text_config"]["tie_word_embeddings"] = False
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.to_json_file(str(folder / "generation_config.json"))


def write_weights(model, folder: Path, dtype: torch.dtype) -> float:
    """Write ``model``'s weights once as ``folder/model.safetensors`` in ``dtype`` (plus its config); returns the
    bytes written. For a file written at every sync, keep a :class:`WeightsFile`."""
    weights = WeightsFile(folder, dtype)
    try:
        return weights.write(model)
    finally:
        weights.release()


def weights_version(model) -> tuple:
    # Every in-place update (optimizer.step, load_state_dict, copy_) bumps a tensor's version counter.
    return tuple((id(p), p._version) for p in model.parameters())


SHM = Path("/dev/shm")


def weights_bytes(model, dtype: torch.dtype) -> int:
    """Size of one :func:`write_weights` file: every parameter in ``dtype``, plus the untied copy of a tied head."""
    size = torch.empty((), dtype=dtype).element_size()
    total = sum(p.numel() for p in model.parameters()) * size
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if output is not None and inputs is not None and output.weight is inputs.weight:
        total += output.weight.numel() * size
    return int(total)


def choose_weights_root(
    needed: int, *, shm: Path = SHM, fallback: Path | None = None
) -> tuple[Path, str | None]:
    """Where the weight-sync file lives: ``/dev/shm`` (RAM: the sync is a memory copy) when it has room for it (it
    is kept for the run and overwritten in place: :class:`WeightsFile`), else a folder on disk, with one line saying
    so. A default Docker container's /dev/shm is 64 MB, and Qwen2.5-1.5B's file is 3 GB in bf16: writing there
    failed with "No space left on device" halfway through the first sync.

    A faster path on CUDA, not built here because it cannot be tested without a GPU: hand the engine CUDA-IPC
    handles of the trainer's tensors over the pipe instead of a file, as verl does (``verl/workers/rollout/
    vllm_rollout/``: ``vLLMColocateWorkerExtension.update_weights_from_ipc``, buckets of weights passed by
    handle); see docs/performance.md, "Weight sync".
    """
    fallback = Path(tempfile.gettempdir()) if fallback is None else fallback
    if not shm.is_dir():
        return fallback, None
    free = shutil.disk_usage(shm).free
    margin = 64 * 2**20
    if free >= needed + margin:
        return shm, None
    return fallback, (
        f"weight sync: {shm} has {free / 2**30:.2f} GiB free, the weights file needs {needed / 2**30:.2f} GiB; "
        f"using {fallback} on disk instead (slower; raise the container's --shm-size to keep it in memory)"
    )
