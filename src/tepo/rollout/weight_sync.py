"""The trainer's weights for the vLLM engine (:mod:`tepo.rollout.vllm`): written as one safetensors file into a
folder the engine starts from and reloads in place at each sync.

Where: ``/dev/shm`` (memory, not disk) when it has room for two copies, else a folder on disk
(:func:`choose_weights_root`). What: the model's weights in the engine's dtype, a LoRA model's merged into its base
weights (:func:`tepo.lora.merged_state_dict`; docs/performance.md says why), a tied output head written untied
(:func:`write_weights`). When: whenever the parameters' version counters moved (:func:`weights_version`). Left-over
folders of runs that were killed with their server are removed by the next run (:func:`sweep_orphaned_weight_dirs`).
"""

from __future__ import annotations

import json
import os
import shutil
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


def write_weights(model, folder: Path, dtype: torch.dtype) -> float:
    """Write ``model``'s weights as ``folder/model.safetensors`` (plus its config once); returns the bytes written.

    Tied weights are written *untied* (``lm_head.weight`` as a copy of the input embedding, and
    ``tie_word_embeddings: false`` in the config): vLLM's in-place ``reload_weights`` replaces layers one by one and
    keeps a tied ``lm_head``'s old tensor (measured: vLLM 0.32 logs "ParallelLMHead: Failed to load weights" and
    samples from the stale head), while an untied head is reloaded like any layer. The cost is one
    embedding-sized copy (28M parameters for the embedded model).
    Written to a temporary name and renamed, so the server never reads a half-written file.
    """
    from safetensors.torch import save_file

    from tepo.lora import merged_state_dict

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {  # a LoRA model's merged weights W0 + (alpha/r) B A, under the base model's names
        name: tensor.detach().to(device="cpu", dtype=dtype).contiguous()
        for name, tensor in merged_state_dict(model).items()
    }
    output = model.get_output_embeddings()
    if output is not None and "lm_head.weight" not in tensors:
        tensors["lm_head.weight"] = output.weight.detach().to(device="cpu", dtype=dtype).contiguous()
    # safetensors refuses tensors that share memory; .to() of a tied pair may return one tensor twice.
    seen = set()
    for name, tensor in tensors.items():
        if tensor.data_ptr() in seen:
            tensors[name] = tensor.clone()
        seen.add(tensors[name].data_ptr())
    # Rewritten at every sync and never read after a crash (a resumed run writes it anew): the rename keeps the
    # engine from reading half a file, and an fsync of 0.3-3 GB per step would only cost time (durable=False).
    atomic_write_with(
        folder / "model.safetensors",
        lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}),
        durable=False,
    )
    if not (folder / "config.json").exists():
        config = model.config.to_dict()
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"]["tie_word_embeddings"] = False
        (folder / "config.json").write_text(json.dumps(config, indent=2))
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.to_json_file(str(folder / "generation_config.json"))
    return float(sum(t.numel() * t.element_size() for t in tensors.values()))


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
    """Where the weight-sync files live: ``/dev/shm`` (RAM: the sync is a memory copy) when it has room for two of
    them (a sync writes the new file next to the old one, then renames), else a folder on disk, with one line saying
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
    if free >= 2 * needed + margin:
        return shm, None
    return fallback, (
        f"weight sync: {shm} has {free / 2**30:.2f} GiB free, a sync needs {2 * needed / 2**30:.2f} GiB (two "
        f"copies of the {needed / 2**30:.2f} GiB weights file); using {fallback} on disk instead (slower; raise "
        "the container's --shm-size to keep it in memory)"
    )
