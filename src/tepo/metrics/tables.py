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


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, markdown: bool = False) -> str:
    """Rows of strings as a plain-text table (columns aligned, a dashed line under the header) or, with
    ``markdown``, as a Markdown one (a ``|`` inside a cell escaped). The CLI's listings print one or the other
    (``tepo losses --markdown``), and the README holds the Markdown one, so the two cannot disagree."""
    if markdown:  # unpadded: a README's source stays readable where one long cell would widen a whole column

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        return "\n".join([line(headers), "|" + "---|" * len(headers), *(line(row) for row in rows)])
    widths = [max(len(r[c]) for r in [headers, *rows]) for c in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [headers, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
