"""The device check's steps (run by scripts/gpu_check.sh; see there for what the machine needs).

python scripts/gpu_check.py prepare-kit KIT        here, where tepo is installed: the embedded model's config.json and
                                                   tokenizer files (a few MB; the 94 MB weights stay behind)
python scripts/gpu_check.py run KIT OUT [--cpu]    on the GPU machine: a random-weight model from KIT, a 3-step
                                                   `tepo train train.device=cuda rollout.backend=hf`, checks, an exact
                                                   resume after a SIGKILL, phase times and peak GPU memory; then the
                                                   vLLM backend where vLLM is found. --cpu: the same on the CPU with a
                                                   2-layer model (a dry run of the script's own logic)
Exit status 0 when every check passed. OUT gets only small text files (report.txt, meant to be committed, and the
runs' logs); the model and the runs' checkpoints live in a scratch folder, removed at the end (TEPO_KEEP_WORK=1 keeps it).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
# Metric names as tepo.metrics.read_metrics gives them (grouped by phase, tepo.metrics.names).
MISMATCH = ("mismatch/kl_k1", "mismatch/kl_k3", "mismatch/abs_log_ratio_mean", "mismatch/abs_log_ratio_max")
TIMING = (
    "time/gen_seconds",
    "time/logprob_seconds",
    "time/update_seconds",
    "time/reward_seconds",
    "time/step_seconds",
)


# What the check needs beyond torch and transformers (and their own dependencies: numpy, pyyaml, safetensors, tqdm,
# packaging, sympy): the reward's math-verify with its two dependencies, and pytest with its three. All pure Python.
CARRIED = (
    "math-verify",
    "latex2sympy2_extended",
    "antlr4-python3-runtime",
    "pytest",
    "pluggy",
    "iniconfig",
    "pygments",
)


def prepare_kit(kit: Path) -> None:
    from tepo.models import embedded_model_dir

    source = embedded_model_dir()
    kit.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", *TOKENIZER_FILES):
        if (source / name).exists():
            shutil.copy2(source / name, kit / name)
    wheels = prepare_wheels(kit / "wheels")
    files = [p for p in kit.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files) / 2**20
    print(f"kit: {kit} ({len(files)} files, {size:.1f} MiB) from {source}; wheels: {', '.join(wheels)}")


def prepare_wheels(dest: Path) -> list[str]:
    """``CARRIED`` as wheel files built from this environment's installed copies (no network, the same versions
    that pass the tests here). A pure-Python wheel is a zip that Python imports from directly, so gpu_check.sh puts
    each on PYTHONPATH: the device machine needs no pip install and no index."""
    import importlib.metadata as metadata
    import zipfile

    dest.mkdir(parents=True, exist_ok=True)
    made = []
    for name in CARRIED:
        dist = metadata.distribution(name)
        root = Path(dist.locate_file(""))
        files = [
            f
            for f in dist.files or []
            if not f.parts[0].startswith("..") and "__pycache__" not in f.parts and f.suffix != ".pyc"
        ]
        if any(f.suffix in (".so", ".pyd") for f in files):
            raise SystemExit(f"prepare-kit: {name} is not pure Python here; it cannot be carried as a zip")
        stem = dist.metadata["Name"].replace("-", "_")
        wheel = dest / f"{stem}-{dist.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in files:
                zf.write(root / f, str(f))
        made.append(f"{stem} {dist.version}")
    return made


def build_model(kit: Path, out: Path, *, layers: int | None) -> Path:
    """A model with the kit's architecture (``layers`` of them, if given) and random weights, saved like a checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(kit)
    if layers is not None:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(kit).save_pretrained(out)
    for name in ("generation_config.json",):
        if (kit / name).exists():
            shutil.copy2(kit / name, out / name)
    return out


def tepo_train(args: list[str], log: Path, *, background: bool = False):
    cmd = [sys.executable, "-m", "tepo.cli", "train", *args]
    handle = open(log, "a")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    handle.close()
    if background:
        return proc
    code = proc.wait()
    if code != 0:
        raise SystemExit(f"tepo train exited {code}; its output: {log}\n{log.read_text()[-3000:]}")
    return proc


def rows_of(run: Path) -> list[dict]:
    from tepo.metrics import read_metrics

    return read_metrics(run / "metrics.jsonl")


