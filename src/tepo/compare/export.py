"""A comparison's small files, copied out: what its table, report and verdicts need, without checkpoints or logs.

``tepo compare --table-only --dir SRC --export DEST`` copies ``SRC/comparison.json`` and, for every finished run
(``summary.json`` present), the files the table, the report and the problem-level view read: ``config.yaml``,
``metrics.jsonl``, ``summary.json``, ``eval_before.json``, ``precision.json`` and ``held_out/*.jsonl``. Checkpoints,
samples and the engine's and reward workers' logs stay behind (a run's checkpoints are 1.6 GB for the embedded
model; the rest is about 300 KB). Unfinished runs are not copied, and a run already in DEST is replaced, so
exporting again as a study goes on brings DEST up to date.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tepo.compare.record import PLAN_FILE, discover_runs, run_state

SMALL_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "eval_before.json", "precision.json")
RECORDS_DIR = "held_out"


def export_comparison(source: Path, dest: Path) -> tuple[list[Path], list[Path]]:
    """Copy ``source``'s plan and its finished runs' small files into ``dest`` (same layout); return the runs
    copied and the runs left out because they have not finished."""
    source, dest = Path(source), Path(dest)
    if source.resolve() == dest.resolve():
        raise ValueError(f"--export {dest}: the same directory as --dir")
    dest.mkdir(parents=True, exist_ok=True)
    if (source / PLAN_FILE).exists():
        shutil.copy2(source / PLAN_FILE, dest / PLAN_FILE)
    copied, unfinished = [], []
    for method, seeds in discover_runs(source).items():
        for seed, run_dir in seeds.items():
            if run_state(run_dir) != "finished":
                unfinished.append(run_dir)
                continue
            target = dest / _layout(run_dir, source, method, seed)
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(parents=True)
            for name in SMALL_FILES:
                if (run_dir / name).exists():
                    shutil.copy2(run_dir / name, target / name)
            if (run_dir / RECORDS_DIR).is_dir():
                (target / RECORDS_DIR).mkdir()
                for record in sorted((run_dir / RECORDS_DIR).glob("*.jsonl")):
                    shutil.copy2(record, target / RECORDS_DIR / record.name)
            copied.append(target)
    return copied, unfinished


def _layout(run_dir: Path, source: Path, method: str, seed: int) -> Path:
    """The run's place under the comparison directory (``<method>/seed<k>`` for a run kept elsewhere)."""
    try:
        return run_dir.relative_to(source)
    except ValueError:
        return Path(method) / f"seed{seed}"
