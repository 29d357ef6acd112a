"""`tepo report --panels` on the committed tiny comparison fixture: one PNG with a panel per group."""

from __future__ import annotations

from pathlib import Path

import pytest

from tepo.cli import main
from tepo.report.plots import plot_held_out_panels

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "compare" / "tiny"


def test_writes_one_png_with_a_panel_per_group(tmp_path, capsys):
    from PIL import Image

    out = tmp_path / "panels.png"
    argv = ["report", str(FIXTURE), "--panels", "grpo", "grpo,tepo", "--panel-titles", "a", "b"]
    assert main([*argv, "--panels-out", str(out)]) == 0
    assert f"figure: {out}" in capsys.readouterr().out
    width, height = Image.open(out).size
    assert width > 1.8 * height  # two panels side by side (4.6 in each, 3.4 in high)


def test_bad_arguments(tmp_path):
    out = tmp_path / "x.png"
    with pytest.raises(ValueError, match="2 titles for 1 panels"):
        plot_held_out_panels(FIXTURE, [["grpo"]], out, titles=["a", "b"])
    with pytest.raises(ValueError, match="no finished runs of nosuch"):
        plot_held_out_panels(FIXTURE, [["nosuch"]], out)
    assert main(["report", str(FIXTURE), "--panels", "nosuch", "--panels-out", str(out)]) == 2
    assert not out.exists()
