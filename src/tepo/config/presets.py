"""The presets as a table: what ``tepo presets`` prints and the README shows (a test keeps the two equal).

Each preset file opens with a comment saying what it is; its first sentence is the preset's summary. The loss and
the estimator are read from the resolved configuration, so the table cannot disagree with what the preset trains.
"""

from __future__ import annotations

import re
from importlib import resources

from tepo.config.loading import list_presets, load_config

# A sentence ends at a full stop followed by a space and a capital or a backtick, except after the abbreviation
# "w." (TEPO Table 2's "w. KL-Divergence"); "et al. 2505.22617" does not end one either.
_SENTENCE_END = re.compile(r"(?<!\bw)\.\s+(?=[A-Z`])")


def preset_summary(name: str) -> str:
    """The first sentence of the comment that opens preset ``name``'s file."""
    text = (resources.files("tepo.configs") / f"{name}.yaml").read_text(encoding="utf-8")
    comment = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    joined = " ".join(part for part in comment if part)
    first = _SENTENCE_END.split(joined, maxsplit=1)[0].strip()
    return first if first.endswith(".") or not first else first + "."


def describe_presets() -> list[dict[str, str]]:
    """One row per preset: name, loss, advantage estimator and summary."""
    rows = []
    for name in list_presets():
        config = load_config(name)
        rows.append(
            {
                "name": name,
                "loss": config.algorithm.loss,
                "advantage": config.algorithm.advantage,
                "summary": preset_summary(name),
            }
        )
    return rows


def presets_table(*, markdown: bool = False) -> str:
    """:func:`describe_presets` as a plain-text table, or as a Markdown one."""
    from tepo.metrics.tables import text_table

    rows = [(r["name"], r["loss"], r["advantage"], r["summary"]) for r in describe_presets()]
    return text_table(("preset", "loss", "estimator", "what it is"), rows, markdown=markdown)
