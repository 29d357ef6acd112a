"""Fixtures of the integration tests: the verl environment (the runner itself is tests/verl_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def verl_python() -> Path:
    """Python of ``.venv-verl`` with verl 0.9.1 and this checkout of tepo (editable), built once per session."""
    from verl_runner import build_verl_python

    return build_verl_python()
