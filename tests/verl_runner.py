"""The verl runner of the verl integration tests (tests/integrations/test_integration_verl*.py).

verl 0.9.1 pins dependencies that clash with tepo's environment, so `build_verl_python` (called once per session by
the ``verl_python`` fixture of tests/integrations/conftest.py) builds ``.venv-verl`` in the repository root (later
runs reuse it): ``python -m venv``, ``pip install torch==2.13.0``, ``pip install -c constraints.txt verl==0.9.1
uvicorn fastapi cachetools TransferQueue`` (verl's engine workers and its PPO drivers import these without declaring
them), ``pip install -e . --no-deps``. It skips the test only when pip cannot reach a package index.

The checks run as scripts in that environment: `run_verl_script` writes one (with `SCRIPT_PRELUDE` in front where
the test asks), runs it and returns the JSON report its last line prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-verl"
VERL_VERSION = "0.9.1"
_UNREACHABLE = (
    "Could not find a version that satisfies",
    "No matching distribution found",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
)


def _python() -> Path:
    return VENV / "bin" / "python"


def run(cmd: list, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    """``cmd`` (paths allowed) in the repository root, output captured as text."""
    return subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env
    )


def _pip(*args: str) -> None:
    result = run([_python(), "-m", "pip", "install", "-q", *args])
    if result.returncode != 0:
        if any(marker in result.stderr for marker in _UNREACHABLE):
            pytest.skip(
                f"pip cannot reach a package index to install verl's environment: {result.stderr[-400:]}"
            )
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{result.stderr[-3000:]}")


_READY_CHECK = f"""
import importlib.metadata as m, pathlib, sys
import verl, tepo
assert verl.__version__ == {VERL_VERSION!r}, verl.__version__
assert pathlib.Path(tepo.__file__).resolve().is_relative_to(pathlib.Path({str(ROOT / "src")!r}))
assert any(ep.name == "tepo" for ep in m.entry_points(group="verl.plugins"))
import cachetools, transfer_queue  # verl's PPO drivers import them without declaring them
"""


def build_verl_python() -> Path:
    """Python of ``.venv-verl`` with verl 0.9.1 and this checkout of tepo (editable) installed, built if missing."""
    if _python().exists() and run([_python(), "-c", _READY_CHECK], timeout=300).returncode == 0:
        return _python()
    if not _python().exists():
        created = run([sys.executable, "-m", "venv", VENV])
        assert created.returncode == 0, created.stderr
    _pip("torch==2.13.0")
    _pip(
        "-c",
        "constraints.txt",
        f"verl=={VERL_VERSION}",
        "uvicorn",
        "fastapi",
        "cachetools",
        "TransferQueue>=0.1.10",
    )
    _pip("-e", ".", "--no-deps")  # also refreshes the verl.plugins entry point after pyproject changes
    ready = run([_python(), "-c", _READY_CHECK], timeout=300)
    assert ready.returncode == 0, f"verl environment not usable:\n{ready.stderr[-3000:]}"
    return _python()


def verl_env(**overrides: str) -> dict:
    """This process's environment without verl's ``VERL_*`` switches (a caller's must not leak in), plus
    ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_")}
    env.update(overrides)
    return env


def run_verl_script(
    python: Path,
    tmp_path: Path,
    script: str,
    *args,
    name: str = "check.py",
    timeout: float = 600,
    env: dict | None = None,
):
    """Write ``script`` to ``tmp_path / name``, run it with ``python`` and ``args``, assert it succeeded and return
    the JSON its last line of output holds."""
    path = tmp_path / name
    path.write_text(script)
    result = run([python, path, *args], timeout=timeout, env=env)
    assert result.returncode == 0, f"{name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


# What the parity scripts share: float64, a mask from response lengths, and a comparison that returns the largest
# difference for the report.
SCRIPT_PRELUDE = textwrap.dedent(
    r"""
    import json, math
    import numpy as np
    import torch

    F64 = torch.float64


    def lengths_mask(lengths, T):
        # [len(lengths), T], True on each row's first `length` tokens
        mask = torch.zeros(len(lengths), T, dtype=torch.bool)
        for i, length in enumerate(lengths):
            mask[i, :length] = True
        return mask


    def close(a, b, rtol=1e-12, atol=1e-13):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol)
        return float((a - b).detach().abs().max())
    """
)


# A policy loss through verl's registry and through ours on the same tensors, value and gradient: goes after
# SCRIPT_PRELUDE and the script's own ``mask``, ``base`` (the current log-probs), ``old`` and ``adv_seq``.
LOSS_PAIR = textwrap.dedent(
    r"""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn
    from verl.workers.config import ActorConfig
    from tepo.losses import compute_policy_loss


    def cfg(agg="token-mean", m=mask, info=None, **kw):
        c = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, loss_agg_mode=agg, **kw)
        if info is None:
            info = {"dp_size": 1, "batch_num_tokens": int(m.sum()), "global_batch_size": m.shape[0],
                    "loss_scale_factor": c.loss_scale_factor}  # as verl.workers.utils.losses sets it
        c.global_batch_info.update(info)
        return c


    def verl(mode, config, old_logp=old, adv=adv_seq, m=mask, lp=base):
        logp = lp.clone().requires_grad_(True)
        loss, _ = get_policy_loss_fn(mode)(old_log_prob=old_logp, log_prob=logp, advantages=adv,
                                           response_mask=m, loss_agg_mode=config.loss_agg_mode, config=config,
                                           rollout_is_weights=None)
        loss.backward()
        return loss.detach(), logp.grad


    def ours(name, old_logp=old, adv=adv_seq, m=mask, lp=base, **options):
        logp = lp.clone().requires_grad_(True)
        loss, _ = compute_policy_loss(name, logp=logp, old_logp=old_logp, advantages=adv, mask=m, **options)
        loss.backward()
        return loss.detach(), logp.grad


    def equal(a, b, rtol=1e-12):
        torch.testing.assert_close(a[0], b[0], rtol=rtol, atol=1e-14)
        torch.testing.assert_close(a[1], b[1], rtol=rtol, atol=1e-14)
        assert float(a[0]) != 0.0 and bool(a[1].abs().sum() > 0)
        return float(a[0])
    """
)
