"""Held-out greedy accuracy by step, one panel per group of methods of a `tepo compare` directory.

The report draws every method in one panel, which is unreadable past five or so. This splits them into the groups
a page argues about (mean over seeds, shaded from the lowest to the highest seed, as in the report):

    python scripts/held_out_panels.py docs/results/tepo-claims \
        "grpo,sapo,gspo" "tepo,dppo_tv,luspo" "grpo,dapo,tepo,tepo_v2_kl_mask" \
        --titles "seq-mean-token-mean at ratio 1" "token-mean at ratio 1" "the first study" \
        --out docs/results/tepo-claims/report/figures/held_out_panels.png

Finished runs only (summary.json); it reads only the committed small files.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tepo.compare.table import held_out_curve
from tepo.report.plots import _draw_band

KEY = "eval_greedy_accuracy"


def method_curves(directory: Path, method: str) -> list[list[dict]]:
    runs = sorted(p.parent for p in (directory / method).glob("seed*/summary.json"))
    return [[{"step": s, KEY: a} for s, a in held_out_curve(run, KEY)] for run in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("groups", nargs="+", help="comma lists of methods, one panel each")
    parser.add_argument("--titles", nargs="*", default=[], help="one title per panel")
    parser.add_argument("--out", type=Path, required=True, help="PNG to write")
    args = parser.parse_args(argv)
    if args.titles and len(args.titles) != len(args.groups):
        print(f"--titles: {len(args.titles)} titles for {len(args.groups)} panels", file=sys.stderr)
        return 2
    panels = []
    for group in args.groups:
        curves = {m: c for m in group.split(",") if (c := method_curves(args.directory, m.strip()))}
        if not curves:
            print(f"{args.directory}: no finished runs of {group}", file=sys.stderr)
            return 2
        panels.append(curves)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.4), sharey=True,
                             constrained_layout=True, squeeze=False)
    # One colour per method across all panels, so a method shown twice reads as the same line.
    colours = {}
    for curves in panels:
        for method in curves:
            colours.setdefault(method, f"C{len(colours) % 10}")
    for index, (ax, curves) in enumerate(zip(axes.flat, panels)):
        title = args.titles[index] if args.titles else ", ".join(curves)
        _draw_band(ax, curves, KEY, title, colours)  # the report's band, with the shared colours
        ax.legend(fontsize=7, loc="lower right")
    axes.flat[0].set_ylabel("held-out accuracy (greedy)", fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=90)
    plt.close(fig)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
