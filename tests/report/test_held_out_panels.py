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


def test_eleven_methods_get_eleven_colours(tmp_path):
    """tepo-claims has eleven methods: the eleventh drew in the first one's colour (matplotlib's cycle is ten)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tepo.report.plots import _draw_band, method_colour

    assert [method_colour(i) for i in range(10)] == [f"C{i}" for i in range(10)]  # up to ten: as before
    assert len({method_colour(i) for i in range(20)}) == 20
    key = "eval/greedy_accuracy"
    runs = {f"m{i}": [[{"step": 1, key: 0.1 * i}, {"step": 2, key: 0.1 * i}]] for i in range(11)}
    fig, ax = plt.subplots()
    assert _draw_band(ax, runs, key, "eleven")
    colours = [matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines()]
    plt.close(fig)
    assert len(colours) == 11 and len(set(colours)) == 11
