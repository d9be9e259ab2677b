"""The pair kernel on large messages (tests/gpu/workers/pair_large.py): every
element of a 256 MiB and a 5 GB float32 all-reduce between two one-GPU
islands, the last one included, equals the exact sum, call after call, with
the islands arriving at different moments. Skipped without a GPU."""

from pathlib import Path

import pytest

from tests.gpu.test_collectives_channels import _run_islands

pytestmark = pytest.mark.gpu

WORKER = Path(__file__).parent / "workers" / "pair_large.py"


def test_large_all_reduce_is_exact_to_its_last_element():
    text = _run_islands(WORKER, 2, {}, 400)
    assert "BAD" not in text
    assert "OK rank 0" in text and "OK rank 1" in text
