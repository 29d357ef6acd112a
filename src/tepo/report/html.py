"""``tepo report``: a self-contained HTML page (and PNG figures) for a run directory or a comparison directory.

The page has no script, no external stylesheet, font or image: figures are inline ``data:`` PNGs, styles are
inline, and a Content-Security-Policy forbids everything else, so it opens from disk with no server and no
network. Everything that came from a model (token text) is HTML-escaped.

Output: ``<dir>/report/index.html`` and ``<dir>/report/figures/*.png`` (one PNG per metric, a grid of all
metrics, and the token view of each method/run that recorded samples).
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path

from tepo.metrics import read_metrics
from tepo.metrics.names import flat_name
from tepo.report.plots import (
    informative_comparison_curves,
    plot_comparison_grid,
    plot_metric_by_method,
    plot_token_view,
)
from tepo.report.tokens import (
    advantage_colour,
    colour_scales,
    entropy_colour,
    list_sample_files,
    load_samples,
    pick_samples,
    visible_token,
)

REPORT_DIR = "report"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
STYLE = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 24px auto; max-width: 1150px;
       color: #222; padding: 0 12px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table.results { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
table.results th, table.results td { border: 1px solid #ccc; padding: 4px 8px; text-align: right; }
table.results th:first-child, table.results td:first-child { text-align: left; }
table.results tr.initial td { color: #666; font-style: italic; }
.ci { color: #777; font-size: 11px; } .note { color: #555; font-size: 13px; }
.figs { display: flex; flex-wrap: wrap; gap: 8px; } .figs img { border: 1px solid #eee; }
.tokens { font-family: ui-monospace, 'DejaVu Sans Mono', monospace; font-size: 12.5px; line-height: 1.9;
          border: 1px solid #ddd; padding: 6px 8px; margin: 4px 0 12px; white-space: pre-wrap; word-break: break-all; }
.tokens span { border-radius: 2px; }
.legend { display: inline-block; width: 160px; height: 10px; vertical-align: middle; border: 1px solid #ccc; }
.sample-head { font-size: 13px; margin-top: 10px; }
"""


@dataclass
class ReportResult:
    html_path: Path
    figures: list[Path] = field(default_factory=list)
    kind: str = "run"


def _png_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _rgb(c: tuple[int, int, int]) -> str:
    return f"rgb({c[0]},{c[1]},{c[2]})"


def token_view_html(samples: list[dict]) -> str:
    """Each sample twice as coloured text: by entropy, then by advantage; hover shows the numbers."""
    if not samples:
        return '<p class="note">no samples</p>'
    ent_high, adv_scale = colour_scales(samples)
    legend = (
        f'<p class="note">entropy: <span class="legend" style="background: linear-gradient(to right, '
        f'{_rgb(entropy_colour(0, ent_high))}, {_rgb(entropy_colour(ent_high, ent_high))})"></span> '
        f"0 &rarr; {ent_high:.2f}+ nats &nbsp;&nbsp; advantage: "
        f'<span class="legend" style="background: linear-gradient(to right, {_rgb(advantage_colour(-adv_scale, adv_scale))}, '
        f'{_rgb(advantage_colour(0, adv_scale))}, {_rgb(advantage_colour(adv_scale, adv_scale))})"></span> '
        f"&minus;{adv_scale:.2f} (pushed down) &rarr; +{adv_scale:.2f} (pushed up)</p>"
    )
    parts = [legend]
    for sample in samples:
        reward = sample.get("reward")
        parts.append(
            f'<div class="sample-head">row {html.escape(str(sample.get("row", "?")))} &middot; reward '
            f"{html.escape(str(reward))} &middot; {len(sample['tokens'])} tokens</div>"
        )
        for label, values, colour, scale in (
            ("entropy", sample["entropy"], entropy_colour, ent_high),
            ("advantage", sample["advantage"], advantage_colour, adv_scale),
        ):
            spans = []
            for token, ent, adv, value in zip(
                sample["tokens"], sample["entropy"], sample["advantage"], values
            ):
                tip = f"entropy {ent if ent is None else f'{ent:.3f}'} nats, advantage {adv if adv is None else f'{adv:+.3f}'}"
                spans.append(
                    f'<span style="background:{_rgb(colour(value, scale))}" title="{html.escape(tip)}">'
                    f"{html.escape(visible_token(str(token)))}</span>"
                )
            parts.append(f'<div class="note">by {label}</div><div class="tokens">{"".join(spans)}</div>')
    return "\n".join(parts)


