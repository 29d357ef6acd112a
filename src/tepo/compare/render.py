"""The comparison table as text: Markdown (``table.md``), the terminal, and the files ``tepo compare`` writes
(``table.md`` / ``table.json``). The table itself is built by :func:`tepo.compare.table.build_table`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tepo.files import atomic_write_text

INITIAL_ROW = "initial policy"
REACH_KEYS = ("steps_to_threshold", "seconds_to_threshold", "steps_to_share", "seconds_to_share")


def format_value(value: float | None, key: str) -> str:
    """A column's number as the tables show it: steps with one decimal, seconds whole, scores with three."""
    if value is None:
        return "-"
    if key in ("steps_to_threshold", "steps_to_share"):
        return f"{value:.1f}"
    if key in ("seconds_to_threshold", "seconds_to_share"):
        return f"{value:.0f}"
    if key == "seconds_per_step":
        return f"{value:.1f}"
    if key == "held_out_delta":
        return f"{round(value, 3) + 0.0:+.3f}"  # + 0.0: no "-0.000" for a difference that rounds to zero
    return f"{value:.3f}"


def format_cell(cell: dict | None, key: str, *, markdown: bool, with_interval: bool = True) -> str:
    if key == "collapsed" and cell and cell.get("n"):
        return (
            f"{round(cell['mean'] * cell['n'])}/{cell['n']}"  # a count of runs, not a mean with an interval
        )
    if not cell or cell.get("mean") is None:
        if not cell or not cell.get("of"):
            return "-"
        return f"not reached (0/{cell['of']})" if key in REACH_KEYS else f"- (0/{cell['of']})"
    mean = format_value(cell["mean"], key)
    if cell.get("best"):
        mean = f"**{mean}**" if markdown else f"{mean}*"
    text = mean
    if with_interval and cell["n"] > 1 and cell.get("low") is not None:
        text += f" [{format_value(cell['low'], key)}, {format_value(cell['high'], key)}]"
    if cell.get("of") and cell["n"] < cell["of"]:
        text += f" ({cell['n']}/{cell['of']})"
    return text


def table_rows(table: dict, *, markdown: bool) -> tuple[list[str], list[list[str]]]:
    keys = [c["key"] for c in table["columns"]]
    mixed = (table.get("precision") or {}).get("mixed", False)
    headers = ["method", "seeds", *(["precision"] if mixed else [])] + [c["label"] for c in table["columns"]]
    body = []
    if table.get("initial"):
        init = table["initial"]
        body.append(
            [init["method"], str(len(init["seeds"])), *(["-"] if mixed else [])]
            + [format_cell(init["cells"].get(k), k, markdown=markdown) for k in keys]
        )
    for row in table["rows"]:
        body.append(
            [row["method"], str(len(row["seeds"])), *(["/".join(row.get("precision", []))] if mixed else [])]
            + [format_cell(row["cells"][k], k, markdown=markdown) for k in keys]
        )
    return headers, body


def table_footer(table: dict) -> str:
    st, t = table["statistics"], table["threshold"]
    lines = [
        f"mean over seeds [{st['confidence']:.0%} Student-t interval, n - 1 degrees of freedom]; best of each column "
        f"marked; steps@{t['value']:g}: first step whose trailing {t['window']}-step mean batch reward >= "
        f"{t['value']:g} (seeds that reached it / all); entropy kept: mean token entropy of the last third of the "
        f"steps / step 1's (descriptive, not ranked); collapsed: runs with {st['collapse']}",
    ]
    c = table.get("convergence") or {}
    if c.get("target") is not None:
        lines.append(
            f"steps@{c['share']:.0%} {c['reference']}: first step whose held-out greedy accuracy (step 0, every "
            f"eval, final) >= {c['share']:g} x {c['reference']}'s seed-mean final {c['reference_final_mean']:.3f} "
            f"= {c['target']:.3f}; wall s: summed step_seconds to it; held-out AUC: trapezoid area under that "
            "curve / steps (mean accuracy over training); held-out max drop: largest fall of that curve below an "
            "earlier best"
        )
    elif c.get("reference"):
        lines.append(f"steps@{c['share']:.0%}: no finished {c['reference']} run, so no convergence target")
    if table.get("missing_runs"):
        lines.append(f"not finished (left out): {', '.join(table['missing_runs'])}")
    precision = table.get("precision") or {}
    if precision.get("mixed"):
        lines.append(
            "precision: these runs did not all train at one precision (column 'precision'); their numbers are "
            "not comparable as equals"
        )
    if precision.get("unpaired"):
        lines.append(
            f"not paired (different precision or machine, no paired difference): {', '.join(precision['unpaired'])}"
        )
    return "\n".join(lines)


