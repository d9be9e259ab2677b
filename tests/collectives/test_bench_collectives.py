"""bench/bench_collectives.py --ops: all-gather and reduce-scatter timed
beside the all-reduce against lax's, each result checked against numpy first
(a fast but wrong variant must fail, not report a bandwidth); and two
islands of two devices against one island of four (test_two_by_two_layout.py's
layout), in the same run as the islands of several processes."""

import importlib.util
import types
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

REPO = Path(__file__).resolve().parents[2]

# Two islands of two devices, the first of two processes: every op at 256 KiB
# and 1 MiB per device. One run serves the tests of both (bench_runs).
TWO_BY_TWO = "--islands cpu*2/2,cpu*2 --ops psum,all_gather,psum_scatter --min-kib 256 --max-mib 1".split()


def _bench():
    spec = importlib.util.spec_from_file_location("bench_collectives", REPO / "bench" / "bench_collectives.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shards(island_values, devices: int):
    """What a jax array's addressable_shards give _check: one per device of
    the island, in order."""
    n = island_values.size // devices
    return types.SimpleNamespace(
        shape=island_values.shape,
        addressable_shards=[
            types.SimpleNamespace(index=(slice(i * n, (i + 1) * n),), data=island_values[i * n : (i + 1) * n])
            for i in range(devices)
        ],
    )


@pytest.mark.parametrize("op", ["psum", "all_gather", "psum_scatter"])
def test_check_accepts_the_right_result_and_refuses_a_wrong_one(op):
    bench = _bench()
    # Islands of 1, 2 and 1 devices; this process holds the second (global devices 1 and 2).
    group = types.SimpleNamespace(island_sizes=(1, 2, 1), total_devices=4, device_offset=1)
    size = 4 * 4 * 64
    # Each device's input, written out here: seed = global device index.
    xs = [np.random.default_rng(g).standard_normal(size // 4).astype(np.float32) for g in range(4)]
    total = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    per_device = {
        "psum": [total, total],
        "all_gather": [np.concatenate(xs)] * 2,
        "psum_scatter": [total.reshape(4, -1)[1], total.reshape(4, -1)[2]],
    }[op]
    right = np.concatenate(per_device)
    expected = bench._expected(group, size)
    bench._check(op, _shards(right, 2), expected, group, size)
    wrong = right.copy()
    wrong[-1] += 1e-2  # the second device's last element
    with pytest.raises(SystemExit, match=f"{op} of {size} bytes on device 2: wrong result"):
        bench._check(op, _shards(wrong, 2), expected, group, size)
    with pytest.raises(SystemExit, match="wrong result"):
        bench._check(op, _shards(right[:-2], 2), expected, group, size)


def test_bench_runs_islands_of_several_processes(bench_runs):
    """cpu*2/2,cpu*2: the two-process island joins its own jax.distributed
    cluster, and every process fills and checks its own shards (the bench
    exits non-zero on a wrong result)."""
    result, _, _ = bench_runs(*TWO_BY_TWO)
    assert result["island_sizes"] == [2, 2] and result["devices"] == 4
    for row in result["rows"]:
        assert all(row[f"hetjax_{op}_us"] > 0 for op in ("ring", "all_gather", "psum_scatter")), row["bytes"]


def test_bench_compares_two_by_two_islands_with_one_island_of_four(bench_runs):
    result, _, _ = bench_runs(*TWO_BY_TWO)
    assert result["island_sizes"] == [2, 2] and result["devices"] == 4
    assert result["reference"] == "cpu*4" and result["reference_devices"] == 4
    assert result["command"].startswith("python bench/bench_collectives.py")
    assert result["date"] and result["machine"]["cpus"]
    assert [r["bytes"] for r in result["rows"]] == [256 << 10, 1 << 20]
    for row in result["rows"]:
        for key in ("hetjax_ring", "hetjax_ordered", "xla_psum"):
            # busbw is derived from the time with G = 4: 2 (G-1) / G = 1.5
            assert row[f"{key}_busbw_GBps"] == pytest.approx(row["bytes"] * 1.5 / (row[f"{key}_us"] * 1e-6) / 1e9)


def test_bad_ops_and_sizes_are_refused_before_any_process_starts():
    bench = _bench()
    with pytest.raises(
        SystemExit, match="--ops: expected a comma list of psum, all_gather, psum_scatter, got 'psum,gather'"
    ):
        bench.main(["--ops", "psum,gather", "--out", "/nonexistent/never.json"])
    with pytest.raises(SystemExit, match="no size to time: --min-kib 4096 is above --max-mib 1"):
        bench.main(["--min-kib", "4096", "--max-mib", "1", "--out", "/nonexistent/never.json"])


def test_bench_times_every_op_against_lax_on_two_islands(bench_runs):
    result, stdout, result_json = bench_runs(
        "--islands", "2", "--ops", "psum,all_gather,psum_scatter", "--min-kib", "1024", "--max-mib", "1"
    )
    assert result["ops"] == ["psum", "all_gather", "psum_scatter"] and result["devices"] == 2
    (row,) = result["rows"]
    assert row["bytes"] == 1 << 20
    # NCCL's bus factors for G = 2: all-reduce 2(G-1)/G = 1, all-gather G-1 = 1,
    # reduce-scatter (G-1)/G = 1/2.
    for key, factor in (
        ("hetjax_ring", 1.0),
        ("hetjax_all_gather", 1.0),
        ("hetjax_psum_scatter", 0.5),
        ("xla_psum", 1.0),
        ("xla_all_gather", 1.0),
        ("xla_psum_scatter", 0.5),
    ):
        assert row[f"{key}_busbw_GBps"] == pytest.approx(row["bytes"] * factor / (row[f"{key}_us"] * 1e-6) / 1e9)
    assert row["all_gather_over_xla"] == pytest.approx(row["xla_all_gather_us"] / row["hetjax_all_gather_us"])
    assert row["psum_scatter_over_xla"] == pytest.approx(row["xla_psum_scatter_us"] / row["hetjax_psum_scatter_us"])
    assert "all_gather busbw GB/s" in stdout and result_json.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # How far apart the two island processes started each timed call: a
    # median over the calls, never negative, shorter than the calls took
    # overall (every call ends before the next one starts on each island).
    for key in ("hetjax_ring", "hetjax_all_gather", "hetjax_psum_scatter"):
        skew = row[f"{key}_start_skew_us"]
        assert 0 <= skew < 20 * row[f"{key}_us"], (key, skew)
    assert "xla_psum_start_skew_us" not in row and "ring start skew us" in stdout


def test_start_skew_is_the_median_spread_of_the_islands_starts():
    bench = _bench()
    # Three calls on three islands: spreads 5, 40 and 2 us; median 5.
    starts = [[1_000, 2_000_000, 3_000_000], [6_000, 2_040_000, 3_001_000], [3_000, 2_010_000, 3_002_000]]
    assert bench._start_skew_us(starts) == pytest.approx(5.0)
    with pytest.raises(ValueError):
        bench._start_skew_us([[1, 2], [1]])  # the islands timed different numbers of calls
