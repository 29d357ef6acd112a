"""scripts/choose_device.sh: the one function that decides which build scripts/install.sh installs (cpu or cuda).

Tested with both answers: by detection (a stand-in ``nvidia-smi`` that lists a GPU, one that fails as it does on a
machine whose driver sees none, and none at all) and forced by ``TEPO_DEVICE``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "choose_device.sh"
BASH = shutil.which("bash")


def _choose(tmp_path: Path, nvidia_smi: str | None, tepo_device: str | None = None):
    """Run choose_device with PATH holding only grep and (if given) an ``nvidia-smi`` with this body."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "grep").unlink(missing_ok=True)
    (bin_dir / "grep").symlink_to(shutil.which("grep"))
    if nvidia_smi is not None:
        stub = bin_dir / "nvidia-smi"
        stub.write_text(f"#!{BASH}\n{nvidia_smi}\n")
        stub.chmod(0o755)
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if tepo_device is not None:
        env["TEPO_DEVICE"] = tepo_device
    return subprocess.run(
        [BASH, "-c", f'source "{SCRIPT}" && choose_device'],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )


GPU_LISTING = 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b)"'
NO_GPU = 'echo "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver." ; exit 9'


@pytest.mark.parametrize(
    ("nvidia_smi", "expected"), [(GPU_LISTING, "cuda"), (NO_GPU, "cpu"), (None, "cpu"), ('echo ""', "cpu")]
)
def test_detection(tmp_path, nvidia_smi, expected):
    result = _choose(tmp_path, nvidia_smi)
    assert (result.returncode, result.stdout) == (0, f"{expected}\n"), result.stderr


@pytest.mark.parametrize(("forced", "nvidia_smi"), [("cpu", GPU_LISTING), ("cuda", None)])
def test_tepo_device_forces_either_answer(tmp_path, forced, nvidia_smi):
    result = _choose(tmp_path, nvidia_smi, forced)
    assert (result.returncode, result.stdout) == (0, f"{forced}\n"), result.stderr


def test_a_bad_tepo_device_is_refused_in_one_line(tmp_path):
    result = _choose(tmp_path, GPU_LISTING, "gpu")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "TEPO_DEVICE must be cpu or cuda (or unset: detect), got 'gpu'\n"


def test_install_scripts_parse_and_use_the_function():
    for name in ("install.sh", "install_vllm_gpu.sh", "choose_device.sh", "gpu_check.sh"):
        subprocess.run([BASH, "-n", str(ROOT / "scripts" / name)], check=True, timeout=30)
    install = (ROOT / "scripts" / "install.sh").read_text()
    assert "source scripts/choose_device.sh" in install and "DEVICE=$(choose_device)" in install
    assert os.access(SCRIPT, os.R_OK)
