"""tepo compare --export: a comparison's small files copied out, so the table regenerates from them alone."""

from __future__ import annotations

import shutil
from pathlib import Path

from tepo.compare.record import discover_runs
from tepo.compare.render import render_markdown
from tepo.compare.table import build_table

STUDY = Path(__file__).resolve().parents[2] / "docs" / "results" / "tepo-offpolicy"


def _compare(capsys, *args: str) -> tuple[int, str, str]:
    from tepo.cli import main

    code = main(["compare", "--table-only", "--no-report", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_export_copies_finished_runs_small_files_and_leaves_the_rest(tmp_path, capsys):
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

    code, out, err = _compare(capsys, "--dir", str(source), "--export", str(dest))
    assert code == 0, err
    assert "exported the small files of 11 finished runs" in out and "1 unfinished left out" in out
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
    code, out, _ = _compare(capsys, "--dir", str(source), "--export", str(dest))
    assert code == 0 and "of 12 finished runs" in out  # a later export brings it up to date
    assert (dest / "sapo" / "seed2" / "summary.json").exists()


def test_export_into_the_source_itself_is_refused(tmp_path, capsys):
    source = tmp_path / "source"
    shutil.copytree(STUDY, source, ignore=shutil.ignore_patterns("report"))
    code, _, err = _compare(capsys, "--dir", str(source), "--export", str(source))
    assert code == 2 and "the same directory as --dir" in err
