"""eval.pass_k_samples: which k are scored, and bad values refused (the real run: test_train_e2e's ep_grpo test)."""

from __future__ import annotations

import pytest

from helpers import config_error_lines
from tepo.config import load_config
from tepo.training.evaluation import pass_k_values


@pytest.mark.parametrize(
    "n, ks", [(0, []), (1, [1]), (2, [1, 2]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]), (9, [1, 2, 4, 8, 9])]
)
def test_pass_k_values_are_powers_of_two_up_to_n_and_n(n, ks):
    assert pass_k_values(n) == ks


def test_default_is_off():
    assert load_config("default").eval.pass_k_samples == 0


@pytest.mark.parametrize(
    "value, message",
    [
        ("-1", "eval.pass_k_samples must be an int >= 0 (got -1)"),
        ("2.5", "expected int"),
        ("true", "expected int"),
    ],
)
def test_a_bad_pass_k_samples_is_one_line(value, message):
    lines = config_error_lines([f"eval.pass_k_samples={value}"])
    assert len(lines) == 2 and "eval.pass_k_samples" in lines[1] and message in lines[1], lines
