"""bench/bench_collectives.py --replot draws a saved result's bus
bandwidth against size (hetjax.plots.plot_busbw)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

REPO = Path(__file__).parents[2]


def test_replot_draws_every_bandwidth_column(tmp_path):
    rows = [
        {"bytes": b, "hetjax_ring_busbw_GBps": b / 1e6, "xla_psum_busbw_GBps": b / 5e5, "hetjax_ring_us": 1.0}
        for b in (1024, 1 << 20, 1 << 26)
    ]
    result = tmp_path / "collectives.json"
    result.write_text(json.dumps({"islands": "cpu,cpu", "rows": rows}))
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_collectives.py"), "--replot", str(result)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "collectives.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_result_without_bandwidths_is_refused(tmp_path):
    from hetjax.plots import plot_busbw

    with pytest.raises(ValueError, match="busbw_GBps"):
        plot_busbw({"rows": [{"bytes": 1, "hetjax_ring_us": 3.0}]}, tmp_path / "x.png")
