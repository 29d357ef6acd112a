"""Pre-registered hypotheses, decided from a comparison table by the rules written down before the runs.

A study's plan names its hypotheses; a YAML file committed with it makes them machine-readable, so the verdicts come
from the table by rule, not by reading (``tepo compare --table-only --dir D --hypotheses D/hypotheses.yaml``)::

    alpha: 0.05                      # optional; the table's Holm level
    hypotheses:
      - id: H1
        claim: TEPO's held-out accuracy is at least GRPO's
        measure: held_out            # a paired measure of the table (tepo.compare.paired.PAIRED_MEASURES, pass@k)
        method: tepo                 # compared with the table's reference method (GRPO by default)
        expect: higher               # or lower: the direction the claim predicts for method - reference
      - id: H2
        claim: TEPO v2 reaches the reference accuracy in at most half GRPO's steps
        measure: steps_to_share
        method: tepo_v2_kl_mask
        expect: lower
        relative_change: -0.5        # optional: the claim's size, as a share of the reference's mean

The rules, for the paired difference d = method - reference over the seeds the table pairs, its Student-t 95%
interval [low, high] and its Holm-adjusted sign-flip p (Holm across every method compared with the reference on
that measure, :mod:`tepo.compare.paired`):

- without ``relative_change``: **supported** when d lies in the expected direction at Holm p < alpha;
  **contradicted** when it lies the other way at Holm p < alpha; otherwise **undecided**;
- with ``relative_change`` r, the claimed difference is d* = r x (the reference's mean over the paired seeds):
  **supported** when d lies in the expected direction at Holm p < alpha *and* its mean reaches d* (mean <= d* for
  ``lower``, >= d* for ``higher``); **contradicted** when d* lies outside the interval on the far side (low > d*
  for ``lower``, high < d* for ``higher``), which includes a significant difference the other way; otherwise
  **undecided**.

An undecided verdict carries the smallest difference the study could have detected: the paired t-test's at 80%
power, at the level Holm gives the smallest of the family's p-values (alpha / number of methods compared), at the
spread the seeds measured (:func:`tepo.compare.power.detectable_paired_difference`).

A hypothesis on final held-out accuracy (``held_out``) also carries the table's problem-level view of its method
against the reference (:mod:`tepo.compare.problems`: the (seed, problem) pairs only one of them solved, and the
mean difference with an interval that resamples seeds and problems). It is shown beside the verdict, not used by
the rule: the plan's test is over seeds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tepo.compare.paired import ALPHA, PAIRED_LABELS
from tepo.compare.power import DEFAULT_POWER, detectable_paired_difference

DIRECTIONS = ("higher", "lower")
PROBLEM_LEVEL_MEASURE = "held_out"  # the measure the per-problem records (held_out/after.jsonl) break down
_FIELDS = {"id", "claim", "measure", "method", "expect", "relative_change"}


class HypothesisError(ValueError):
    """A hypotheses file that cannot be read as the module docstring describes; the message names the file, the
    entry and the field."""


@dataclass(frozen=True)
class Hypothesis:
    id: str
    claim: str
    measure: str
    method: str
    expect: str
    relative_change: float | None = None


@dataclass(frozen=True)
class Verdict:
    hypothesis: Hypothesis
    verdict: str  # supported, contradicted, undecided, or "not tested" (no pairs)
    reason: str
    n: int
    mean: float | None = None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    p_t: float | None = None
    p_holm: float | None = None
    claimed: float | None = None  # d* for a hypothesis with relative_change
    detectable: float | None = None  # for an undecided verdict
    problems: dict | None = None  # the problem-level view (held_out hypotheses with per-problem records)

    def to_dict(self) -> dict:
        return asdict(self)


def read_hypotheses(path: str | Path) -> tuple[list[Hypothesis], float]:
    """The hypotheses of the YAML file at ``path`` and its alpha (default 0.05)."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise HypothesisError(f"{path}: cannot be read as YAML ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("hypotheses"), list) or not data["hypotheses"]:
        raise HypothesisError(f"{path}: expected a mapping with a non-empty list under 'hypotheses'")
    alpha = data.get("alpha", ALPHA)
    if not isinstance(alpha, int | float) or not 0 < alpha < 1:
        raise HypothesisError(f"{path}: alpha: expected a number in (0, 1), got {alpha!r}")
    hypotheses = [
        _hypothesis(entry, f"{path}: hypotheses[{i}]") for i, entry in enumerate(data["hypotheses"])
    ]
    ids = [h.id for h in hypotheses]
    if len(set(ids)) != len(ids):
        raise HypothesisError(f"{path}: hypothesis ids must be unique, got {ids}")
    return hypotheses, float(alpha)


