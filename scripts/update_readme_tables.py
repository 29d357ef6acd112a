"""Rewrite the README's generated tables from the CLI: the table under each ``<!-- generated: tepo X --markdown -->``
marker is replaced by what ``tepo X --markdown`` prints now (run after adding a loss, an estimator or a preset).

    .venv/bin/python scripts/update_readme_tables.py          # rewrite README.md in place
    .venv/bin/python scripts/update_readme_tables.py --check  # exit 1 if a table differs (what the test asserts)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

from tepo.cli import main as tepo_main

README = Path(__file__).resolve().parents[1] / "README.md"
MARKER = re.compile(r"^<!-- generated: tepo (\w+) --markdown -->$")


def cli_table(command: str) -> str:
    """What ``tepo COMMAND --markdown`` prints, without its final newline."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        tepo_main([command, "--markdown"])
    return out.getvalue().rstrip("\n")


def generated_tables(text: str) -> list[tuple[str, str]]:
    """``(command, table in the text)`` for each marker: the run of ``|`` lines after it and one blank line (the
    blank line ends the HTML comment's block, so the table renders as a table)."""
    lines, found = text.splitlines(), []
    for i, line in enumerate(lines):
        marker = MARKER.match(line)
        if marker:
            start = end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            found.append((marker.group(1), "\n".join(lines[start:end])))
    return found


def refreshed(text: str) -> str:
    for command, table in generated_tables(text):
        marker = f"<!-- generated: tepo {command} --markdown -->"
        text = text.replace(f"{marker}\n\n{table}", f"{marker}\n\n{cli_table(command)}", 1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say whether the tables are current")
    args = parser.parse_args(argv)
    text = README.read_text(encoding="utf-8")
    new = refreshed(text)
    if args.check:
        stale = [
            cmd for (cmd, old), (_, cur) in zip(generated_tables(text), generated_tables(new)) if old != cur
        ]
        print("stale: " + ", ".join(stale) if stale else "README tables are current")
        return 1 if stale else 0
    if new != text:
        README.write_text(new, encoding="utf-8")
    print(f"{README}: {'updated' if new != text else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