def comparable(rows: list[dict]) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not any(s in k for s in ("seconds", "per_s", "memory"))} for r in rows
    ]


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def run_check(kit: Path, out: Path, *, cpu: bool) -> int:
    import tempfile

    out.mkdir(parents=True, exist_ok=True)
    # The model and the runs (checkpoints: hundreds of MB) go to a scratch folder; OUT keeps the small text files.
    work = Path(tempfile.mkdtemp(prefix="tepo-gpu-check-"))
    try:
        return _run_check(kit, out, work, cpu=cpu)
    finally:
        if os.environ.get("TEPO_KEEP_WORK") != "1":
            shutil.rmtree(work, ignore_errors=True)


class _Report:
    """The check's report: each line printed as it comes and kept for report.txt; the failed checks."""

    def __init__(self):
        self.lines: list[str] = []
        self.failures: list[str] = []

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def check(self, ok: bool, what: str) -> None:
        self.say(f"{'ok  ' if ok else 'FAIL'} {what}")
        if not ok:
            self.failures.append(what)

    def write(self, out: Path) -> int:
        (out / "report.txt").write_text("\n".join(self.lines) + "\n")
        return 0 if not self.failures else 1


def _run_check(kit: Path, out: Path, work: Path, *, cpu: bool) -> int:
    import torch

    for name in ("straight.log", "killed.log", "vllm.log"):  # this check's logs only
        (out / name).unlink(missing_ok=True)
    report = _Report()
    report.say(
        f"tepo device check, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; mode: {'--cpu dry run' if cpu else 'cuda'}"
    )
    report.say(
        f"torch {torch.__version__}, CUDA {torch.version.cuda}, available: {torch.cuda.is_available()}"
    )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        report.say(f"GPU 0: {props.name}, {props.total_memory / 2**30:.1f} GiB")
    elif not cpu:
        report.say("FAIL no CUDA device: run with --cpu for the dry run")
        report.write(out)
        return 1
    model_dir = build_model(kit, work / "random-model", layers=2 if cpu else None)
    params = sum(p.numel() for p in weights(model_dir / "model.safetensors").values())
    report.say(
        f"model: {model_dir} (random weights, {params / 1e6:.1f}M parameters from {kit / 'config.json'})"
    )
    common = _common_overrides(model_dir, work, cpu=cpu)
    rows, final = _straight_run(common, out, work, model_dir, report, cpu=cpu)
    _killed_and_resumed(common, out, work, rows, final, report, cpu=cpu)
    # 3. vLLM on the same GPU, where this machine has it.
    if not cpu:
        vllm_run(common, out, work, report.say, report.check)
    failures = report.failures
    report.say(
        f"\n{'all checks passed' if not failures else f'{len(failures)} check(s) failed: ' + '; '.join(failures)}"
    )
    return report.write(out)


def _common_overrides(model_dir: Path, work: Path, *, cpu: bool) -> list[str]:
    """The overrides every run of the check shares."""
    common = [
        f"model.name={model_dir}",
        f"train.device={'cpu' if cpu else 'cuda'}",
        "rollout.backend=hf",
        f"train.output_dir={work / 'runs'}",
        "train.steps=3",
        "train.save_every=1",
        "train.keep_last=0",
        "eval.size=8",
        "log.progress=false",
        "algorithm.entropy_coef=0.01",  # a non-zero gradient whatever the (random model's) rewards
        "optim.lr=1e-4",
        # The killed-and-resumed run must equal the straight one bit for bit: CUDA's index_select backward and
        # memory-efficient attention are not deterministic without it (tepo.training.determinism).
        "train.deterministic=true",
    ]
    if cpu:  # the dry run checks the script, not the speed: a small workload
        common += [
            "train.prompts_per_step=2",
            "rollout.group_size=3",
            "rollout.max_new_tokens=8",
            "eval.size=2",
        ]
    return common


