"""``train.deterministic``: the same run twice gives bit-identical weights on CUDA too.

On the CPU tepo's step is already deterministic (the resume tests compare weights with ``torch.equal``). On CUDA
two kernels it uses are not, so a resumed run would drift from the uninterrupted one in the last bits:

* the backward of ``index_select`` (the shared-prompt pass, ``tepo.logprobs``) accumulates with atomics;
* the memory-efficient and flash SDPA backward kernels on padded batches accumulate in a run-dependent order.

``make_deterministic`` turns on ``torch.use_deterministic_algorithms`` (the deterministic ``index_select``
backward), sets ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS refuses deterministic mode without it), turns cuDNN
autotuning off, and leaves only the math SDPA kernel enabled. Cost (not measured here: no GPU has been lent to
the project yet): the math kernel materialises the ``[rows, heads, cols, cols]`` attention weights, like eager
attention, so its memory grows with the square of the width, and the deterministic accumulations are slower.
It is for checks (the GPU resume test, ``scripts/gpu_check.py``), not for production runs.
"""

from __future__ import annotations

import os

import torch

CUBLAS_WORKSPACE = ":4096:8"


def make_deterministic(device: torch.device) -> str:
    """Switch this process to deterministic kernels; returns the one line the trainer logs."""
    # Read by cuBLAS when its first handle is created (the first matmul): set before the model runs.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)
    return (
        "train.deterministic: deterministic algorithms on, CUBLAS_WORKSPACE_CONFIG="
        f"{os.environ['CUBLAS_WORKSPACE_CONFIG']}, "
        + (
            "math SDPA attention only (slower, more memory)"
            if device.type == "cuda"
            else "CPU: no kernel changes"
        )
    )
