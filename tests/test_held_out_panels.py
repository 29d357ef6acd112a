"""scripts/held_out_panels.py on the committed tiny comparison fixture: one PNG with a panel per group."""

from __future__ import annotations

from pathlib import Path

from helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "compare" / "tiny"


def _script():
    return load_script("held_out_panels")


def test_writes_one_png_with_a_panel_per_group(tmp_path):
    from PIL import Image

    out = tmp_path / "panels.png"
    assert _script().main([str(FIXTURE), "grpo", "grpo,tepo", "--titles", "a", "b", "--out", str(out)]) == 0
    width, height = Image.open(out).size
    assert width > 1.8 * height  # two panels side by side (4.6 in each, 3.4 in high)


def test_curves_are_the_held_out_points(tmp_path):
    curves = _script().method_curves(FIXTURE, "grpo")
    assert len(curves) == 2  # two finished seeds
    assert curves[0][0]["step"] == 0  # the initial policy's evaluation comes first


def test_bad_arguments(tmp_path, capsys):
    out = tmp_path / "x.png"
    assert _script().main([str(FIXTURE), "grpo", "--titles", "a", "b", "--out", str(out)]) == 2
    assert "2 titles for 1 panels" in capsys.readouterr().err
    assert _script().main([str(FIXTURE), "nosuch", "--out", str(out)]) == 2
    assert "no finished runs of nosuch" in capsys.readouterr().err
    assert not out.exists()
