"""Learning test (slow, opt-in with -m slow): the embedded default actually learns.

The default run (TEPO, single-digit arithmetic, 4 prompts x 8 samples) with a fixed seed must end with higher
held-out sampled accuracy than it started with, and a higher batch reward in the last third of the steps than
in the first. Fixed seed and deterministic CPU kernels make the outcome repeatable; the thresholds are "above",
not tuned numbers.
"""

from __future__ import annotations

import pytest

from tepo.config import load_config
from tepo.training import train

pytestmark = [pytest.mark.slow, pytest.mark.model]


def test_default_run_improves_held_out_accuracy(tmp_path):
    config = load_config(
        "default", [f"train.output_dir={tmp_path}", "train.run_name=learn", "log.progress=false"]
    )
    summary = train(config, log=lambda *_: None).summary
    before, after = summary["before"], summary["after"]
    assert after["eval_sampled_accuracy"] > before["eval_sampled_accuracy"], summary
    assert summary["reward_last_third"] > summary["reward_first_third"], summary