def _hypothesis(entry, where: str) -> Hypothesis:
    if not isinstance(entry, dict):
        raise HypothesisError(f"{where}: expected a mapping with id, claim, measure, method, expect")
    unknown = set(entry) - _FIELDS
    if unknown:
        raise HypothesisError(f"{where}: unknown fields {sorted(unknown)}; expected {sorted(_FIELDS)}")
    for field in ("id", "claim", "measure", "method", "expect"):
        if not isinstance(entry.get(field), str) or not entry[field].strip():
            raise HypothesisError(f"{where}: {field}: expected a non-empty string, got {entry.get(field)!r}")
    if entry["expect"] not in DIRECTIONS:
        raise HypothesisError(f"{where}: expect: expected higher or lower, got {entry['expect']!r}")
    change = entry.get("relative_change")
    if change is not None and (isinstance(change, bool) or not isinstance(change, int | float)):
        raise HypothesisError(f"{where}: relative_change: expected a number, got {change!r}")
    if change is not None and (change > 0) != (entry["expect"] == "higher"):
        raise HypothesisError(
            f"{where}: relative_change {change} points against expect {entry['expect']!r} "
            "(a claimed fall needs a negative share, a rise a positive one)"
        )
    return Hypothesis(**{k: entry[k] for k in _FIELDS - {"relative_change"}}, relative_change=change)


def decide_all(table: dict, hypotheses: list[Hypothesis], alpha: float = ALPHA) -> list[Verdict]:
    """Every hypothesis decided from ``table`` (:func:`tepo.compare.table.build_table`'s dict); a hypothesis whose
    measure or method the table lacks is refused, naming what the table has."""
    paired = table.get("paired", {})
    reference = table.get("convergence", {}).get("reference")
    # A planned method none of whose runs has finished yet is in the table only as missing runs: "not tested".
    planned = {r["method"] for r in table.get("rows", [])} | {
        m.split("/")[0] for m in table.get("missing_runs", [])
    }
    for h in hypotheses:
        if h.measure not in paired:
            raise HypothesisError(
                f"{h.id}: measure {h.measure!r} is not paired in this table ({', '.join(paired)})"
            )
        if h.method not in paired[h.measure] and (h.method not in planned or h.method == reference):
            methods = ", ".join(sorted(planned - {reference})) or "none"
            raise HypothesisError(f"{h.id}: method {h.method!r} is not compared in this table ({methods})")
    reference_row = next((r for r in table.get("rows", []) if r["method"] == reference), None)
    views = table.get("problem_level", {})
    return [
        replace(
            decide(h, paired[h.measure], _reference_values(reference_row, h.measure), alpha),
            problems=views.get(h.method) if h.measure == PROBLEM_LEVEL_MEASURE else None,
        )
        for h in hypotheses
    ]


def _reference_values(row: dict | None, measure: str) -> dict[int, float]:
    """``{seed: value}`` of the reference method on ``measure`` (from the table's per-seed values)."""
    if row is None:
        return {}
    return {int(s): v[measure] for s, v in row.get("per_seed", {}).items() if v.get(measure) is not None}


def decide(
    h: Hypothesis, family: dict[str, dict], reference: dict[int, float], alpha: float = ALPHA
) -> Verdict:
    """``h`` decided from its measure's paired cells (``family``: every method compared with the reference on that
    measure; ``family[h.method]`` is its cell) and the reference's per-seed values."""
    cell = family.get(h.method, {})  # absent: a planned method with no finished run yet
    n = int(cell.get("n") or 0)
    if n == 0:
        return Verdict(h, "not tested", "no seed pairs the method with the reference on this measure", 0)
    mean, low, high, p_holm = cell["mean"], cell["low"], cell["high"], cell["p_holm"]
    sign = 1.0 if h.expect == "higher" else -1.0
    significant = p_holm is not None and p_holm < alpha
    claimed = None
    if h.relative_change is not None:
        base = [reference[s] for s in cell["seeds"] if s in reference]
        claimed = h.relative_change * sum(base) / len(base) if base else None
    if claimed is None:
        verdict, reason = _direction_rule(sign * mean, significant, h, alpha)
    else:
        verdict, reason = _size_rule(sign, mean, low, high, claimed, significant, h, alpha)
    detectable = None
    if verdict == "undecided" and n >= 2:
        sd = _sd(cell["values"])
        methods = sum(1 for c in family.values() if c.get("n"))
        detectable = detectable_paired_difference(sd, n, alpha=alpha / max(methods, 1), power=DEFAULT_POWER)
    return Verdict(
        h, verdict, reason, n, mean, low, high, cell.get("p"), cell.get("p_t"), p_holm, claimed, detectable
    )