def _statistics_html(table: dict) -> list[str]:
    """The paired tests, the problem-level view and the aggregates (tepo.compare.render_paired), as text."""
    from tepo.compare.render_paired import render_statistics

    text = render_statistics(table).strip()
    return ["<h2>Paired tests</h2>", f'<pre class="tests">{html.escape(text)}</pre>'] if text else []


def comparison_table_html(table: dict) -> str:
    from tepo.compare.render import REACH_KEYS, format_cell, format_value

    cols = table["columns"]
    head = "".join(f"<th>{html.escape(c['label'])}</th>" for c in cols)
    out = [f'<table class="results"><tr><th>method</th><th>seeds</th>{head}</tr>']
    rows = ([table["initial"]] if table.get("initial") else []) + table["rows"]
    for row in rows:
        klass = ' class="initial"' if row is table.get("initial") else ""
        cells = []
        for c in cols:
            cell = row["cells"].get(c["key"])
            if (
                c["key"] == "collapsed" and cell and cell.get("n")
            ):  # a count of runs, as the Markdown table shows it
                cells.append(f"<td>{html.escape(format_cell(cell, 'collapsed', markdown=False))}</td>")
                continue
            if not cell or cell.get("mean") is None:
                of = cell.get("of") if cell else None
                word = "not reached" if c["key"] in REACH_KEYS and of else "-"
                cells.append(f"<td>{word}{f' (0/{of})' if of else ''}</td>")
                continue
            text = html.escape(format_value(cell["mean"], c["key"]))
            if cell.get("best"):
                text = f"<strong>{text}</strong>"
            if cell["n"] > 1:
                text += f' <span class="ci">[{format_value(cell["low"], c["key"])}, {format_value(cell["high"], c["key"])}]</span>'
            if cell.get("of") and cell["n"] < cell["of"]:
                text += f' <span class="ci">({cell["n"]}/{cell["of"]})</span>'
            cells.append(f"<td>{text}</td>")
        out.append(
            f"<tr{klass}><td>{html.escape(row['method'])}</td><td>{len(row['seeds'])}</td>{''.join(cells)}</tr>"
        )
    out.append("</table>")
    return "\n".join(out)


