"""The device a run trains on (``train.device``): ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

``auto`` (the default) is CUDA where ``torch.cuda.is_available()``, else the CPU. The setting's form is checked
with the rest of the config (:func:`device_setting_error`, a pure string check, so a run directory written on a
GPU machine still loads for a report elsewhere); whether the machine has the device is checked when a run starts
(:func:`resolve_device`), before any data or model loads, with one line saying what is missing.

Everything of a step lives on the device: the policy and the reference model, the rollout batch (moved there once
per step, :meth:`tepo.rollout.base.RolloutBatch.to`), rewards, advantages, log-probs and losses, the optimizer's
moments. Row indices stay on the host on purpose (they come from a CPU generator, so a seed shuffles the same way on
every device; indexing a device tensor with host indices is allowed). Precision is the same on every device:
float32 master weights and bf16 autocast of the log-prob passes (``model.autocast_bf16``), so a CUDA run is
comparable with a CPU one (not bit-identical: the kernels differ).
"""

from __future__ import annotations

import os
import re

import torch

DEVICE_SETTINGS = "auto, cpu, cuda or cuda:N"
_FORM = re.compile(r"auto|cpu|cuda(:\d+)?")


def device_setting_error(setting) -> str | None:
    """The one-line problem with a ``train.device`` value's form, or None when it is well formed."""
    if not isinstance(setting, str) or not _FORM.fullmatch(setting):
        return f"train.device: expected {DEVICE_SETTINGS}, got {setting!r}"
    return None


def resolve_device(setting: str) -> torch.device:
    """The device ``setting`` names on this machine; ``ValueError`` (one line) when the machine lacks it.

    Reads only ``torch.cuda.is_available()`` and ``torch.cuda.device_count()``: nothing is allocated.
    """
    problem = device_setting_error(setting)
    if problem is not None:
        raise ValueError(problem)
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(setting)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"train.device={setting}: this machine has no CUDA device usable by torch {torch.__version__} "
                "(torch.cuda.is_available() is False); use train.device=cpu or auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"train.device={setting}: this machine has {count} CUDA device(s) (cuda:0 ..)")
    return device


def autocast_device_type(device: torch.device) -> str:
    """The ``device_type`` argument of ``torch.autocast`` for tensors on ``device``."""
    return "cuda" if device.type == "cuda" else "cpu"


def visible_device_for_child(device: torch.device) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a child process (the vLLM server) that must use this process's ``device``.

    Device indices count within this process's own ``CUDA_VISIBLE_DEVICES`` when it has one, so the child gets the
    entry at that index (the physical GPU), not the index itself.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[index] if index < len(visible) else str(index)


def gpu_share_note(device: torch.device, engine_share: float) -> str:
    """The start-up line of a run whose rollout engine shares the trainer's GPU: what each may take."""
    total = torch.cuda.get_device_properties(device).total_memory / 2**30
    return (
        f"vLLM and the trainer share {device} ({total:.0f} GiB): the engine may take "
        f"rollout.vllm.gpu_memory_utilization={engine_share:g} ({engine_share * total:.1f} GiB), the trainer keeps "
        f"{(1 - engine_share) * total:.1f} GiB"
    )