def _direction_rule(signed_mean: float, significant: bool, h: Hypothesis, alpha: float) -> tuple[str, str]:
    if significant and signed_mean > 0:
        return "supported", f"{h.expect} at Holm p < {alpha:g}"
    if significant and signed_mean < 0:
        return "contradicted", f"{_opposite(h.expect)} at Holm p < {alpha:g}"
    return "undecided", f"Holm p >= {alpha:g}" if not significant else "no difference"


def _size_rule(sign, mean, low, high, claimed, significant, h: Hypothesis, alpha: float) -> tuple[str, str]:
    reaches = sign * mean >= sign * claimed
    excluded = low is not None and (low > claimed if h.expect == "lower" else high < claimed)
    if excluded:
        return "contradicted", f"the claimed difference {claimed:.3g} lies outside the 95% interval"
    if significant and sign * mean > 0 and reaches:
        return "supported", f"{h.expect} at Holm p < {alpha:g} and the mean reaches the claimed {claimed:.3g}"
    if significant and sign * mean > 0:
        return (
            "undecided",
            f"{h.expect} at Holm p < {alpha:g}, but the mean falls short of the claimed {claimed:.3g}",
        )
    if low is None:
        return "undecided", f"Holm p >= {alpha:g}; one pair, no interval"
    return "undecided", f"Holm p >= {alpha:g}; the claimed {claimed:.3g} lies inside the 95% interval"


def _opposite(direction: str) -> str:
    return "lower" if direction == "higher" else "higher"


def _sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def write_verdicts(verdicts: list[Verdict], reference: str | None, directory: Path) -> tuple[Path, Path]:
    """``verdicts.md`` and ``verdicts.json`` in ``directory``."""
    import json

    md, js = Path(directory) / "verdicts.md", Path(directory) / "verdicts.json"
    md.write_text(render_verdicts(verdicts, reference))
    js.write_text(json.dumps({"reference": reference, "verdicts": [v.to_dict() for v in verdicts]}, indent=1))
    return md, js


def render_verdicts(verdicts: list[Verdict], reference: str | None) -> str:
    """The verdicts as a Markdown table, one row per hypothesis."""

    def num(x, digits=3):
        return "" if x is None else f"{x:.{digits}f}"

    lines = [
        f"| hypothesis | measure | method − {reference or 'reference'} | n | mean [95% interval] | sign-flip p "
        "| t p | Holm p | verdict | why | smallest detectable (80% power) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for v in verdicts:
        h = v.hypothesis
        interval = "" if v.mean is None else f"{v.mean:+.3f}"
        if v.low is not None:
            interval += f" [{v.low:+.3f}, {v.high:+.3f}]"
        lines.append(
            f"| {h.id}: {h.claim} | {PAIRED_LABELS.get(h.measure, h.measure)} | {h.method} (expect {h.expect}) "
            f"| {v.n} | {interval} | {num(v.p)} | {num(v.p_t)} | {num(v.p_holm)} | **{v.verdict}** | {v.reason} "
            f"| {num(v.detectable)} |"
        )
    views = [v for v in verdicts if v.problems]
    if views:
        lines += ["", "Problem by problem (shown beside the verdict, not used by its rule):", ""]
        lines += [_problem_line(v, reference) for v in views]
    return "\n".join(lines) + "\n"


def _problem_line(v: Verdict, reference: str | None) -> str:
    view, method = v.problems, v.hypothesis.method
    pairs = len(view["seeds"]) * view["problems"]
    return (
        f"- {v.hypothesis.id}: {method} against {reference or 'the reference'} on {view['problems']} problems x "
        f"{len(view['seeds'])} seeds ({pairs} pairs): only {method} solved {view['only_method']}, only "
        f"{reference or 'the reference'} {view['only_reference']}, both {view['both']}, neither {view['neither']}; "
        f"mean difference {view['mean']:+.3f} [{view['low']:+.3f}, {view['high']:+.3f}] (95%, resampling seeds "
        "and problems)"
    )
