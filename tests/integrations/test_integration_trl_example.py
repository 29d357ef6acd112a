"""The documented TRL launch line runs: ``examples/trl_gsm8k_tepo.py --smoke`` under torchrun with 2 processes.

The command is read from README.md and docs/integrations.md (it must be the same in both) and executed as
written, except that ``torchrun`` is this interpreter's ``-m torch.distributed.run``. The smoke run is one
optimizer step on CPU (accelerate MULTI_CPU over gloo) with the embedded model, the GSM8K JSONL under
$TEPO_DATA_DIR and tepo's math-verify reward pool: it checks that the example starts, generates, scores, steps
and logs tepo's metrics on 2 processes. Whether the 2-process update is *exact* is
tests/integrations/test_integration_trl_distributed.py's job (with 16 new tokens the embedded model rarely answers, so the
rewards and the update are usually 0 here).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = re.compile(r"torchrun [^`\n]*examples/trl_gsm8k_tepo\.py --smoke")


def _documented_launch() -> str:
    lines = {}
    for doc in ("README.md", "docs/integrations.md"):
        found = LAUNCH.findall((ROOT / doc).read_text(encoding="utf-8"))
        assert found, f"{doc} has no `torchrun ... examples/trl_gsm8k_tepo.py --smoke` line"
        lines[doc] = set(found)
    assert lines["README.md"] == lines["docs/integrations.md"], lines
    (line,) = lines["README.md"]
    return line


def test_documented_smoke_launch_runs_on_two_processes(tmp_path):
    line = _documented_launch()
    args = shlex.split(line)
    assert args[0] == "torchrun" and "--nproc_per_node" in args
    assert args[args.index("--nproc_per_node") + 1] == "2"
    if not (Path(os.environ["TEPO_DATA_DIR"]) / "gsm8k" / "train.jsonl").is_file():
        pytest.skip("no gsm8k/train.jsonl under $TEPO_DATA_DIR")
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *args[1:],
        "--output-dir",
        str(tmp_path / "run"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    done = re.search(
        r"done: (\d+) optimizer step\(s\) on (\d+) process\(es\) \((\S+)\), tepo/loss \[(.*)\]", output
    )
    assert done, output[-3000:]
    steps, processes, mode, losses = done.groups()
    assert (steps, processes, mode) == ("1", "2", "DistributedType.MULTI_CPU")
    assert len(losses.split(",")) == 1 and float(losses) == float(losses)  # logged once, not NaN
    assert "'rewards/math_verify_reward/mean'" in output and "'tepo/entropy'" in output
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.safetensors"))


def test_example_names_a_missing_data_source_before_loading_anything(tmp_path):
    script = str(ROOT / "examples" / "trl_gsm8k_tepo.py")
    env = {k: v for k, v in os.environ.items() if k != "TEPO_DATA_DIR"}
    proc = subprocess.run(
        [sys.executable, script, "--smoke"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1 and "--data is required when $TEPO_DATA_DIR is not set" in proc.stderr
    missing = tmp_path / "gsm8k" / "train.jsonl"
    proc = subprocess.run(
        [sys.executable, script, "--smoke", "--data", str(missing)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and f"--data {missing}: no such file" in proc.stderr
