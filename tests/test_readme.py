"""README.md, checked: the two set-up commands first (and .ci/run running the second's test command), at most 330
lines besides the generated tables, a table of contents whose links all land, the preset, loss and estimator tables exactly what the CLI prints,
every repository path it names existing, a LICENSE matching pyproject.toml, and a citation block."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SETUP = [
    "bash scripts/install.sh && .venv/bin/tepo train",
    "bash scripts/install.sh && .venv/bin/python -m pytest",
]
# The Apache License 2.0 as published at https://www.apache.org/licenses/LICENSE-2.0.txt (202 lines).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
# Repository paths as the README names them (in links, backticks or commands); the top-level folders they start in.
PATH = re.compile(r"(?<![\w./~$<-])((?:src|docs|scripts|tests|examples|benchmarks|\.ci)/[\w.\-/]*[\w/])")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_starts_with_the_two_setup_commands_and_ci_runs_the_second():
    first_block = re.search(r"```bash\n(.*?)```", _text(), re.S).group(1)
    assert first_block.splitlines() == SETUP
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/install.sh" in ci and ".venv/bin/python -m pytest" in ci


def test_at_most_330_lines_besides_the_generated_tables():
    """The hand-written text stays short; the generated tables grow by a row with each registered name (every one
    must have its row, below), so their rows do not count."""
    text = _text()
    table_rows = sum(len(table.splitlines()) for _, table in _table_script().generated_tables(text))
    assert len(text.splitlines()) - table_rows <= 330


def test_the_contents_link_every_later_section_and_every_anchor_lands():
    text = _text()
    headings = re.findall(r"^##+ (.+)$", text, re.M)
    slugs = {_slug(h) for h in headings}
    anchors = re.findall(r"\]\(#([^)]+)\)", text)
    assert [a for a in anchors if a not in slugs] == []
    after = text.split("## Contents", 1)[1]
    contents = after.split("\n## ", 1)[0]
    sections = re.findall(r"^## (.+)$", after, re.M)  # the sections below the contents
    assert [h for h in sections if f"(#{_slug(h)})" not in contents] == []


def _table_script():
    spec = importlib.util.spec_from_file_location(
        "update_readme_tables", ROOT / "scripts/update_readme_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_preset_loss_and_estimator_tables_are_what_the_cli_prints():
    script = _table_script()
    tables = dict(script.generated_tables(_text()))
    assert sorted(tables) == ["estimators", "losses", "presets"]
    for command, table in tables.items():
        assert table == script.cli_table(command), (
            f"README's `tepo {command}` table differs from the CLI's: "
            "run .venv/bin/python scripts/update_readme_tables.py"
        )


@pytest.mark.parametrize("command", ["losses", "estimators", "presets"])
def test_each_registered_name_has_a_row(command):
    from tepo.advantages import list_advantage_estimators
    from tepo.config import list_presets
    from tepo.losses import list_policy_losses

    names = {"losses": list_policy_losses, "estimators": list_advantage_estimators, "presets": list_presets}
    table = dict(_table_script().generated_tables(_text()))[command]
    rows = [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines()[2:]]
    assert sorted(rows) == sorted(names[command]())


def test_every_path_the_readme_names_exists():
    text = _text()
    links = [t for t in LINK.findall(text) if not t.startswith(("http://", "https://", "#", "mailto:"))]
    paths = [p for p in PATH.findall(text) if "<" not in p]
    missing = sorted({p for p in links + paths if not (ROOT / p.split("#")[0]).exists()})
    assert missing == [], f"README.md names paths that do not exist: {missing}"
    assert len(paths) > 20 and len(links) > 15  # the patterns still find what the README names


def test_the_license_file_is_the_one_pyproject_names():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256, "LICENSE is not the Apache License 2.0 text"
    assert "[LICENSE](LICENSE)" in _text()


def test_a_citation_block_for_the_software_and_the_paper():
    citation = _text().split("## Citation", 1)[1]
    assert "```bibtex" in citation and "@software{" in citation
    assert "2510.09369" in citation and "@article{" in citation


@pytest.mark.parametrize("page", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_every_relative_link_of_the_docs_pages_exists(page):
    """The pages the README sends its long material to: their relative links land (relative to the page)."""
    links = [
        t
        for t in LINK.findall(page.read_text(encoding="utf-8"))
        if not t.startswith(("http", "#", "mailto:"))
    ]
    assert [t for t in links if not (page.parent / t.split("#")[0]).exists()] == []
