"""The comparison's tests as text: per measure, each method's paired difference with the reference (mean, t
interval, sign-flip p, t p, Holm p, seeds higher/equal/lower, the words the tests allow), the problem-level view
and rliable's aggregates. The numbers come from :mod:`tepo.compare.paired` and :mod:`tepo.compare.problems`."""

from __future__ import annotations

from collections.abc import Sequence

from tepo.compare.paired import PAIRED_LABELS, verdict


def _number(value: float | None, signed: bool = True, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{round(value, digits) + 0.0:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def paired_rows(table: dict, measure: str) -> tuple[list[str], list[list[str]]]:
    """One row per method compared with the reference on ``measure``."""
    digits = 1 if measure == "steps_to_share" else 3
    headers = [
        "method",
        "seeds",
        "mean diff",
        "95% t interval",
        "sign-flip p",
        "t p",
        "Holm p",
        "+/=/-",
        "reading",
    ]
    body = []
    for method, cell in table["paired"][measure].items():
        if not cell.get("n"):
            body.append([method, "0", "-", "-", "-", "-", "-", "-", "not paired"])
            continue
        interval = (
            "-"
            if cell["low"] is None
            else f"[{_number(cell['low'], digits=digits)}, {_number(cell['high'], digits=digits)}]"
        )
        body.append(
            [
                method,
                str(cell["n"]),
                _number(cell["mean"], digits=digits),
                interval,
                _p(cell["p"]),
                _p(cell["p_t"]),
                _p(cell["p_holm"]),
                f"{cell['higher']}/{cell['equal']}/{cell['lower']}",
                verdict(cell, measure).split(" (")[0],
            ]
        )
    return headers, body


def problem_rows(table: dict) -> tuple[list[str], list[list[str]]]:
    reference = table["convergence"]["reference"]
    headers = ["method", "seeds", "problems", "only method", f"only {reference}", "both", "neither",
               "mean diff [two-way bootstrap]"]  # fmt: skip
    body = [
        [
            method,
            str(len(view["seeds"])),
            str(view["problems"]),
            str(view["only_method"]),
            str(view["only_reference"]),
            str(view["both"]),
            str(view["neither"]),
            f"{_number(view['mean'])} [{_number(view['low'])}, {_number(view['high'])}]",
        ]
        for method, view in table.get("problem_level", {}).items()
    ]
    return headers, body


def aggregate_rows(table: dict) -> tuple[list[str], list[list[str]]]:
    reference = table["convergence"]["reference"]
    headers = ["method", "seeds", "held-out IQM", f"P(method > {reference}) [95% stratified bootstrap]"]
    body = []
    for method, entry in table.get("aggregates", {}).items():
        improvement = entry.get("improvement")
        shown = (
            "-"
            if improvement is None
            else f"{improvement['p']:.3f} [{improvement['low']:.3f}, {improvement['high']:.3f}]"
        )
        body.append([method, str(entry["n"]), f"{entry['iqm']:.3f}", shown])
    return headers, body


def render_statistics(table: dict, measures: Sequence[str] | None = None) -> str:
    """The paired tables (every measure, or ``measures``), then the problem-level view and the aggregates."""
    from tepo.metrics.tables import format_table

    paired = table.get("paired") or {}
    if not paired and not table.get("problem_level") and not table.get("aggregates"):
        return ""
    reference = table["convergence"]["reference"]
    alpha = table["statistics"]["alpha"]
    text = ""
    for measure in measures or list(paired):
        if measure not in paired or not any(c.get("n") for c in paired[measure].values()):
            continue
        label = PAIRED_LABELS.get(measure, measure)
        headers, body = paired_rows(table, measure)
        tested = sum(1 for c in paired[measure].values() if c.get("p") is not None)
        family = (
            f"Holm across the {tested} methods paired"
            if tested > 1
            else "one method paired, Holm = sign-flip"
        )
        text += (
            f"\nPaired with {reference}: {label} (method - {reference}, by seed; {family}; 'higher'/'lower' only "
            f"where Holm p < {alpha:g})\n\n" + format_table(headers, body) + "\n"
        )
    if measures is None and table.get("problem_level"):
        headers, body = problem_rows(table)
        text += (
            f"\nProblem level: final greedy outcomes on the shared held-out problems, (seed, problem) pairs summed "
            f"over the paired seeds; the interval resamples seeds and problems\n\n{format_table(headers, body)}\n"
        )
    if measures is None and table.get("aggregates"):
        headers, body = aggregate_rows(table)
        text += (
            "\nAggregates (rliable): interquartile mean of the final held-out accuracy over seeds, and the "
            f"probability that a run of the method ends above a run of {reference} (ties 1/2)\n\n"
            f"{format_table(headers, body)}\n"
        )
    return text
