"""Training curves as a PNG: reward, accuracy, entropy, clip fraction, KL, sampler/trainer mismatch, gradient norm,
length, step time."""

from __future__ import annotations

import math
from pathlib import Path

# (metric, panel title); metrics by their grouped names (tepo.metrics.names), which read_metrics gives for old
# (flat) logs too.
CURVES = (
    ("reward/mean", "batch reward (mean)"),
    ("update/entropy_mean", "token entropy"),
    ("update/clip_frac_high", "clip fraction (high)"),
    ("update/approx_kl", "approx. KL old->new (k3)"),
    ("mismatch/kl_k3", "KL sampler->trainer (k3)"),
    ("update/grad_norm", "gradient norm (pre-clip)"),
    ("rollout/response_length_mean", "response length (tokens)"),
    ("rollout/frac_truncated", "share truncated"),
    ("time/step_seconds", "seconds per step"),
)


def _informative_curves(rows: list[dict], panels: int = 6) -> list[tuple[str, str]]:
    """Reward and entropy, then the first other curves that are not identically 0.

    With one update per rollout the ratio is exactly 1, so clip fractions and KL old->new are 0 at every step:
    a flat zero panel tells nothing, so it gives way to the next curve (truncation, step time).
    """
    chosen = list(CURVES[:2])
    for key, label in CURVES[2:]:
        _, ys = _series(rows, key)
        if len(chosen) < panels and any(y != 0 for y in ys):
            chosen.append((key, label))
    for key, label in CURVES[2:]:  # nothing informative left: fill with what exists, in order
        if len(chosen) < panels and (key, label) not in chosen:
            chosen.append((key, label))
    return chosen


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, int | float) and value == value:
            xs.append(row["step"])
            ys.append(float(value))
    return xs, ys


