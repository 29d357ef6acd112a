"""A run directory and the two ways into it: :func:`train` (a new run, or the continuation of one) and
:func:`resume` (from its last intact checkpoint, with its saved config).

A run directory holds ``config.yaml`` (the resolved settings, written before anything loads, so a failed start
can be resumed with the command's settings), ``precision.json`` (the precision the run resolved and why, kept
on resume wherever it resumes: :func:`tepo.precision.resolve_run_precision`), ``metrics.jsonl``, checkpoints,
evaluations and ``summary.json``; the trainer (``tepo.training.trainer``) writes the rest.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from tepo.config import ConfigError, RunConfig, load_config, save_config
from tepo.files import atomic_write_text
from tepo.precision import PRECISION_FILE, Precision, resolve_run_precision
from tepo.training.datasets import load_datasets
from tepo.training.setup import run_device
from tepo.training.trainer import Trainer, TrainResult


def make_run_dir(config: RunConfig) -> Path:
    """A new run's directory under ``train.output_dir`` (``train.run_name``, or the time and the loss);
    ConfigError when it already holds a run."""
    name = config.train.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{config.algorithm.loss}"
    run_dir = Path(config.train.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run; resume it with --resume {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def train(config: RunConfig, *, run_dir: Path | None = None, log=print) -> TrainResult:
    """Start a new run (or continue ``run_dir`` if it holds one)."""
    device = run_device(config)  # a missing device fails before the run directory is made
    # The run directory records the resolved precision (config.yaml's values, precision.json's reason and
    # hardware): a resumed run keeps it, wherever it resumes.
    precision = resolve_run_precision(config, device)
    config = precision.config
    load_datasets(config)  # bad data stops here, before a run directory is made (the trainer loads it again)
    if run_dir is None:
        run_dir = make_run_dir(config)
        # A new run: write its config even over one left by a start that failed (bad data, a refused model),
        # or a later --resume would use the failed command's settings.
        save_run_config(config, run_dir, precision.precision)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists():
        save_run_config(config, run_dir, precision.precision)
    return Trainer(config, run_dir, log=log, precision=precision).setup().run()


def resume(run_dir: Path, overrides: list[str] | None = None, *, log=print) -> TrainResult:
    """Continue a run from its last intact checkpoint, with its saved config (plus overrides, e.g. more steps)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    config = load_config(str(run_dir / "config.yaml"), overrides)
    precision = resolve_run_precision(config, run_device(config), recorded=read_run_precision(run_dir))
    config = precision.config
    if overrides:
        save_run_config(config, run_dir, precision.precision)
    return Trainer(config, run_dir, log=log, precision=precision).setup().run()


def save_run_config(config: RunConfig, run_dir: Path, precision: Precision) -> None:
    """``config.yaml`` (headed by the precision's banner) and ``precision.json``, each written atomically."""
    save_config(config, Path(run_dir) / "config.yaml", header=precision.banner())
    atomic_write_text(Path(run_dir) / PRECISION_FILE, json.dumps(precision.as_dict(), indent=2))


def read_run_precision(run_dir: Path) -> dict | None:
    """A run directory's recorded precision (None for runs made before it was recorded, 2026-12-05)."""
    path = Path(run_dir) / PRECISION_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
