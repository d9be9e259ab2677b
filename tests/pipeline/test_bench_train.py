"""bench/bench_train.py at tiny size on CPU islands: the five configurations
run, (a) and (b) train the same model on the same data, (d) data parallelism
across islands follows (e) on one island, and the plot is drawn."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 150


def test_bench_train_cpu_smoke(tmp_path):
    results = tmp_path / "train_cpu.json"
    cmd = [
        sys.executable,
        str(REPO / "bench" / "bench_train.py"),
        "--platform",
        "cpu",
        "--models",
        "tiny",
        "--configs",
        "abcde",
        "--steps",
        "5",
        "--seq-len",
        "16",
        "--batch",
        "4",
        "--microbatches",
        "2",
        "--data",
        "builtin",
        "--run-timeout",
        str(RUN_TIMEOUT_S),
        "--out",
        str(tmp_path / "runs"),
        "--json",
        str(results),
        "--train-args",
        "--seed 0 --no-plot",  # the default seed, passed through to every run
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=5 * RUN_TIMEOUT_S + 120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(results.read_text())
    runs = {r["config"]: r for r in result["runs"]}
    assert sorted(runs) == ["a", "b", "c", "d", "e"]
    assert runs["a"]["layers_per_stage"] == runs["b"]["layers_per_stage"] and len(runs["a"]["layers_per_stage"]) == 2
    assert runs["c"]["layers_per_stage"] == [sum(runs["a"]["layers_per_stage"])]
    for r in runs.values():
        assert r["command"].endswith("--seed 0 --no-plot"), r["command"]
        assert len(r["per_step"]["loss"]) == 5 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["tflops_per_device"] == pytest.approx(r["flops_per_token"] * r["tokens_per_s"] / 2 / 1e12, rel=1e-3)
    # Same stages, same data: (a) over the bridge and (b) in one process agree.
    np.testing.assert_allclose(runs["a"]["per_step"]["loss"], runs["b"]["per_step"]["loss"], rtol=1e-5)
    assert runs["a"]["per_step"]["loss"][-1] < runs["a"]["per_step"]["loss"][0]
    comparison = result["comparisons"]["tiny"]
    assert comparison["final_loss_rel_diff"] < 1e-5
    assert comparison["a_over_b"] == pytest.approx(runs["a"]["tokens_per_s"] / runs["b"]["tokens_per_s"], rel=1e-3)
    assert "a_over_c" in comparison
    # (d) runs twice (e)'s microbatches: one row per device in both.
    assert (runs["d"]["microbatches"], runs["e"]["microbatches"]) == (4, 2)
    # The same data-parallel step over the bridge and inside one island (bf16
    # compute: rows sit on other devices, so partial sums round differently).
    np.testing.assert_allclose(runs["d"]["per_step"]["loss"], runs["e"]["per_step"]["loss"], rtol=1e-3)
    assert comparison["d_over_e"] == pytest.approx(runs["d"]["tokens_per_s"] / runs["e"]["tokens_per_s"], rel=1e-3)
    assert comparison["d_final_loss_rel_diff"] < 1e-3

    png = tmp_path / "train_cpu.png"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "plot_bench.py"), str(results), str(png)], check=True, timeout=120
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_comparisons_cover_the_host_staged_bridge_beside_the_default_one():
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from bench_train import compare, config_flags
    finally:
        sys.path.pop(0)
    runs = {
        "a": {"tokens_per_s": 99.0, "per_step": {"loss": [3.0, 2.0]}},
        "h": {"tokens_per_s": 90.0, "per_step": {"loss": [3.0, 2.002]}},
        "b": {"tokens_per_s": 100.0, "per_step": {"loss": [3.0, 2.001]}},
        "c": {"tokens_per_s": 110.0},
    }
    out = compare(runs)
    assert out["a_over_b"] == 0.99 and out["h_over_b"] == 0.9 and out["h_over_c"] == pytest.approx(0.8182)
    assert out["final_loss_rel_diff"] == pytest.approx(0.001 / 2.001)
    assert out["h_final_loss_rel_diff"] == pytest.approx(0.001 / 2.001)
    assert config_flags("h", "cuda", 2, [17, 15], False) == config_flags("a", "cuda", 2, [17, 15], False)
    assert config_flags("d", "cuda", 2, [17, 15], False)[:4] == ["--parallel", "data", "--islands", "cuda:0,cuda:1"]
    assert config_flags("e", "cuda", 4, [17, 15], False)[:4] == ["--parallel", "data", "--islands", "cuda:0-3"]
    # Two islands of two GPUs: a process per GPU, so that the collectives ride the channels.
    assert config_flags("d", "cuda", 4, [17, 15], False)[3] == "cuda:0-1/2,cuda:2-3/2"
    assert config_flags("d", "cpu", 4, [17, 15], False)[3] == "cpu*2,cpu*2"
    # One island per device, data parallel.
    assert config_flags("s", "cuda", 4, [17, 15], False)[:4] == [
        "--parallel",
        "data",
        "--islands",
        "cuda:0,cuda:1,cuda:2,cuda:3",
    ]
    assert config_flags("s", "cpu", 2, [17, 15], False)[3] == "cpu,cpu"
    data = compare(
        {
            "d": {"tokens_per_s": 96.0, "per_step": {"loss": [3.0, 2.0]}},
            "e": {"tokens_per_s": 100.0, "per_step": {"loss": [3.0, 2.002]}},
        }
    )
    assert data["d_over_e"] == 0.96 and data["d_final_loss_rel_diff"] == pytest.approx(0.002 / 2.002)
    singles = compare({"s": {"tokens_per_s": 98.0}, "e": {"tokens_per_s": 100.0}})
    assert singles["s_over_e"] == 0.98
    hybrid = compare(
        {
            "r": {"tokens_per_s": 90.0, "per_step": {"loss": [3.0, 2.0]}},
            "e": {"tokens_per_s": 100.0, "per_step": {"loss": [3.0, 2.002]}},
        }
    )
    assert hybrid["r_over_e"] == 0.9 and hybrid["r_max_loss_rel_diff"] == pytest.approx(0.002 / 2.002)
    assert config_flags("r", "cuda", 4, [8, 8], False) == [
        "--islands",
        "cuda:0,cuda:1,cuda:2,cuda:3",
        "--replicas",
        "2",
        "--plan",
        "8,8",
        "--memory-gb",
        "100000,100000,100000,100000",
    ]