def plot_training_curves(
    rows: list[dict], out_png: Path, *, title: str = "", extra_points: dict | None = None
) -> Path:
    """One panel per metric, step on the x axis. ``extra_points``: {label: (step, accuracy)} marks on panel 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    for ax, (key, label) in zip(axes.flat, _informative_curves(rows)):
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
        ax.set_title(label)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    points = {label: point for label, point in (extra_points or {}).items() if point[1] is not None}
    if points:  # a run without a held-out evaluation has none: no legend then
        ax = axes.flat[0]
        for label, (step, value) in points.items():
            ax.scatter([step], [value], marker="*", s=120, zorder=5, label=label)
        ax.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title)
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


# --------------------------------------------------------------------------------------------------------------
# Comparisons: one line per method (mean over seeds), the seeds' range shaded
# --------------------------------------------------------------------------------------------------------------

COMPARISON_CURVES = (
    ("reward/mean", "batch reward (mean)"),
    ("reward/accuracy", "batch accuracy"),
    ("update/entropy_mean", "token entropy (nats)"),
    ("update/grad_norm", "gradient norm (pre-clip)"),
    # clip_frac_*: share of tokens whose ratio was clipped (for a sequence-ratio loss such as tepo or gspo, the
    # tokens of clipped responses, so long responses weigh more); seq_clip_frac_*: share of responses clipped,
    # logged by sequence-ratio losses only. The second says how many responses the clip touched.
    ("update/clip_frac_low", "clip fraction, tokens (low)"),
    ("update/clip_frac_high", "clip fraction, tokens (high)"),
    ("update/seq_clip_frac_low", "clip fraction, sequences (low)"),
    ("update/seq_clip_frac_high", "clip fraction, sequences (high)"),
    ("update/approx_kl", "approx. KL old->new (k3)"),
    ("rollout/response_length_mean", "response length (tokens)"),
    ("time/step_seconds", "seconds per step"),
)


def informative_comparison_curves(
    runs_by_method: dict[str, list[list[dict]]], curves=COMPARISON_CURVES
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
    """``(kept, zero, absent)``: curves with a non-zero value in some run, curves identically 0 in every run that
    logged them, curves no run logged.

    As in the single-run plot (:func:`_informative_curves`): with one update per rollout the ratio is exactly 1,
    so clip fractions and KL old->new are 0 at every step, and a flat zero panel tells nothing; the report folds
    it into a one-line note instead of drawing it.
    """
    kept, zero, absent = [], [], []
    for key, label in curves:
        values = [y for runs in runs_by_method.values() for rows in runs for y in _series(rows, key)[1]]
        (kept if any(y != 0 for y in values) else zero if values else absent).append((key, label))
    return kept, zero, absent


METRIC_FIGSIZE = (5.0, 3.2)  # inches; at METRIC_DPI a per-metric PNG is 500 x 320 pixels
METRIC_DPI = 100
GRID_DPI = 90


def seed_band(
    runs: list[list[dict]], key: str
) -> tuple[list[int], list[float], list[float], list[float], list[int]]:
    """Per step: mean, min and max of ``key`` over the seeds that logged it, and how many did.

    Steps are aligned by their number; a step some seeds did not log (shorter or unfinished run) averages the rest.
    """
    by_step: dict[int, list[float]] = {}
    for rows in runs:
        xs, ys = _series(rows, key)
        for x, y in zip(xs, ys):
            by_step.setdefault(int(x), []).append(y)
    steps = sorted(by_step)
    vals = [by_step[s] for s in steps]
    return (
        steps,
        [sum(v) / len(v) for v in vals],
        [min(v) for v in vals],
        [max(v) for v in vals],
        [len(v) for v in vals],
    )


# matplotlib's ten-colour cycle, then ten more distinct colours: a comparison past ten methods (tepo-claims has
# eleven) must not draw two of them in one colour, and figures of up to ten keep the colours they always had.
_METHOD_COLOURS = (
    *(f"C{i}" for i in range(10)),
    *(
        "#000000",
        "#b8860b",
        "#00ced1",
        "#8b0000",
        "#556b2f",
        "#ff00ff",
        "#4682b4",
        "#d2691e",
        "#708090",
        "#9acd32",
    ),
)


def method_colour(index: int) -> str:
    """The colour of the ``index``-th method of a figure (distinct for the first 20)."""
    return _METHOD_COLOURS[index % len(_METHOD_COLOURS)]


def _draw_band(
    ax,
    runs_by_method: dict[str, list[list[dict]]],
    key: str,
    label: str,
    colours: dict[str, str] | None = None,
) -> bool:
    """Each method's seed mean and min-max band. ``colours``: method -> colour, so that figures with several
    panels keep one colour per method (default: :func:`method_colour` in the order given)."""
    drawn = False
    for index, (method, runs) in enumerate(runs_by_method.items()):
        steps, mean, low, high, _ = seed_band(runs, key)
        if not steps:
            continue
        colour = colours[method] if colours else method_colour(index)
        ax.plot(
            steps,
            mean,
            color=colour,
            linewidth=1.6,
            marker="o",
            markersize=2.5,
            label=f"{method} ({len(runs)} seed{'s' if len(runs) != 1 else ''})",
        )
        if len(runs) > 1:
            ax.fill_between(steps, low, high, color=colour, alpha=0.2, linewidth=0)
        drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(label, fontsize=10)
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    return drawn


def plot_held_out_panels(
    directory: Path, groups: list[list[str]], out_png: Path, *, titles: list[str] | None = None
) -> Path:
    """Held-out greedy accuracy by step of a comparison directory, one panel per group of methods (mean over
    seeds, the seed range shaded, one colour per method across panels): the report's single panel is unreadable
    past five or so methods. Finished runs only (``summary.json``); ``ValueError`` (one line) for a group with no
    finished run or titles that do not match the groups."""
    from tepo.compare.measures import held_out_curve

    key = "eval/greedy_accuracy"
    directory = Path(directory)
    if titles and len(titles) != len(groups):
        raise ValueError(f"--panel-titles: {len(titles)} titles for {len(groups)} panels")
    panels = []
    for group in groups:
        curves = {}
        for method in group:
            runs = sorted(p.parent for p in (directory / method).glob("seed*/summary.json"))
            if runs:
                curves[method] = [[{"step": s, key: a} for s, a in held_out_curve(run, key)] for run in runs]
        if not curves:
            raise ValueError(f"{directory}: no finished runs of {','.join(group)}")
        panels.append(curves)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.6 * len(panels), 3.4), sharey=True, constrained_layout=True, squeeze=False
    )
    colours: dict[str, str] = {}  # one colour per method across all panels
    for curves in panels:
        for method in curves:
            colours.setdefault(method, method_colour(len(colours)))
    for index, (ax, curves) in enumerate(zip(axes.flat, panels)):
        _draw_band(ax, curves, key, titles[index] if titles else ", ".join(curves), colours)
        ax.legend(fontsize=7, loc="lower right")
    axes.flat[0].set_ylabel("held-out accuracy (greedy)", fontsize=8)
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


def plot_metric_by_method(
    runs_by_method: dict[str, list[list[dict]]], key: str, label: str, out_png: Path
) -> Path:
    """One metric: mean over seeds per method, shaded from the seeds' min to max. 500 x 320 pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=METRIC_FIGSIZE, constrained_layout=True)
    if _draw_band(ax, runs_by_method, key, label):
        ax.legend(fontsize=7, loc="best")
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=METRIC_DPI)
    plt.close(fig)
    return out_png


