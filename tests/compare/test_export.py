"""tepo compare --export: a comparison's small files copied out, so the table regenerates from them alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tepo.compare.record import discover_runs
from tepo.compare.render import render_markdown
from tepo.compare.table import build_table

STUDY = Path(__file__).resolve().parents[2] / "docs" / "results" / "tepo-offpolicy"


def _compare(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tepo.cli", "compare", "--table-only", "--no-report", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_export_copies_finished_runs_small_files_and_leaves_the_rest(tmp_path):
    source, dest = tmp_path / "source", tmp_path / "dest"
    shutil.copytree(STUDY, source, ignore=shutil.ignore_patterns("report"))
    run = source / "tepo" / "seed0"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"\0" * 1024)
    (run / "vllm_server.log").write_text("engine log\n")
    (run / "held_out").mkdir(exist_ok=True)
    (run / "held_out" / "after.jsonl").write_text('{"id": 1}\n')
    unfinished = source / "sapo" / "seed2"
    (unfinished / "summary.json").unlink()  # interrupted: config.yaml and metrics only

    result = _compare("--dir", str(source), "--export", str(dest))
    assert result.returncode == 0, result.stderr
    assert (
        "exported the small files of 11 finished runs" in result.stdout
        and "1 unfinished left out" in result.stdout
    )
    copied = dest / "tepo" / "seed0"
    assert (copied / "config.yaml").read_text() == (run / "config.yaml").read_text()
    assert (copied / "held_out" / "after.jsonl").read_text() == '{"id": 1}\n'
    assert not (copied / "checkpoints").exists() and not (copied / "vllm_server.log").exists()
    assert not (dest / "sapo" / "seed2").exists()
    # The exported folder tabulates exactly as its source: the table reads nothing that was left behind.
    finished = {m: {s: d for s, d in seeds.items() if (d / "summary.json").exists()} for m, seeds in
                discover_runs(source).items()}  # fmt: skip
    exported = {m: {s: dest / m / f"seed{s}" for s in seeds} for m, seeds in finished.items()}
    assert render_markdown(build_table(exported)) == render_markdown(build_table(finished))

    (source / "sapo" / "seed2" / "summary.json").write_text(
        (source / "sapo" / "seed1" / "summary.json").read_text()
    )
    again = _compare("--dir", str(source), "--export", str(dest))
    assert (
        again.returncode == 0 and "of 12 finished runs" in again.stdout
    )  # a later export brings it up to date
    assert (dest / "sapo" / "seed2" / "summary.json").exists()


def test_export_into_the_source_itself_is_refused(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(STUDY, source, ignore=shutil.ignore_patterns("report"))
    result = _compare("--dir", str(source), "--export", str(source))
    assert result.returncode != 0 and "the same directory as --dir" in result.stderr