def _straight_run(common, out: Path, work: Path, model_dir: Path, report: _Report, *, cpu: bool):
    """1. Three steps, uninterrupted: finite metrics, changed weights, the phases' seconds. Returns the run's
    metrics rows and final weights."""
    import torch

    started = time.perf_counter()
    tepo_train([*common, "train.run_name=straight"], out / "straight.log")
    straight = work / "runs" / "straight"
    rows = rows_of(straight)
    report.say(f"\n3-step run: {time.perf_counter() - started:.0f} s (load, eval before/after included)")
    report.check([r["step"] for r in rows] == [1, 2, 3], "three metrics rows")
    finite = all(
        math.isfinite(r[k])
        for r in rows
        for k in ("update/loss", "update/grad_norm", "reward/mean", "update/entropy_mean")
    )
    report.check(
        finite, "update/loss, update/grad_norm, reward/mean, update/entropy_mean finite at every step"
    )
    initial = weights(model_dir / "model.safetensors")
    final = weights(straight / "checkpoints" / "step_000003" / "model.safetensors")
    changed = sum(not torch.equal(final[k], initial[k]) for k in final if k in initial)
    report.check(changed > len(final) // 2, f"weights changed ({changed} of {len(final)} tensors)")
    report.say("phase seconds per step: " + ", ".join(k for k in TIMING))
    for r in rows:
        times = ", ".join(f"{r.get(k, float('nan')):.2f}" for k in TIMING)
        gpu = r.get("memory/gpu_peak_mb")
        report.say(
            f"  step {r['step']}: {times}; gpu peak {gpu:.0f} MiB" if gpu else f"  step {r['step']}: {times}"
        )
    if not cpu:
        report.check(all(r.get("memory/gpu_peak_mb", 0) > 0 for r in rows), "memory/gpu_peak_mb logged")
    return rows, final


def _killed_and_resumed(common, out: Path, work: Path, rows, final, report: _Report, *, cpu: bool) -> None:
    """2. The same run SIGKILLed after its step-2 checkpoint, then resumed: the same metrics and final weights."""
    import torch

    killed_log = out / "killed.log"
    proc = tepo_train([*common, "train.run_name=killed"], killed_log, background=True)
    killed = work / "runs" / "killed"
    manifest = killed / "checkpoints" / "step_000002" / "manifest.json"
    deadline = time.time() + 1800
    while not manifest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        report.say("\nkilled the second run (SIGKILL) after its step-2 checkpoint")
    else:
        report.say(
            f"\nthe second run ended before it could be killed (exit {proc.returncode}); resuming it anyway"
        )
    tepo_train(["--resume", str(killed)], killed_log)
    resumed_rows = rows_of(killed)
    report.check(
        comparable(resumed_rows) == comparable(rows), "resumed run's metrics equal the uninterrupted run's"
    )
    again = weights(killed / "checkpoints" / "step_000003" / "model.safetensors")
    differing = [k for k in final if not torch.equal(final[k], again[k])]
    report.check(
        not differing, f"resumed run's final weights equal the uninterrupted run's ({len(differing)} differ)"
    )
    if differing and not cpu:
        worst = max(float((final[k] - again[k]).abs().max()) for k in differing)
        report.say(
            f"     largest difference {worst:.3g}: a resume bug, or a non-deterministic CUDA kernel (see README)"
        )


def vllm_run(common: list[str], out: Path, work: Path, say, check) -> None:
    from tepo.rollout.vllm import VLLMServerError, find_vllm_python

    try:
        python = find_vllm_python(os.environ.get("TEPO_VLLM_PYTHON"))
    except VLLMServerError as err:
        say(f"\nvLLM: not run ({err})")
        return
    tepo_train(
        [*common, "rollout.backend=vllm", f"rollout.vllm.python={python}", "train.run_name=vllm"],
        out / "vllm.log",
    )
    rows = rows_of(work / "runs" / "vllm")
    say(f"\nvLLM backend ({python}):")
    check(all(math.isfinite(r["update/loss"]) for r in rows), "vLLM run: finite loss at every step")
    for r in rows:
        say(
            f"  step {r['step']}: gen {r.get('time/gen_seconds', 0):.2f} s (weight sync "
            f"{r.get('time/rollout_sync_seconds', float('nan')):.2f} s), "
            + ", ".join(f"{k}={r[k]:.4g}" for k in MISMATCH if k in r)
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare-kit")
    p.add_argument("kit", type=Path)
    p = sub.add_parser("run")
    p.add_argument("kit", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--cpu", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "prepare-kit":
        prepare_kit(args.kit)
        return 0
    return run_check(args.kit, args.out, cpu=args.cpu)


if __name__ == "__main__":
    sys.exit(main())