def plot_comparison_grid(
    runs_by_method: dict[str, list[list[dict]]], out_png: Path, *, title: str = "", curves=COMPARISON_CURVES
) -> Path:
    """All metrics in a 3-column grid (for a README); each panel as in :func:`plot_metric_by_method`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = math.ceil(len(curves) / 3)
    fig, axes = plt.subplots(rows, 3, figsize=(13, 3.2 * rows), constrained_layout=True, squeeze=False)
    for ax, (key, label) in zip(axes.flat, curves):
        _draw_band(ax, runs_by_method, key, label)
    for ax in list(axes.flat)[len(curves) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=9)
    if title:
        fig.suptitle(title)
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=GRID_DPI)
    plt.close(fig)
    return out_png


# --------------------------------------------------------------------------------------------------------------
# The token view as a PNG (the HTML report has the same view as coloured text)
# --------------------------------------------------------------------------------------------------------------

TOKEN_FIG_WIDTH_IN = 10.0
TOKEN_DPI = 100
_CHARS_PER_LINE = 96
_LINE_IN = 0.19


def _wrap_tokens(tokens: list[str]) -> list[list[tuple[int, int, str]]]:
    """Lay tokens out on lines of ``_CHARS_PER_LINE`` monospace cells: [(token index, column, text)] per line."""
    from tepo.report.tokens import visible_token

    lines: list[list[tuple[int, int, str]]] = [[]]
    col = 0
    for i, token in enumerate(tokens):
        text = visible_token(token) or "\u00b7"
        text = text[:_CHARS_PER_LINE]
        if col + len(text) > _CHARS_PER_LINE and col > 0:
            lines.append([])
            col = 0
        lines[-1].append((i, col, text))
        col += len(text)
    return lines


def token_figure_height(samples: list[dict]) -> float:
    """Height in inches of :func:`plot_token_view` for these samples (two coloured copies of each sample)."""
    lines = sum(2 * len(_wrap_tokens(s["tokens"])) + 2 for s in samples)
    return max(1.5, 0.6 + _LINE_IN * lines)


def plot_token_view(samples: list[dict], out_png: Path, *, title: str = "") -> Path:
    """Each sample twice: tokens shaded by entropy (white -> red), then by advantage (blue - white - green).

    1000 pixels wide; the height grows with the text (:func:`token_figure_height`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from tepo.report.tokens import advantage_colour, colour_scales, entropy_colour

    ent_high, adv_scale = colour_scales(samples) if samples else (1.0, 1.0)
    height = token_figure_height(samples)
    fig = plt.figure(figsize=(TOKEN_FIG_WIDTH_IN, height))
    ax = fig.add_axes((0.01, 0.01, 0.98, 0.98))
    ax.set_xlim(0, _CHARS_PER_LINE + 2)
    total_lines = (height - 0.6) / _LINE_IN
    ax.set_ylim(total_lines + 2, 0)
    ax.axis("off")
    y = 0.0
    if title:
        fig.suptitle(title, fontsize=10, y=0.999, va="top")
    for index, sample in enumerate(samples):
        y += 1
        ax.text(
            0,
            y,
            f"sample {index + 1} (row {sample.get('row', '?')}, reward {sample.get('reward')})  "
            f"entropy: white 0 -> red {ent_high:.2f}+ nats;  advantage: blue -{adv_scale:.2f} .. "
            f"green +{adv_scale:.2f}",
            fontsize=7,
            va="center",
            color="#333",
        )
        y += 1
        for values, colour, scale in (
            (sample["entropy"], entropy_colour, ent_high),
            (sample["advantage"], advantage_colour, adv_scale),
        ):
            for line in _wrap_tokens(sample["tokens"]):
                for i, col, text in line:
                    rgb = colour(values[i], scale)
                    ax.add_patch(
                        Rectangle(
                            (col + 1, y - 0.45), len(text), 0.9, color=[c / 255 for c in rgb], linewidth=0
                        )
                    )
                    ax.text(col + 1, y, text, fontsize=6.5, family="monospace", va="center", ha="left")
                y += 1
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=TOKEN_DPI)
    plt.close(fig)
    return out_png
