"""Precision ``auto`` (tepo.precision): bf16 only where the hardware computes it natively, decided in one place.

The CPU is faked (``parse_cpuinfo`` on hand-written ``/proc/cpuinfo`` text, or ``cpu_info`` patched), so both
answers are tested on whichever machine runs the suite.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import tepo.precision as precision_module
from tepo.config import ConfigError, RunConfig, list_presets, load_config, validate
from tepo.precision import (
    CpuInfo,
    cpu_info,
    evaluation_dtype,
    native_bf16,
    parse_cpuinfo,
    resolve_precision,
    standalone_generate_autocast,
)

ROOT = Path(__file__).resolve().parents[1]

ZEN3 = """processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC 7B13
flags		: fpu vme sse sse2 avx avx2 fma bmi2 sha_ni
"""
ZEN4 = (
    ZEN3.replace("model\t\t: 1", "model\t\t: 17")
    .replace("7B13", "9B14")
    .replace("sha_ni", "sha_ni avx512f avx512bw avx512_vnni avx512_bf16")
)
SAPPHIRE_RAPIDS_AMX_ONLY = """model name	: Intel(R) Xeon(R) Platinum 8480+
flags		: fpu avx2 avx512f amx_tile amx_bf16 amx_int8
"""
GRAVITON3 = """processor	: 0
BogoMIPS	: 2100.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid bf16 i8mm
CPU implementer	: 0x41
"""
GRAVITON2 = GRAVITON3.replace(" bf16 i8mm", "")


@pytest.mark.parametrize(
    ("text", "machine", "native"),
    [
        (ZEN3, "x86_64", False),
        (ZEN4, "x86_64", True),
        (SAPPHIRE_RAPIDS_AMX_ONLY, "x86_64", True),
        (GRAVITON3, "aarch64", True),
        (GRAVITON2, "aarch64", False),
        # The same flag word on another architecture proves nothing: float32.
        (GRAVITON3, "riscv64", False),
        ("", "x86_64", False),  # no /proc/cpuinfo (macOS, Windows): the safe choice
    ],
)
def test_native_bf16_from_cpu_flags(text, machine, native):
    cpu = parse_cpuinfo(text, machine)
    support = native_bf16("cpu", cpu=cpu)
    assert support.native is native
    assert cpu.model in support.reason
    assert ("native bf16" in support.reason) if native else ("lacks" in support.reason)


def test_parse_cpuinfo_reads_model_and_flags():
    cpu = parse_cpuinfo(ZEN4, "x86_64")
    assert cpu.model == "AMD EPYC 9B14"
    assert {"avx2", "avx512_bf16"} <= cpu.flags
    assert cpu.reported_flags() == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]


def test_auto_picks_bf16_only_where_native():
    zen3, zen4 = parse_cpuinfo(ZEN3, "x86_64"), parse_cpuinfo(ZEN4, "x86_64")
    fast, warnings = resolve_precision("auto", "auto", "auto", "cpu", cpu=zen4)
    assert (fast.model_autocast_bf16, fast.rollout_autocast_bf16, fast.vllm_dtype) == (True, True, "bfloat16")
    assert warnings == [] and fast.label == "bf16" and "avx512_bf16" in fast.reason
    slow, warnings = resolve_precision("auto", None, "auto", "cpu", cpu=zen3)
    assert (slow.model_autocast_bf16, slow.rollout_autocast_bf16, slow.vllm_dtype) == (
        False,
        False,
        "float32",
    )
    assert warnings == [] and slow.label == "float32" and "AMD EPYC 7B13 lacks avx512_bf16" in slow.reason


def test_rollout_none_keeps_hf_generates_standalone_default():
    """rollout.autocast_bf16=None (older configs, tepo eval) is HF generate's own default, not auto's choice."""
    zen4 = parse_cpuinfo(ZEN4, "x86_64")
    assert resolve_precision("auto", None, "auto", "cpu", cpu=zen4)[0].rollout_autocast_bf16 is False
    assert resolve_precision("auto", "auto", "auto", "cpu", cpu=zen4)[0].rollout_autocast_bf16 is True


def test_explicit_values_win_and_slow_bf16_is_one_warning_line():
    zen3, zen4 = parse_cpuinfo(ZEN3, "x86_64"), parse_cpuinfo(ZEN4, "x86_64")
    chosen, warnings = resolve_precision(True, "auto", "bfloat16", "cpu", cpu=zen3)
    assert (chosen.model_autocast_bf16, chosen.rollout_autocast_bf16, chosen.vllm_dtype) == (
        True,
        False,
        "bfloat16",
    )
    assert "set explicitly: update, vLLM" in chosen.reason
    assert len(warnings) == 1
    assert "model.autocast_bf16=true" in warnings[0] and "rollout.vllm.dtype=bfloat16" in warnings[0]
    assert "28x slower" in warnings[0] and "\n" not in warnings[0]
    # float32 asked for on a bf16 machine: kept, nothing to warn about.
    chosen, warnings = resolve_precision(False, False, "float32", "cpu", cpu=zen4)
    assert (chosen.model_autocast_bf16, chosen.rollout_autocast_bf16, chosen.vllm_dtype) == (
        False,
        False,
        "float32",
    )
    assert warnings == []
    # bf16 asked for where it is native: no warning.
    assert resolve_precision(True, True, "bfloat16", "cpu", cpu=zen4)[1] == []


def test_cuda_asks_torch(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Tesla V100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    old = native_bf16("cuda:0")
    assert not old.native and "V100" in old.reason
    assert resolve_precision("auto", "auto", "auto", "cuda")[0].vllm_dtype == "float32"
    assert evaluation_dtype("cuda")[0] == "float32" and standalone_generate_autocast("cuda") is False
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert native_bf16("cuda").native
    assert resolve_precision("auto", "auto", "auto", "cuda")[0].model_autocast_bf16 is True
    assert evaluation_dtype("cuda")[0] == "bfloat16" and standalone_generate_autocast("cuda") is True


def test_evaluation_and_standalone_generate_stay_float32_on_any_cpu():
    for text in (ZEN3, ZEN4):
        cpu = parse_cpuinfo(text, "x86_64")
        assert evaluation_dtype("cpu", cpu=cpu)[0] == "float32"
        assert standalone_generate_autocast("cpu", cpu=cpu) is False


def test_this_machine_is_read():
    cpu = cpu_info()
    assert isinstance(cpu, CpuInfo) and cpu.model
    # What tepo decides here agrees with the flags it read.
    assert native_bf16("cpu").native is cpu.native_bf16


# ---- the config: auto is the default, bad values are refused ---------------------------------------------------


def test_config_defaults_are_auto_and_accept_explicit_values():
    c = RunConfig()
    assert (c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm.dtype) == ("auto", "auto", "auto")
    c = load_config(
        None, ["model.autocast_bf16=false", "rollout.autocast_bf16=true", "rollout.vllm.dtype=float32"]
    )
    assert (c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm.dtype) == (False, True, "float32")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.autocast_bf16=fast", "model.autocast_bf16: expected true, false or auto, got 'fast'"),
        ("rollout.autocast_bf16=bf16", "rollout.autocast_bf16: expected true, false or auto, got 'bf16'"),
        (
            "rollout.vllm.dtype=half",
            "rollout.vllm.dtype: expected auto, bfloat16, float16 or float32, got 'half'",
        ),
    ],
)
def test_bad_precision_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_presets_leave_precision_to_the_hardware_except_the_gpu_preset():
    for name in list_presets():
        c = load_config(name)
        assert validate(c) == []
        settings = (c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm.dtype)
        if name == "tepo_paper_qwen7b":  # a GPU preset: bf16 on purpose
            assert c.model.autocast_bf16 is True
        else:
            assert settings == ("auto", "auto", "auto"), name


# ---- every place that chooses a precision asks tepo.precision ------------------------------------------------


@pytest.fixture
def zen3(monkeypatch):
    """This process believes it runs on an AVX2-only Zen 3."""
    fake = parse_cpuinfo(ZEN3, "x86_64")
    monkeypatch.setattr(precision_module, "cpu_info", lambda: fake)
    return fake


def test_a_run_on_a_cpu_without_native_bf16_resolves_to_float32(zen3, tmp_path):
    from tepo.precision import resolve_run_precision
    from tepo.training.run_dir import read_run_precision
    from tepo.training.run_dir import save_run_config as _save_run_config

    resolved = resolve_run_precision(load_config(None), "cpu")
    c = resolved.config
    assert (c.model.autocast_bf16, c.rollout.autocast_bf16, c.rollout.vllm.dtype) == (False, False, "float32")
    assert resolved.warnings == []
    # The run directory records it: config.yaml's values (with the reason above them) and precision.json.
    _save_run_config(c, tmp_path, resolved.precision)
    text = (tmp_path / "config.yaml").read_text()
    assert text.startswith("# precision: update float32") and "AMD EPYC 7B13 lacks" in text
    again = load_config(str(tmp_path / "config.yaml"))
    assert (again.model.autocast_bf16, again.rollout.vllm.dtype) == (False, "float32")
    assert read_run_precision(tmp_path)["hardware"] == "AMD EPYC 7B13"


def test_a_resumed_run_keeps_its_precision_and_says_when_it_is_slow_here(zen3, tmp_path):
    from tepo.precision import resolve_run_precision

    # Started with bf16 on a Zen 4 (recorded), resumed on the Zen 3.
    started = load_config(
        None, ["model.autocast_bf16=true", "rollout.autocast_bf16=true", "rollout.vllm.dtype=bfloat16"]
    )
    recorded = {"hardware": "AMD EPYC 9B14", "reason": "auto: CPU AMD EPYC 9B14 has avx512_bf16: native bf16"}
    resumed = resolve_run_precision(started, "cpu", recorded=recorded)
    assert resumed.precision.model_autocast_bf16 is True and resumed.precision.vllm_dtype == "bfloat16"
    assert len(resumed.warnings) == 1
    line = resumed.warnings[0]
    assert "keeps the precision it started with on AMD EPYC 9B14" in line and "28x slower" in line
    assert "kept from the run's start" in resumed.precision.reason


def test_standalone_hf_generate_asks_precision(monkeypatch, tiny_model_dir):
    from tepo.models import load_model_and_tokenizer
    from tepo.rollout import HFRollout

    model, tokenizer = load_model_and_tokenizer(tiny_model_dir)
    asked = []

    def spy(device="cpu", *, cpu=None):
        asked.append(device)
        return True

    monkeypatch.setattr("tepo.rollout.hf.standalone_generate_autocast", spy)
    assert HFRollout(model, tokenizer).autocast_bf16 is True and asked == ["cpu"]
    assert HFRollout(model, tokenizer, autocast_bf16="auto").autocast_bf16 is True
    assert HFRollout(model, tokenizer, autocast_bf16=False).autocast_bf16 is False


def test_eval_dtype_auto_asks_precision(monkeypatch, capsys):
    import argparse

    import torch

    from tepo.evaluate.cli import _device_and_dtype

    monkeypatch.setattr("tepo.precision.evaluation_dtype", lambda device: ("bfloat16", "faked"))
    device, dtype = _device_and_dtype(argparse.Namespace(device="cpu", dtype="auto"))
    assert (device, dtype) == ("cpu", torch.bfloat16)
    assert "precision: bfloat16 weights (faked" in capsys.readouterr().err


PRECISION_NAMES = {"autocast_bf16", "vllm_dtype", "vllm.dtype", "dtype", "bf16"}
# Literal defaults that choose no precision: "auto"/None ask tepo.precision; float32 is the weights' dtype of
# tepo's float32-master-weights design (model.dtype), not an autocast/engine choice.
NEUTRAL = {"auto", None, "float32", False}
# bf16 written as a default on purpose, with the reason.
ALLOWED = {
    (
        "benchmarks/_vllm_lora_engine.py",
        "call",
        "dtype",
    ): "a finished study of the bf16 engine's LoRA path: bf16 is "
    "what it measured (docs/results/async-and-lora)",
    ("benchmarks/bench_precision.py", "call", "autocast_bf16"): "measures float32 against bf16 on purpose",
}


def _literal_defaults(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
            for arg, default in pairs:
                if isinstance(default, ast.Constant):
                    yield node.name, arg.arg, default.value
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and isinstance(item.value, ast.Constant)
                ):
                    yield node.name, item.target.id, item.value.value
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            for kw in node.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    for name in names:
                        yield "add_argument", name.lstrip("-").replace("-", "_"), kw.value.value
        elif isinstance(
            node, ast.Call
        ):  # a precision passed as a literal: GRPOConfig(bf16=True), f(dtype="bfloat16")
            for kw in node.keywords:
                if kw.arg in PRECISION_NAMES and isinstance(kw.value, ast.Constant):
                    yield "call", kw.arg, kw.value.value
        elif isinstance(node, ast.Constant) and isinstance(
            node.value, str
        ):  # a dotted override "x.autocast_bf16=true"
            for name in ("autocast_bf16", "vllm_dtype", "vllm.dtype"):
                head, sep, value = node.value.partition(f"{name}=")
                if sep and value and head.endswith(".") and " " not in head:  # value "": an f-string's field
                    yield "override", name, {"true": True, "false": False}.get(value, value)


def test_no_place_hard_codes_a_precision():
    """A default of a precision setting anywhere in the package or the benchmarks is auto (or None): the hardware
    decides through tepo.precision. A literal True/"bfloat16" default would pin bf16 on machines that emulate it."""
    found = []
    for path in [*sorted((ROOT / "src" / "tepo").rglob("*.py")), *sorted((ROOT / "benchmarks").glob("*.py"))]:
        rel = path.relative_to(ROOT).as_posix()
        for owner, name, value in _literal_defaults(path):
            if name in PRECISION_NAMES and value not in NEUTRAL and (rel, owner, name) not in ALLOWED:
                found.append(f"{rel}: {owner}.{name} = {value!r}")
    assert found == [], "precision defaults that do not ask tepo.precision:\n" + "\n".join(found)


def test_summary_table_shows_the_recorded_precision():
    from tepo.report import training_summary_table

    summary = {"steps": 3, "precision": {"model_autocast_bf16": False, "hardware": "AMD EPYC 7B13"}}
    assert "precision: float32 on AMD EPYC 7B13" in training_summary_table(summary)
    assert "precision" not in training_summary_table({"steps": 3})  # runs made before it was recorded


def test_tepo_env_reports_versions_hardware_and_picks(capsys):
    from tepo.cli import main

    assert main(["env", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["versions"]["torch"].startswith("2.")
    assert report["cpu"]["model"] == cpu_info().model
    assert report["cpu"]["native_bf16"] is cpu_info().native_bf16
    picks = report["picks"]["precision=auto"]
    assert picks["model.autocast_bf16"] is cpu_info().native_bf16
    assert picks["rollout.vllm.dtype"] == ("bfloat16" if cpu_info().native_bf16 else "float32")
    assert report["picks"]["rollout.backend=auto"]["backend"] in ("vllm", "hf")
    assert main(["env"]) == 0
    text = capsys.readouterr().out
    assert "versions:" in text and "picks here:" in text and cpu_info().model in text


def test_trainer_bf16_for_other_trainers_follows_the_hardware(zen3):
    from tepo.precision import trainer_bf16

    assert trainer_bf16("cpu") is False  # the faked Zen 3
    assert trainer_bf16(None) is False  # no CUDA here: the CPU's answer


def test_trl_example_asks_precision():
    """examples/trl_gsm8k_tepo.py passes TRL the precision tepo.precision picks (no literal bf16 flag)."""
    source = (ROOT / "examples" / "trl_gsm8k_tepo.py").read_text()
    assert "trainer_bf16(" in source and "bf16=bf16," in source and "bf16=args.bf16" not in source
