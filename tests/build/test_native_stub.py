"""hetjax/_native.pyi types the native module for mypy and editors; it must
say what the built module really offers."""

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
STUB = Path(__file__).parents[2] / "hetjax" / "_native.pyi"


def test_committed_stub_matches_the_built_module(tmp_path):
    fresh = tmp_path / "_native.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "hetjax._native", "-o", str(fresh)],
        check=True,
    )
    assert fresh.read_text() == STUB.read_text(), (
        "hetjax/_native.pyi is stale: regenerate it with "
        "python -m nanobind.stubgen -m hetjax._native -o hetjax/_native.pyi"
    )
