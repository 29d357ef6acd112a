"""The run's metrics log: one JSON object per training step in ``metrics.jsonl``, plus optional sinks.

The JSONL file is the record of truth. Each row is appended and flushed with ``fsync`` so a killed run loses at
most the step in flight. On resume the log is cut back to the checkpoint's step: rows of steps that will be
redone move to ``metrics.rolledback.jsonl`` (kept, not deleted), so the main log never has a repeated or
missing step.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: write them as strings so a bad step is visible rather than an invalid file."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


class MetricsLog:
    def __init__(
        self,
        run_dir: Path,
        *,
        tensorboard: bool = False,
        wandb: bool = False,
        wandb_project: str = "tepo",
        config: dict | None = None,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        self._wandb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise RuntimeError("log.tensorboard needs `pip install 'tepo[tensorboard]'`") from err
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        if wandb:
            try:
                import wandb as wandb_module
            except ImportError as err:
                raise RuntimeError("log.wandb needs `pip install 'tepo[wandb]'`") from err
            self._wandb = wandb_module.init(
                project=wandb_project,
                dir=str(run_dir),
                config=config,
                name=Path(run_dir).name,
                resume="allow",
                id=Path(run_dir).name,
            )

    def append(self, row: dict) -> None:
        clean = {key: _clean(value) for key, value in row.items()}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(clean) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        step = row.get("step")
        numeric = {k: v for k, v in clean.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics file; a torn last line (the run was killed mid-write) is ignored."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_metrics(run_dir: Path, last_step: int) -> int:
    """Keep rows with ``step <= last_step``; move the others to ``metrics.rolledback.jsonl``. Returns moved count."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    keep, moved = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line from a kill: that step is redone
        (keep if row.get("step", -1) <= last_step else moved).append(line)
    if moved:
        with open(Path(run_dir) / "metrics.rolledback.jsonl", "a", encoding="utf-8") as handle:
            handle.write("\n".join(moved) + "\n")
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep), encoding="utf-8")
    os.replace(tmp, path)
    return len(moved)
