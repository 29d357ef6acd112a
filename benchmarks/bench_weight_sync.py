"""Weight-sync time per GB on the CPU build (issue #35, item 4; docs/performance.md, "The CUDA path").

``write_weights`` alone (best of 3) to /dev/shm and to a folder on disk, bf16 and float32, then the full sync
(write + the vLLM server's reload) of a float32 engine, 3 times. Embedded model SmolLM2-135M-Instruct.

    .venv/bin/python benchmarks/bench_weight_sync.py
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import torch

from tepo.models import embedded_model_dir, load_model_and_tokenizer
from tepo.rollout.vllm import VLLMRollout
from tepo.rollout.weight_sync import weights_bytes, write_weights

DISK = Path(__file__).resolve().parents[1] / ".sync_measure_tmp"


def main() -> None:
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(str(embedded_model_dir()))
    for dtype in (torch.bfloat16, torch.float32):
        gb = weights_bytes(model, dtype) / 1e9
        for root in (Path("/dev/shm"), DISK):
            root.mkdir(exist_ok=True)
            folder = Path(tempfile.mkdtemp(dir=root))
            times = []
            for _ in range(3):
                start = time.perf_counter()
                write_weights(model, folder, dtype)
                times.append(time.perf_counter() - start)
            shutil.rmtree(folder)
            best = min(times)
            print(f"write_weights {dtype} to {root}: {gb:.3f} GB, best {best:.2f} s -> {best / gb:.2f} s/GB")
    shutil.rmtree(DISK, ignore_errors=True)
    with VLLMRollout(model, tok, dtype="float32") as engine:
        gb = weights_bytes(model, torch.float32) / 1e9
        times = []
        for _ in range(3):
            engine.sync_weights(force=True)
            times.append(engine.last_sync_seconds)
        shown = ", ".join(f"{t:.2f}" for t in times)
        print(
            f"full sync (write + reload), float32: {gb:.3f} GB, {shown} s -> best {min(times) / gb:.2f} s/GB"
        )


if __name__ == "__main__":
    main()