def _page(title: str, body: list[str]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _curves_section(
    runs_by_method: dict[str, list[list[dict]]], fig_dir: Path, figures: list[Path], title: str
) -> list[str]:
    body = ["<h2>Training curves</h2>"]
    if any(len(r) > 1 for r in runs_by_method.values()):
        body.append(
            '<p class="note">line: mean over seeds at each step; shaded: from the lowest to the highest seed.</p>'
        )
    kept, zero, absent = informative_comparison_curves(runs_by_method)
    tags = []
    for key, label in kept:
        # Named by the flat metric name (curve_reward_mean.png): the committed study pages link the figures so.
        png = plot_metric_by_method(runs_by_method, key, label, fig_dir / f"curve_{flat_name(key)}.png")
        figures.append(png)
        tags.append(_png_tag(png, label))
    if kept:
        figures.append(plot_comparison_grid(runs_by_method, fig_dir / "curves.png", title=title, curves=kept))
    body.append(f'<div class="figs">{"".join(tags)}</div>')
    if zero:
        body.append(
            '<p class="note">0 at every step of every run, not drawn: '
            + html.escape(", ".join(label for _, label in zero))
            + " (nothing was clipped or moved: expected with one update per rollout, where the policy ratio is"
            " exactly 1; with several updates, a clip that never binds).</p>"
        )
    if absent:
        body.append(
            '<p class="note">not logged by these runs: '
            + html.escape(", ".join(label for _, label in absent))
            + ".</p>"
        )
    return body


def _held_out_section(
    runs: dict[str, dict[int, Path]], table: dict, fig_dir: Path, figures: list[Path]
) -> list[str]:
    """Held-out accuracy by step (step 0, every eval, final), greedy (the curve the convergence columns read)
    and, where the runs scored it, one sample per problem."""
    from tepo.compare.measures import held_out_curve

    tags = []
    for key, label, name in (
        ("eval/greedy_accuracy", "held-out accuracy (greedy)", "curve_held_out.png"),
        ("eval/sampled_accuracy", "held-out accuracy (one sample)", "curve_held_out_sampled.png"),
    ):
        curves = {
            m: [[{"step": s, key: a} for s, a in held_out_curve(d, key)] for _, d in sorted(seeds.items())]
            for m, seeds in runs.items()
        }
        if not any(len(c) > 1 for runs_ in curves.values() for c in runs_):
            continue
        png = plot_metric_by_method(curves, key, label, fig_dir / name)
        figures.append(png)
        tags.append(_png_tag(png, label))
    if not tags:
        return []
    conv = table.get("convergence") or {}
    target = (
        f" Convergence target (greedy): {conv['share']:g} x {html.escape(str(conv['reference']))}'s seed-mean "
        f"final accuracy = {conv['target']:.3f}."
        if conv.get("target") is not None
        else ""
    )
    return [
        "<h2>Held-out accuracy during training</h2>",
        f'<p class="note">Step 0, every eval.every steps, and the final evaluation.{target}</p>',
        f'<div class="figs">{"".join(tags)}</div>',
    ]


def _tokens_section(
    sources: dict[str, Path], fig_dir: Path, figures: list[Path], per_file: int = 4
) -> list[str]:
    """Token views of the latest recorded step of each run in ``sources`` ({label: run_dir})."""
    body = [
        "<h2>Sample rollouts, token by token</h2>",
        '<p class="note">Each response twice: shaded by the policy\'s entropy at that token (high-entropy '
        '"decision pivots" in red), then by the token\'s advantage in the update (green: probability pushed up, '
        "blue: pushed down). Hover a token for its numbers. Samples: the best- and worst-rewarded of the latest "
        "recorded step.</p>",
    ]
    found = False
    for label, run_dir in sources.items():
        files = list_sample_files(run_dir)
        if not files:
            continue
        found = True
        data = load_samples(files[-1])
        samples = pick_samples(data, per_file)
        safe = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in label)
        png = plot_token_view(
            samples,
            fig_dir / f"tokens_{safe}_step{int(data.get('step', 0)):06d}.png",
            title=f"{label}, step {data.get('step')}",
        )
        figures.append(png)
        body.append(f"<h3>{html.escape(label)} &middot; step {html.escape(str(data.get('step')))}</h3>")
        body.append(token_view_html(samples))
    if not found:
        body.append(
            '<p class="note">No per-token samples were recorded for these runs (<code>samples/step_XXXXXX.json'
            "</code>, written by the trainer through <code>tepo.metrics.tokens.record_rollout_tokens</code>).</p>"
        )
    return body


def _write(out_dir: Path, title: str, body: list[str], figures: list[Path], kind: str) -> ReportResult:
    path = out_dir / "index.html"
    path.write_text(_page(title, body), encoding="utf-8")
    return ReportResult(path, figures, kind)


def finished_runs(runs: dict[str, dict[int, Path]]) -> tuple[dict[str, dict[int, Path]], list[str]]:
    """The runs the figures draw, and the ``method/seed<k>`` names of those left out.

    Finished runs (:func:`tepo.compare.record.run_state`, as the table counts them) only, so a seed-mean curve
    and its "(3 seeds)" label never mix a half-trained run into finished ones. While nothing is finished yet (a
    comparison in progress), every run with a metrics log is drawn instead, and none is listed as left out.
    """
    from tepo.compare.record import run_state

    finished = {
        m: {s: d for s, d in seeds.items() if run_state(d) == "finished"} for m, seeds in runs.items()
    }
    finished = {m: seeds for m, seeds in finished.items() if seeds}
    if not finished:
        started = {
            m: {s: d for s, d in seeds.items() if (Path(d) / "metrics.jsonl").exists()}
            for m, seeds in runs.items()
        }
        return {m: seeds for m, seeds in started.items() if seeds}, []
    left_out = [
        f"{m}/seed{s}"
        for m, seeds in runs.items()
        for s, d in sorted(seeds.items())
        if s not in finished.get(m, {})
    ]
    return finished, left_out


