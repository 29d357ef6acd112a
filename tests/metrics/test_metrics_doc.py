"""docs/metrics.md documents every name a run can log: the catalogue (tepo.metrics.catalogue), the per-function
patterns, and each registered loss's own metrics; each under its group's heading with a meaning, a unit and a
healthy range, and no name the trainer cannot log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loss_cases import registered_loss_metrics
from tepo.losses import POLICY_LOSSES
from tepo.metrics.catalogue import GROUPS, LOGGED, PATTERNS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
# A grouped name built in the code from a variable (f"reward/{name}_mean"): one name per item of a config list.
FORMATTED = re.compile(r"""f["']((?:""" + "|".join(GROUPS) + r""")/[^"'{}]*\{[^}]+\}[^"']*)["']""")


def _rows() -> list[tuple[str, str, list[str]]]:
    """``(heading group, name, cells)`` of every table row naming a metric, in page order."""
    rows, group = [], None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## (\w+)/", line)
        if heading:
            group = heading.group(1)
        named = re.match(r"\| `([^`]+)` \|", line)
        if named:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows.append((group, named.group(1), cells))
    return rows


def _loggable() -> set[str]:
    loss_names = {f"update/{k}" for name in POLICY_LOSSES for k in registered_loss_metrics(name)}
    return set(LOGGED) | set(PATTERNS) | loss_names


def test_every_name_the_code_formats_is_a_declared_pattern():
    """A name such as f"reward/{name}_mean" is in tepo.metrics.catalogue.PATTERNS (as reward/<name>_mean), so the page
    test below covers it."""
    formatted = set()
    for path in (ROOT / "src" / "tepo").rglob("*.py"):
        for name in FORMATTED.findall(path.read_text(encoding="utf-8")):
            formatted.add(re.sub(r"\{[^}]+\}", "<name>", name))
    assert "reward/<name>_mean" in formatted  # the scan still finds what it looks for
    assert sorted(formatted - set(PATTERNS)) == [], (
        "add these to tepo.metrics.catalogue.PATTERNS and docs/metrics.md"
    )


def test_every_loggable_name_is_documented():
    documented = {name for _, name, _ in _rows()}
    missing = sorted(_loggable() - documented)
    assert missing == [], f"docs/metrics.md lacks {missing}"


def test_the_page_names_nothing_the_trainer_cannot_log():
    names = [name for _, name, _ in _rows()]
    assert len(names) == len(set(names)), "a name is documented twice"
    assert sorted(set(names) - _loggable()) == []


@pytest.mark.parametrize("group", GROUPS)
def test_each_group_has_its_section_and_each_row_says_meaning_unit_and_range(group):
    rows = [(heading, name, cells) for heading, name, cells in _rows() if name.split("/")[0] == group]
    assert rows, f"docs/metrics.md has no {group}/ names"
    for heading, name, cells in rows:
        assert heading == group, f"{name} is under ## {heading}/"
        assert len(cells) == 4 and all(cells), f"{name}: expected name | meaning | unit | healthy range"
