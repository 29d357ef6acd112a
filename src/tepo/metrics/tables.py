"""Plain-text tables of metrics for the terminal (and Markdown, which the same layout is)."""

from __future__ import annotations

from collections.abc import Sequence


def format_cell(value) -> str:
    """One cell: ``None`` and NaN as ``-``, floats with 3 decimals (whole numbers from 1,000 up)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Sequence[Sequence], *, markdown: bool = True) -> str:
    """A Markdown table with aligned columns (readable as plain text too)."""
    cells = [[format_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = lambda values: "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"  # noqa: E731
    out = [line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells]
    return "\n".join(out)
