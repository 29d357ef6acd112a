"""Which precision a run computes in, chosen from the hardware: the one place that decides.

Three settings choose a precision (``model.autocast_bf16``: the trainer's log-prob passes; ``rollout.autocast_bf16``:
HF generate; ``rollout.vllm.dtype``: the vLLM engine's weights). Each accepts ``auto``, the default: bf16 where
the hardware computes it natively, float32 elsewhere. An explicit value wins.

Why it matters: bf16 on a CPU without bf16 instructions is emulated by oneDNN. Measured on a 2-core AMD EPYC Zen 3
(AVX2 only), one forward+backward of the embedded model over 8 x 128 tokens took 7.5 s in float32 and 210-217 s
under bf16 autocast (28x slower); on a Zen 4 with ``avx512_bf16`` bf16 autocast made the update about 1.8x faster
(``benchmarks/bench_precision.py``, ``docs/results/hardware/``).

What counts as native (:func:`native_bf16`):

- x86-64 CPU: the ``avx512_bf16`` or ``amx_bf16`` flag in ``/proc/cpuinfo`` (AVX512-BF16: Zen 4, Cooper Lake,
  Sapphire Rapids and later; AMX: Sapphire Rapids and later);
- aarch64 CPU: the ``bf16`` feature (Armv8.6-A BF16: Graviton 3, Neoverse V1/N2, Apple M2 and later);
- CUDA: ``torch.cuda.is_bf16_supported()`` (Ampere and later);
- anything else: not native (float32; a correct choice everywhere, only sometimes slower).

A training run resolves its config once (:func:`resolve_run_precision`) and records the result in its run
directory (``precision.json``), so a resumed run keeps it wherever it resumes.

``tepo eval`` keeps its own protocol (:func:`evaluation_dtype`): float32 weights on the CPU for exact reference
scores, bf16 on a GPU that computes it natively.
"""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

AUTO = "auto"
CPUINFO = Path("/proc/cpuinfo")
# The CPU flags that decide (and that `tepo env` shows): bf16 instructions, and the vector units around them.
X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
REPORTED_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "bf16",
    "asimd",
)
# What bf16 costs where it is emulated, for the one warning line (measured: see the module docstring).
EMULATED_BF16_COST = (
    "bf16 is emulated there: one forward+backward of the embedded model measured 28x slower than float32 on an "
    "AVX2-only Zen 3"
)


@dataclass(frozen=True)
class CpuInfo:
    """What the CPU is and which of its flags matter here."""

    model: str
    machine: str  # platform.machine(): x86_64, aarch64, ...
    flags: frozenset[str]

    @property
    def native_bf16(self) -> bool:
        if self.machine in ("x86_64", "AMD64", "i686"):
            return any(flag in self.flags for flag in X86_BF16_FLAGS)
        if self.machine in ("aarch64", "arm64"):
            return "bf16" in self.flags
        return False

    def reported_flags(self) -> list[str]:
        return [flag for flag in REPORTED_FLAGS if flag in self.flags]


def parse_cpuinfo(text: str, machine: str) -> CpuInfo:
    """The model name and flags of the first processor in ``/proc/cpuinfo``-style ``text`` (x86 ``flags``, Arm
    ``Features``)."""
    model, flags = "", frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(model=model or platform.processor() or "unknown CPU", machine=machine, flags=flags)


@lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    """This machine's CPU (read once). Where ``/proc/cpuinfo`` is missing (macOS, Windows) the flags are empty, so
    nothing is taken as native: float32, the safe choice."""
    try:
        text = CPUINFO.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.machine())


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device computes bf16 natively, and the reason in words (shown in the banner and `tepo env`)."""

    native: bool
    reason: str
    hardware: str  # the CPU or GPU model


def native_bf16(device: str = "cpu", *, cpu: CpuInfo | None = None) -> Bf16Support:
    """Whether ``device`` (``cpu``, ``cuda`` or ``cuda:N``; a ``torch.device`` works too) computes bf16 natively.

    ``cpu`` replaces this machine's CPU (tests fake flags with it).
    """
    kind = str(device).split(":")[0]
    if kind == "cuda":
        import torch

        index = torch.device(str(device)).index
        name = torch.cuda.get_device_name(index)
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return Bf16Support(True, f"{name} computes bf16 natively", name)
        return Bf16Support(False, f"{name} has no native bf16 (before Ampere): float32", name)
    cpu = cpu or cpu_info()
    if cpu.native_bf16:
        found = [flag for flag in (*X86_BF16_FLAGS, "bf16") if flag in cpu.flags]
        return Bf16Support(True, f"CPU {cpu.model} has {'/'.join(found)}: native bf16", cpu.model)
    wanted = "avx512_bf16 or amx_bf16" if cpu.machine in ("x86_64", "AMD64", "i686") else "the bf16 feature"
    return Bf16Support(
        False, f"CPU {cpu.model} lacks {wanted}: bf16 would be emulated, float32 is faster", cpu.model
    )


@dataclass(frozen=True)
class Precision:
    """The resolved precision of a run: what each of the three settings became, and why."""

    model_autocast_bf16: bool
    rollout_autocast_bf16: bool
    vllm_dtype: str
    reason: str
    hardware: str
    native_bf16: bool

    @property
    def label(self) -> str:
        """One word for tables: ``bf16`` (autocast of the update) or ``float32``."""
        return "bf16" if self.model_autocast_bf16 else "float32"

    def banner(self) -> str:
        return (
            f"precision: update {'bf16 autocast' if self.model_autocast_bf16 else 'float32'}, HF generate "
            f"{'bf16 autocast' if self.rollout_autocast_bf16 else 'float32'}, vLLM {self.vllm_dtype} ({self.reason})"
        )

    def as_dict(self) -> dict:
        return asdict(self)


def _is_auto(value) -> bool:
    return value is None or (isinstance(value, str) and value.lower() == AUTO)


def resolve_precision(model_autocast_bf16, rollout_autocast_bf16, vllm_dtype, device="cpu", *, cpu=None):
    """``(Precision, warnings)`` for the three settings on ``device``: ``auto`` becomes the hardware's choice
    (:func:`native_bf16`), an explicit value is kept; ``rollout_autocast_bf16=None`` is HF generate's standalone
    default (:func:`standalone_generate_autocast`), for a backend built without a run's config. ``warnings``: one line per explicit bf16 setting on a
    device without native bf16, saying what it costs there."""
    support = native_bf16(device, cpu=cpu)
    slow_bf16 = []  # explicit bf16 settings on hardware that emulates it

    def choose(name, value, bf16, fp32):
        if _is_auto(value):
            return bf16 if support.native else fp32, True
        if value == bf16 and not support.native:
            slow_bf16.append(f"{name}={_yaml(value)}")
        return value, False

    model, model_auto = choose("model.autocast_bf16", model_autocast_bf16, True, False)
    if rollout_autocast_bf16 is None:  # the HF backend built on its own, without a run's config
        rollout, rollout_auto = standalone_generate_autocast(device, cpu=cpu), True
    else:
        rollout, rollout_auto = choose("rollout.autocast_bf16", rollout_autocast_bf16, True, False)
    engine, engine_auto = choose("rollout.vllm.dtype", vllm_dtype, "bfloat16", "float32")
    explicit = [n for n, a in (("update", model_auto), ("HF", rollout_auto), ("vLLM", engine_auto)) if not a]
    reason = "auto: " + support.reason
    if explicit:
        reason += f"; set explicitly: {', '.join(explicit)}"
    precision = Precision(bool(model), bool(rollout), str(engine), reason, support.hardware, support.native)
    warnings = []
    if slow_bf16:  # one line, whatever the number of settings
        warnings.append(
            f"{', '.join(slow_bf16)} on {support.hardware}, which has no native bf16: {EMULATED_BF16_COST}; "
            "auto picks float32 here"
        )
    return precision, warnings


def _yaml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def evaluation_dtype(device: str = "cpu", *, cpu: CpuInfo | None = None) -> tuple[str, str]:
    """``(dtype name, reason)`` of ``tepo eval --dtype auto``'s weights on ``device``.

    On the CPU float32 whatever the flags: the evaluation protocol's reference scores are exact there, and
    generation is not where a CPU's bf16 pays. On CUDA bf16 where the GPU computes it natively, else float32.
    """
    if str(device).split(":")[0] != "cuda":
        return "float32", "CPU: float32 weights (exact reference scores)"
    support = native_bf16(device, cpu=cpu)
    return ("bfloat16" if support.native else "float32"), support.reason


def standalone_generate_autocast(device: str = "cpu", *, cpu: CpuInfo | None = None) -> bool:
    """Whether HF generate runs under bf16 autocast when its caller did not choose (``HFRollout(autocast_bf16=None)``,
    ``tepo eval``): off on the CPU, where the evaluation protocol generates in the weights' float32 and a float32
    sampler equals a float32 scorer; on a GPU, where it computes bf16 natively."""
    if str(device).split(":")[0] != "cuda":
        return False
    return native_bf16(device, cpu=cpu).native


def trainer_bf16(device: str | None = None) -> bool:
    """The ``bf16`` flag to give another trainer (TRL's ``GRPOConfig(bf16=...)``, accelerate's mixed precision)
    on ``device`` (None: CUDA when available, else the CPU): bf16 where the hardware computes it natively."""
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return native_bf16(device).native


def config_precision_errors(model_autocast_bf16, rollout_autocast_bf16, vllm_dtype) -> list[str]:
    """Form checks of the three settings (the rest of their check is the type's)."""
    errors = []
    for name, value in (
        ("model.autocast_bf16", model_autocast_bf16),
        ("rollout.autocast_bf16", rollout_autocast_bf16),
    ):
        if isinstance(value, str) and value.lower() != AUTO:
            errors.append(f"{name}: expected true, false or auto, got {value!r}")
    return errors


# ---- a training run's precision ---------------------------------------------------------------------------------

#: The run directory's record of the resolved precision (its reason and the hardware), beside ``config.yaml``.
PRECISION_FILE = "precision.json"


@dataclass
class RunPrecision:
    """A run's config (a `tepo.config.RunConfig`) with its precision resolved, the resolution, and the warning
    lines to print at start."""

    config: Any
    precision: Precision
    warnings: list[str]


def resolve_run_precision(config, device, *, recorded: dict | None = None) -> RunPrecision:
    """``config`` (a `tepo.config.RunConfig`) with ``model.autocast_bf16``, ``rollout.autocast_bf16`` and
    ``rollout.vllm.dtype`` resolved for ``device`` by :func:`resolve_precision` (``auto`` -> the hardware's choice).

    ``recorded``: the run directory's ``precision.json`` when resuming. Its values are already in the saved config
    (explicit there), so the run keeps the precision it started with; the reason then says where it was chosen, and
    a precision that is slow on this machine is said in one line instead of the explicit-setting warning.
    """
    precision, warnings = resolve_precision(
        config.model.autocast_bf16, config.rollout.autocast_bf16, config.rollout.vllm.dtype, str(device)
    )
    if recorded is not None:
        precision, warnings = _kept_precision(precision, warnings, recorded)
    resolved = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, autocast_bf16=precision.model_autocast_bf16),
        rollout=dataclasses.replace(
            config.rollout,
            autocast_bf16=precision.rollout_autocast_bf16,
            vllm=dataclasses.replace(config.rollout.vllm, dtype=precision.vllm_dtype),
        ),
    )
    # Not a field, so replace() dropped it: the renamed keys' notes still reach config_warnings at start.
    resolved.renamed_key_notes = list(getattr(config, "renamed_key_notes", ()))
    return RunPrecision(resolved, precision, warnings)


def _kept_precision(precision: Precision, warnings: list[str], recorded: dict) -> tuple[Precision, list[str]]:
    """A resumed run's precision (as its saved config has it) with the reason saying where it was chosen, and at
    most one line of warning: that it was chosen on other hardware, slow here or not."""
    slow = (
        " (bf16 is emulated on this machine, where it is up to 28x slower than float32)" if warnings else ""
    )
    warnings = (
        [
            f"this run keeps the precision it started with on {recorded.get('hardware', 'another machine')} "
            f"(recorded in {PRECISION_FILE}){slow}"
        ]
        if warnings or recorded.get("hardware") != precision.hardware
        else []
    )
    precision = dataclasses.replace(
        precision,
        reason=f"kept from the run's start: {recorded.get('reason', '?')}; now on {precision.hardware}",
    )
    return precision, warnings
