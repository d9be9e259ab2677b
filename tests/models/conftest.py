"""Shared set-up for the model tests: import path, fp32 matmuls, and the parity summary."""

import pathlib
import sys

import jax
import pytest

# `models` is a top-level folder of the repository (shipped as hetjax.models);
# make it importable however pytest was started.
_REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[2])
if _REPO_ROOT not in sys.path:
    sys.path.insert(0, _REPO_ROOT)

# Largest |ours - HF float64| logit difference per family, over the largest logit, filled by test_hf_parity.
_PARITY = pytest.StashKey[dict]()


@pytest.fixture
def parity_record(pytestconfig) -> dict:
    return pytestconfig.stash.setdefault(_PARITY, {})


@pytest.fixture(autouse=True)
def _highest_matmul_precision():
    # Exact fp32 matmuls: on some backends the default may use reduced precision.
    with jax.default_matmul_precision("highest"):
        yield


def pytest_terminal_summary(terminalreporter, config):
    record = config.stash.get(_PARITY, None)
    if record:
        terminalreporter.section("HF parity (fp32)")
        for family, diff in sorted(record.items()):
            terminalreporter.write_line(
                f"largest logit difference vs transformers (float64), {family}: {diff:.3g} of the largest logit"
            )
