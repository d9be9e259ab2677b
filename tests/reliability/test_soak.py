"""The soak test, short: bench/soak.py with 20,000 messages between three
islands (one shm link, two tcp links), every byte checked, no growth of the
resident heap or of the job's shm segments, nothing left in /dev/shm."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import soak  # noqa: E402

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
MESSAGES = 20_000


def test_short_soak_checks_every_byte_and_does_not_grow(tmp_path, capsys):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--messages",
            str(MESSAGES),
            "--max-bytes",
            str(1 << 20),
            "--timeout",
            "60",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["problems"] == [] and proc.returncode == 0, result["problems"] or proc.stderr[-3000:]
    assert result["messages"] >= MESSAGES
    assert result["transports"] == ["shm", "tcp"]
    assert result["shm_segments_end"] == result["shm_segments_start"]
    assert result["shm_segments_left_after_stop"] == 0
    with capsys.disabled():
        print(
            f"\n[soak] {result['messages']} messages, {result['bytes'] / 2**20:.0f} MiB in "
            f"{result['duration_s']} s; RssAnon {result['rss_anon_start']} -> {result['rss_anon_end']}"
        )


def report(**changes):
    rank = {
        "rank": 0,
        "errors": [],
        "messages_received": 10,
        "expected": 10,
        "anon_warm": 100 << 20,
        "anon_end": 100 << 20,
        "shm_warm": 2,
        "shm_end": 2,
    }
    return {
        "codes": [0, 0, 0],
        "shm_left_after_stop": 0,
        "ranks": [{**rank, "rank": r, **(changes if r == 1 else {})} for r in range(3)],
    }


def test_the_verdict_names_every_kind_of_failure():
    assert soak.verdict(report(), 1 << 20) == []
    assert soak.verdict(report(anon_end=(100 << 20) + (2 << 20)), 1 << 20) == [
        f"rank 1: resident heap (RssAnon) grew {100 << 20} -> {(100 << 20) + (2 << 20)} bytes (tolerance {1 << 20})"
    ]
    assert soak.verdict(report(shm_end=3), 1 << 20) == ["rank 1: shm segments grew 2 -> 3"]
    assert soak.verdict(report(messages_received=9), 1 << 20) == ["rank 1: received 9 of 10 messages"]
    assert soak.verdict(report(errors=["message 3 from rank 0 differs"]), 1 << 20) == [
        "rank 1: message 3 from rank 0 differs"
    ]
    assert soak.verdict({**report(), "shm_left_after_stop": 2}, 1 << 20) == [
        "2 shm segments of the job left after every rank stopped"
    ]


def test_payloads_differ_per_message_and_receive_order_keeps_per_tag_order():
    messages = soak.plan(0, 1, 200, seed=3, max_bytes=1 << 16)
    base = soak.base_bytes(0, 1, 3, 1 << 16)
    a = soak.payload(base, 7, np.dtype(np.uint8), 64)
    b = soak.payload(base, 8, np.dtype(np.uint8), 64)
    assert not np.array_equal(a, b)
    order = soak.receive_order(messages, 3, 0, 1)
    assert sorted(order) == list(range(200)) and order != list(range(200))
    for tag in {m[0] for m in messages}:
        assert [i for i in order if messages[i][0] == tag] == [i for i in range(200) if messages[i][0] == tag]
