"""The run's metrics log: one JSON object per training step in ``metrics.jsonl``, plus optional sinks.

The JSONL file is the record of truth. Each row is appended and flushed with ``fsync`` so a killed run loses at
most the step in flight. On resume the log is cut back to the checkpoint's step: rows of steps that will be
redone move to ``metrics.rolledback.jsonl`` (kept, not deleted), so the main log never has a repeated or
missing step. The log also guards itself: opening it drops a torn last line (a kill mid-write), and appending a
step that is already logged (a run killed before its first checkpoint restarts from step 0) first moves that
row and any later ones to ``metrics.rolledback.jsonl``.

Rows are written as they come, with the metric names grouped by phase where they were computed (``reward/mean``,
``update/clip_frac_high``, ``time/step_seconds``; :mod:`tepo.metrics.names`), to the file and to the sinks alike;
:func:`read_metrics` gives the grouped names for a log of either spelling (runs written before the grouping have
flat names).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from tepo.files import atomic_write_text
from tepo.metrics.names import canonical


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
        _drop_torn_tail(self.path)
        steps = [row.get("step") for row in read_metrics(self.path)]
        self._last_step = max((s for s in steps if isinstance(s, int)), default=None)
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
        step = row.get("step")
        if isinstance(step, int) and self._last_step is not None and step <= self._last_step:
            # The step is being redone (resumed without a checkpoint at or after it): one row per step.
            truncate_metrics(self.path.parent, step - 1)
        if isinstance(step, int):
            self._last_step = step
        clean = {key: _clean(value) for key, value in row.items()}
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(clean) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
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


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that has no newline (the process died inside ``write``): the next row must start on a
    line of its own, or it would be glued to the fragment and both lost."""
    if not path.exists() or path.stat().st_size == 0:
        return
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return
    with open(path, "r+b") as handle:
        handle.truncate(data.rfind(b"\n") + 1)  # rfind is -1 when the only line is torn: truncate to 0
        handle.flush()
        os.fsync(handle.fileno())


def read_metrics(path: Path) -> list[dict]:
    """Rows of a metrics file with grouped metric names (:func:`tepo.metrics.names.canonical`: a log written
    before the grouping reads as a new one); a torn last line (the run was killed mid-write) is ignored."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            rows.append(canonical(json.loads(line)))
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
            handle.flush()
            os.fsync(handle.fileno())
    # The moved rows are on disk (above) before the kept ones replace the log.
    atomic_write_text(path, "".join(line + "\n" for line in keep))
    return len(moved)
