"""Two islands of two devices each against one island of four, on CPU
islands: the layout of the 4-GPU runs (`cuda:0-1,cuda:2-3` vs `cuda:0-3`).

- The hierarchical psum (island psum_scatter, the bridge per device pair,
  island all_gather) equals lax.psum over the four devices as one island.
- `hetjax train` runs one stage per two-device island, data parallel inside
  it, and trains exactly like one four-device island with the same two
  stages (placed as bench/bench_train.py --devices 4 places configurations
  a and b).
- bench/bench_collectives.py compares the two layouts in one run
  (test_bench_collectives.py, in its run with a two-process island).
"""

import importlib.util
import json
import pathlib
import sys

import numpy as np
import pytest

from tests.collectives.test_collectives import TWO_DEVICE, run_checks
from tests.train_runs import finish_train, start_train

pytest.importorskip("hetjax._native", reason="not built: pip install --no-build-isolation -e .")

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_two_islands_of_two_psum_like_one_island_of_four(island_runs):
    # The launch of test_collectives.py's checks on [2, 2] islands.
    codes, out = run_checks(island_runs, [2, 2], TWO_DEVICE)
    assert codes == [0, 0]
    assert out.count("OK hierarchical on rank") == 2


def _bench_train_flags(config: str) -> list[str]:
    """bench/bench_train.py's placement of configuration a or b on 4 devices."""
    spec = importlib.util.spec_from_file_location("bench_train", REPO / "bench" / "bench_train.py")
    bench_train = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_train", bench_train)  # its dataclasses look it up
    spec.loader.exec_module(bench_train)
    return bench_train.config_flags(config, "cpu", 4, [2, 2], fsdp=False)


def test_pipeline_over_two_by_two_islands_trains_like_one_island_of_four(tmp_path):
    flags_a, flags_b = _bench_train_flags("a"), _bench_train_flags("b")
    assert flags_a[:2] == ["--islands", "cpu*2,cpu*2"]
    assert flags_b[:4] == ["--islands", "cpu*4", "--stages", "2"]
    # Side by side: each job compiles mostly one process at a time.
    common = [
        "tiny",
        "--steps",
        "4",
        "--seq-len",
        "16",
        "--batch",
        "8",
        "--microbatches",
        "2",
        "--schedule",
        "1f1b",
        "--data",
        "builtin",
        "--lr",
        "1e-2",
    ]
    started = [start_train(tmp_path / c, *common, *f) for c, f in (("a", flags_a), ("b", flags_b))]
    la, lb = ([row["loss"] for row in finish_train(job)] for job in started)
    # Each island's stage ran on its two devices (rows split over them).
    stages = json.loads((tmp_path / "a" / "job.json").read_text())["plan"]["stages"]
    assert [(s["island"], s["devices"]) for s in stages] == [(0, 2), (1, 2)]
    assert len(la) == 4 and la[-1] < la[0]
    np.testing.assert_allclose(la, lb, rtol=1e-5)