def report_comparison(
    directory: Path, *, threshold: float = 0.3, window: int = 3, **table_options
) -> ReportResult:
    """``table_options``: ``convergence_share`` / ``reference`` of :func:`tepo.compare.table.build_table`."""
    from tepo.compare.record import discover_runs, load_plan
    from tepo.compare.render import table_footer, write_table
    from tepo.compare.table import build_table

    directory = Path(directory)
    runs = discover_runs(directory)
    if not runs:
        raise ValueError(
            f"{directory}: no runs found (expected comparison.json or <method>/seed<k>/ run directories)"
        )
    out_dir, figures = directory / REPORT_DIR, []
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    table = build_table(runs, threshold=threshold, window=window, **table_options)
    write_table(table, directory)
    plan = load_plan(directory) or {}
    plotted, unfinished = finished_runs(runs)
    runs_by_method = {
        m: [
            read_metrics(d / "metrics.jsonl")
            for _, d in sorted(seeds.items())
            if (d / "metrics.jsonl").exists()
        ]
        for m, seeds in plotted.items()
    }
    title = f"Comparison: {', '.join(runs)} ({directory.name})"
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">{html.escape(str(directory.resolve()))} &middot; base config '
        f"{html.escape(str(plan.get('base_config', '?')))} &middot; overrides "
        f"{html.escape(' '.join(plan.get('overrides', [])) or 'none')}</p>",
        "<h2>Results</h2>",
        comparison_table_html(table),
        f'<p class="note">{html.escape(table_footer(table))}</p>',
        *_statistics_html(table),
    ]
    notes = plan.get("notes") or []
    if notes:
        body.append(
            "<h2>Fairness notes</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
        )
    digests = plan.get("prompt_digests") or {}
    if digests:
        same = all(len(set(d.values())) == 1 for d in digests.values())
        body.append(
            f'<p class="note">Prompt schedules (SHA-256 of the prompts each run draws, per seed): '
            f"{'identical across methods for every seed' if same else 'NOT identical: see notes'}.</p>"
        )
    if unfinished:
        body.append(
            '<p class="note">Not finished, left out of the table and the figures: '
            + html.escape(", ".join(unfinished))
            + ".</p>"
        )
    body += _curves_section(runs_by_method, fig_dir, figures, title)
    body += _held_out_section(plotted, table, fig_dir, figures)
    sources = {}
    for method, seeds in runs.items():
        for seed, run_dir in sorted(seeds.items()):
            if list_sample_files(run_dir):
                sources[f"{method} seed {seed}"] = run_dir
                break
    body += _tokens_section(sources, fig_dir, figures)
    return _write(out_dir, title, body, figures, "comparison")


def report_run(run_dir: Path) -> ReportResult:
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    out_dir, figures = run_dir / REPORT_DIR, []
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    title = f"Run {run_dir.name}"
    body = [
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="note">{html.escape(str(run_dir.resolve()))} &middot; {len(rows)} steps logged</p>',
    ]
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        before, after = summary.get("before") or {}, summary.get("after") or {}
        pairs = [
            ("held-out greedy accuracy", "eval_greedy_accuracy"),
            ("held-out sampled accuracy", "eval_sampled_accuracy"),
        ]
        cells = "".join(
            f"<tr><td>{label}</td><td>{_fmt(before.get(k))}</td><td>{_fmt(after.get(k))}</td></tr>"
            for label, k in pairs
        )
        body += [
            "<h2>Held-out accuracy</h2>",
            f'<table class="results"><tr><th>metric</th><th>before</th><th>after</th></tr>{cells}</table>',
        ]
    else:
        body.append('<p class="note">No summary.json: the run has not finished.</p>')
    body += _curves_section({run_dir.name: [rows]}, fig_dir, figures, title)
    body += _tokens_section({run_dir.name: run_dir}, fig_dir, figures)
    return _write(out_dir, title, body, figures, "run")


def _fmt(value) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "-"
    return f"{value:.3f}"


def build_report(path: Path, *, threshold: float = 0.3, window: int = 3, **table_options) -> ReportResult:
    """Report for a run directory (``metrics.jsonl`` / ``config.yaml``) or a comparison directory
    (``table_options``: ``convergence_share``, ``reference``, passed to the comparison table)."""
    from tepo.compare.record import PLAN_FILE

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path}: not a directory (expected a run directory or a comparison directory)")
    if (path / PLAN_FILE).exists() or any(path.glob("*/seed*/config.yaml")):
        return report_comparison(path, threshold=threshold, window=window, **table_options)
    if (path / "metrics.jsonl").exists() or (path / "config.yaml").exists():
        return report_run(path)
    raise ValueError(
        f"{path}: neither a run directory (metrics.jsonl, config.yaml) nor a comparison directory "
        "(comparison.json, <method>/seed<k>/)"
    )