PER_SEED_KEYS = ("held_out", "sampled")


def per_seed_rows(table: dict, key: str) -> tuple[list[str], list[list[str]]]:
    """Seeds as rows, methods as columns: one column's per-seed values (the initial policy first), so a reader
    sees which seeds moved a mean; a method's value on a seed it did not finish is ``-``."""
    methods = [r["method"] for r in table["rows"]]
    seeds = sorted({int(s) for r in table["rows"] for s in r.get("per_seed", {})})
    initial = table.get("initial") or {}
    initial_by_seed = initial.get("per_seed", {})
    headers = ["seed", INITIAL_ROW, *methods]
    body = []
    for seed in seeds:
        line = [str(seed), format_value(initial_by_seed.get(str(seed), {}).get(key), key)]
        for row in table["rows"]:
            line.append(format_value(row.get("per_seed", {}).get(str(seed), {}).get(key), key))
        body.append(line)
    return headers, body


def render_markdown(table: dict) -> str:
    from tepo.compare.render_paired import render_statistics
    from tepo.metrics.tables import format_table

    headers, body = table_rows(table, markdown=True)
    text = format_table(headers, body) + "\n\n" + table_footer(table) + "\n"
    text += render_statistics(table)
    labels = {c["key"]: c["label"] for c in table["columns"]}
    for key in (k for k in PER_SEED_KEYS if k in labels):
        seed_headers, seed_body = per_seed_rows(table, key)
        if seed_body and any(cell != "-" for line in seed_body for cell in line[2:]):
            text += f"\nPer seed: {labels[key]}\n\n" + format_table(seed_headers, seed_body) + "\n"
    return text


def select_columns(table: dict, keys: list[str]) -> dict:
    """A copy of ``table`` with only the columns named in ``keys`` (column keys such as ``held_out`` or
    ``steps_to_share``), in that order: a narrower table for a terminal or a page. Raises ``ValueError``
    naming the available keys for an unknown one."""
    by_key = {c["key"]: c for c in table["columns"]}
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise ValueError(
            f"--columns: unknown column {', '.join(map(repr, unknown))}; this table has {', '.join(by_key)}"
        )
    return {**table, "columns": [by_key[k] for k in keys]}


def render_terminal(table: dict) -> str:
    from tepo.compare.render_paired import render_statistics
    from tepo.metrics.tables import format_table

    headers, body = table_rows(table, markdown=False)
    text = format_table(headers, body) + "\n" + table_footer(table)
    return text + "\n" + render_statistics(table, measures=("held_out",)).rstrip("\n")


def write_table(table: dict, directory: Path) -> tuple[Path, Path]:
    directory = Path(directory)
    md, js = directory / "table.md", directory / "table.json"
    atomic_write_text(md, render_markdown(table))  # a killed `tepo compare` leaves the old table, never half
    atomic_write_text(js, json.dumps(table, indent=2))
    return md, js


def read_table(directory: Path) -> dict:
    """The ``table.json`` that :func:`write_table` saved in ``directory``; FileNotFoundError, saying how to make
    it, when there is none (for the scripts that read a study's table)."""
    path = Path(directory) / "table.json"
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found; run `tepo compare --table-only --dir {directory}` first")
    return json.loads(path.read_text())


def read_table_or_say_why(directory: Path) -> dict | None:
    """:func:`read_table`, or None after printing why on stderr (a script then exits with status 2)."""
    try:
        return read_table(directory)
    except FileNotFoundError as err:
        print(err, file=sys.stderr)
        return None
