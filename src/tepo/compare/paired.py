"""Paired comparisons with the reference method: per measure, each method's per-seed differences, their tests,
Holm's adjustment across the methods, and the words a sentence may use about them.

For a measure ``x`` (held-out accuracy, pass@k, steps to the reference's share, entropy kept, gradient norm) and
a method ``m``, the difference on seed ``s`` is ``x(m, s) - x(ref, s)``, taken only where both runs have the value
and the table pairs them (same precision and machine). Over those ``n`` seeds a cell gives the mean, the Student-t
95% interval, the exact sign-flip p, the t-test p, the seeds on which the method was higher, equal and lower, and
``p_holm``: the sign-flip p adjusted by Holm across every method compared with the reference on that measure
(:mod:`tepo.compare.stats`). Only ``p_holm < 0.05`` lets a sentence call a method higher or lower
(:func:`verdict`); otherwise it differs "in direction only".
"""

from __future__ import annotations

from collections.abc import Iterable

from tepo.compare.stats import (
    DEFAULT_CONFIDENCE,
    holm,
    iqm,
    paired_t_p,
    probability_of_improvement,
    sign_flip_p,
    t_interval,
)

ALPHA = 0.05
_EQUAL = 1e-9
# Measures compared seed by seed with the reference, beside any pass@k the runs logged.
PAIRED_MEASURES = ("held_out", "sampled", "steps_to_share", "entropy_kept", "grad_norm", "grad_norm_cv")
PAIRED_LABELS = {
    "held_out": "held-out",
    "sampled": "sampled",
    "steps_to_share": "steps to share",
    "entropy_kept": "entropy kept",
    "grad_norm": "grad norm",
    "grad_norm_cv": "grad norm cv",
}
# For these a smaller value is the better one: "higher" then reads "slower" in words.
LOWER_IS_BETTER = {"steps_to_share"}


def paired_cell(differences: dict[int, float], *, confidence: float = DEFAULT_CONFIDENCE) -> dict:
    """The cell of one method on one measure from its ``{seed: difference}``; empty (``n = 0``) without pairs."""
    seeds = sorted(differences)
    values = [differences[s] for s in seeds]
    if not values:
        return {"mean": None, "low": None, "high": None, "n": 0, "values": [], "seeds": [], "interval": None}
    cell = t_interval(values, confidence=confidence).to_dict()
    cell |= {
        "seeds": seeds,
        "p": sign_flip_p(values),
        "p_t": paired_t_p(values),
        "higher": sum(v > _EQUAL for v in values),
        "equal": sum(abs(v) <= _EQUAL for v in values),
        "lower": sum(v < -_EQUAL for v in values),
    }
    return cell


def add_holm(cells: Iterable[dict]) -> None:
    """Set ``p_holm`` on each cell: Holm's adjustment of their sign-flip p-values (cells without pairs: None)."""
    cells = list(cells)
    adjusted = holm([c.get("p") for c in cells])
    for cell, p in zip(cells, adjusted):
        cell["p_holm"] = p


def paired_measures(
    per_method: dict[str, dict[int, dict]],
    reference: str,
    pairable: set[tuple[str, int]],
    measures: list[str],
) -> dict[str, dict[str, dict]]:
    """``{measure: {method: cell}}`` for every method but the reference, Holm-adjusted within each measure."""
    ref = per_method.get(reference, {})
    out: dict[str, dict[str, dict]] = {}
    for measure in measures:
        cells = {}
        for method, seeds in per_method.items():
            if method == reference:
                continue
            diffs = {
                seed: values[measure] - ref[seed][measure]
                for seed, values in seeds.items()
                if (method, seed) in pairable and measure in values and measure in ref.get(seed, {})
            }
            cells[method] = paired_cell(diffs)
        add_holm(cells.values())
        out[measure] = cells
    return out


def verdict(cell: dict, measure: str = "held_out", alpha: float = ALPHA) -> str:
    """How a sentence may describe ``cell``: "higher"/"lower" only with Holm-adjusted p < ``alpha``, else the
    direction with "in direction only", always with the p-values behind it."""
    if not cell or not cell.get("n"):
        return "not paired"
    mean = cell["mean"]
    direction = "higher" if mean > _EQUAL else "lower" if mean < -_EQUAL else "equal"
    p, p_holm = cell.get("p"), cell.get("p_holm")
    shown = p_holm is not None and p_holm < alpha and direction != "equal"
    ps = f"sign-flip p = {p:.3f}, Holm p = {p_holm:.3f}" if p_holm is not None else f"sign-flip p = {p:.3f}"
    if shown:
        return f"{direction} ({ps})"
    if direction == "equal":
        return f"no difference ({ps})"
    return f"{direction} in direction only ({ps})"


def aggregates(per_method: dict[str, dict[int, dict]], reference: str, measure: str = "held_out") -> dict:
    """rliable's aggregates of ``measure`` per method: the IQM over seeds and, against the reference,
    ``P(method > reference)`` with its stratified-bootstrap interval."""
    ref_values = [v[measure] for v in per_method.get(reference, {}).values() if measure in v]
    out = {}
    for method, seeds in per_method.items():
        values = [v[measure] for v in seeds.values() if measure in v]
        if not values:
            continue
        entry = {"iqm": iqm(values), "n": len(values)}
        if method != reference and ref_values:
            entry["improvement"] = probability_of_improvement(values, ref_values)
        out[method] = entry
    return out
