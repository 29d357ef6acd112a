"""A CPU platform for verl 0.9.1, for tests: verl's FSDP2 engine on CPU processes talking over gloo.

verl 0.9.1 has no CPU platform (verl issue #3266): on a machine without a GPU its platform auto-detection falls
back to ``nvidia`` and the engine calls ``torch.cuda``. verl's supported hook for a new device is a platform
class registered in ``verl.plugin.platform.PlatformRegistry`` by a module named in ``VERL_USE_EXTERNAL_MODULES``
(imported at ``import verl``, before any verl module asks for the platform). This is that module:

    VERL_USE_EXTERNAL_MODULES=verl_cpu_platform PYTHONPATH=tests python ...

Importing it (before ``verl.workers`` is imported, which caches the device name at import) does four things:

1. registers `PlatformCPU` (device ``cpu``, backend ``gloo``, vendor ``cpu``) and makes it verl's platform
   (``set_platform``); its ``device_module`` is `cpu_device_module`: ``torch.cpu`` plus the memory statistics
   torch lacks on CPU (``memory_allocated`` and friends report 0; ``mem_get_info`` reports host memory), which
   verl's worker logs after every step;
2. fixes verl's process-group backend string: ``verl.utils.distributed`` builds
   ``"cpu:gloo,{device}:{backend}"``, which for device ``cpu`` is ``"cpu:gloo,cpu:gloo"`` and torch refuses
   ("Duplicate device type cpu"); both init functions get ``"cpu:gloo"`` instead;
3. registers verl's FSDP engines (``fsdp``, ``fsdp2``; language and value model) under the engine registry's
   device key ``cpu`` (verl registers them for ``cuda`` and ``npu`` only);
4. nothing about ``ReduceOp.AVG``: verl's worker all-reduces its loss metric with ``AVG`` and FSDP2 averages
   gradients; torch 2.13's gloo supports ``AVG`` (checked by tests/integrations/test_integration_verl_engine.py on 2 ranks),
   so no emulation is installed.

The settings verl needs on CPU besides the platform are `MODEL_SETTINGS` / `ENGINE_SETTINGS` (and the same as
Hydra overrides, `HYDRA_OVERRIDES`): sdpa attention (verl defaults to flash_attention_2), no remove-padding
(without flash-attn's varlen kernels packed sequences would attend across each other), no torch.compile, FSDP2,
float32 parameters and reductions (verl's default mixed precision is bf16 parameters; exact comparisons need fp32).

Why in the test tree and not shipped as ``tepo.integrations.verl_cpu``: it is proven for verl's engine
(forward, backward, gradient reduction, optimizer step) and nothing else. verl's Ray trainer needs a rollout
replica (vLLM/SGLang, GPU-only in verl 0.9.1) and Ray resources (`PlatformCPU.ray_resource_options` is untested),
so it would not yet let a user run a verl recipe on a laptop, and it patches verl's module functions (2.), which
a shipped module should not do silently. It contains nothing of tepo.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import psutil
import torch
import verl.utils.distributed as verl_distributed
from verl.plugin.platform import PlatformBase, PlatformRegistry, set_platform

PLATFORM_NAME = "cpu"
GLOO = "cpu:gloo"

# Settings verl needs on CPU, written once (HFModelConfig / FSDPEngineConfig fields; the same as Hydra overrides).
MODEL_SETTINGS: dict[str, Any] = {
    "use_remove_padding": False,  # packed sequences need flash-attn's varlen kernels
    "override_config": {"attn_implementation": "sdpa"},  # verl's default is flash_attention_2
    "enable_gradient_checkpointing": False,  # not needed at test sizes; saves the recompute on 2 cores
}
ENGINE_SETTINGS: dict[str, Any] = {
    "strategy": "fsdp2",
    "use_torch_compile": False,  # inductor on CPU compiles for minutes and needs a C++ toolchain
    "model_dtype": "fp32",
    "mixed_precision": {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"},
}
HYDRA_OVERRIDES: list[str] = [
    "trainer.device=cpu",
    "actor_rollout_ref.model.use_remove_padding=False",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.enable_gradient_checkpointing=False",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.actor.use_torch_compile=False",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
]


def _zero(*args, **kwargs) -> int:
    return 0


def _mem_get_info(*args, **kwargs) -> tuple[int, int]:
    memory = psutil.virtual_memory()
    return memory.available, memory.total


def _make_device_module() -> types.ModuleType:
    """``torch.cpu`` plus the ``torch.cuda`` memory calls verl makes (no allocator statistics exist on CPU)."""
    module = types.ModuleType("verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("_"):
            setattr(module, name, getattr(torch.cpu, name))
    for name in (
        "memory_allocated",
        "memory_reserved",
        "max_memory_allocated",
        "max_memory_reserved",
        "reset_peak_memory_stats",
    ):
        setattr(module, name, _zero)
    module.mem_get_info = _mem_get_info
    module.get_device_name = lambda device=None: "CPU"  # verl's FlopsCounter looks it up in its table
    module.empty_cache = lambda: None
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    return module


cpu_device_module = _make_device_module()


@PlatformRegistry.register(platform=PLATFORM_NAME)
class PlatformCPU(PlatformBase):
    """verl platform whose device is the CPU and whose collectives are gloo's."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return cpu_device_module

    def is_available(self) -> bool:
        return True

    def current_device(self) -> str:
        # verl uses it as a device for `.to(...)` / `torch.device(...)`; "cpu" is what both accept on CPU
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "VERL_CPU_VISIBLE_DEVICES"  # no such devices; verl only reads it

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # Ray refuses "CPU" as a custom resource (untested: Ray is not run here)
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def _initialize_global_process_group_ray(timeout_second=None, backend=None):
    return _verl_init_ray(timeout_second=timeout_second, backend=backend or GLOO)


def _initialize_global_process_group(timeout_second=36000):
    import datetime
    import os

    torch.distributed.init_process_group(
        backend=GLOO,
        timeout=datetime.timedelta(seconds=timeout_second),
        init_method=os.environ.get("DIST_INIT_METHOD", None),
    )
    return int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def _register_engines_for_cpu() -> list[tuple[str, str]]:
    from verl.workers.engine import EngineRegistry

    added = []
    for model_type, backends in EngineRegistry._engines.items():
        for backend in ("fsdp", "fsdp2"):
            engines = backends.get(backend, {})
            if "cuda" in engines and PLATFORM_NAME not in engines:
                engines[PLATFORM_NAME] = engines["cuda"]
                added.append((model_type, backend))
    return added


set_platform(PlatformCPU())
_verl_init_ray = verl_distributed.initialize_global_process_group_ray
verl_distributed.initialize_global_process_group_ray = _initialize_global_process_group_ray
verl_distributed.initialize_global_process_group = _initialize_global_process_group
CPU_ENGINES = _register_engines_for_cpu()
