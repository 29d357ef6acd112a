"""Training curves as a PNG: reward, accuracy, entropy, clip fraction, KL, gradient norm, length, step time."""

from __future__ import annotations

from pathlib import Path

CURVES = (
    ("reward_mean", "batch reward (mean)"),
    ("entropy_mean", "token entropy"),
    ("clip_frac_high", "clip fraction (high)"),
    ("approx_kl", "approx. KL old->new (k3)"),
    ("grad_norm", "gradient norm (pre-clip)"),
    ("response_length_mean", "response length (tokens)"),
)


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and value == value:
            xs.append(row["step"])
            ys.append(float(value))
    return xs, ys


def plot_training_curves(rows: list[dict], out_png: Path, *, title: str = "", extra_points: dict | None = None) -> Path:
    """One panel per metric, step on the x axis. ``extra_points``: {label: (step, accuracy)} marks on panel 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (key, label) in zip(axes.flat, CURVES):
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if extra_points:
        ax = axes.flat[0]
        for label, (step, value) in extra_points.items():
            if value is not None:
                ax.scatter([step], [value], marker="*", s=120, zorder=5, label=label)
        ax.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
