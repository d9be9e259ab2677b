"""Fixtures shared by every test folder. Keep this small and general."""

import os
from pathlib import Path

import pytest

from tests.compile_cache import share_compilation_cache

# Tests and the processes they start run on the CPU platform only.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole session, set before any
# test module imports jax: a program compiled once (a plain-loop reference,
# a model's forward, a `hetjax train` job's stage programs) is a load
# wherever it comes again, in this process and in every process it starts.
share_compilation_cache()

REPO_ROOT = Path(__file__).resolve().parents[1]

# Fuzz tests (hypothesis) draw the same examples on every CI run, so a red CI
# always means a change broke something; HETJAX_FUZZ_RANDOM=1 explores new
# examples (a failure then prints the example to add as a regression case).
try:
    from hypothesis import settings as _hypothesis_settings

    _hypothesis_settings.register_profile("hetjax", derandomize=os.environ.get("HETJAX_FUZZ_RANDOM") != "1")
    _hypothesis_settings.load_profile("hetjax")
except ImportError:
    pass


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
