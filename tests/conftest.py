"""Fixtures shared by every test folder. Keep this small and general."""

import os
from pathlib import Path

import pytest

# Tests and the processes they start run on the CPU platform only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
