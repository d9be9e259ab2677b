"""A job that fails leaves nothing in /dev/shm: the opening end unlinks each
segment once mapped, a rank whose start-up fails removes its own, and the
launcher removes whatever a killed rank left (bridge/segments.py). A
training run's SIGKILLed island is test_kill_and_resume.py's killed run,
which trains over shared memory."""

import io
import os
import secrets
import sys
from pathlib import Path

import pytest

from hetjax.bridge import segments
from hetjax.launch import ProcessSpec, run_local
from tests.reliability.bridge_pair import pair_env, run_pair

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")
WORKER = Path(__file__).parent / "workers" / "startup_kill.py"


def test_remove_job_segments_takes_only_that_jobs(tmp_path):
    for name in ("hetjax-aaa1-0-1", "hetjax-aaa1-gpu-1-0", "hetjax-aaa12-0-1", "hetjax-bbb-0-1", "other"):
        (tmp_path / name).write_bytes(b"x")
    removed = segments.remove_job_segments("aaa1", shm_dir=str(tmp_path))
    assert removed == ["hetjax-aaa1-0-1", "hetjax-aaa1-gpu-1-0"]
    assert sorted(os.listdir(tmp_path)) == ["hetjax-aaa12-0-1", "hetjax-bbb-0-1", "other"]


def test_job_id_cannot_escape_the_name():
    for bad in ("", "a/b", "a-b", "x" * 33):
        with pytest.raises(ValueError, match="job id"):
            segments.job_prefix(bad)


def test_launcher_removes_what_a_rank_killed_in_start_up_left():
    job_id = secrets.token_hex(6)
    env = {"JAX_PLATFORMS": "cpu", "HETJAX_TRANSPORT": "shm", "HETJAX_TIMEOUT": "60"}
    specs = [ProcessSpec(f"rank{r}", [sys.executable, str(WORKER)], env) for r in (0, 1)]
    out = io.StringIO()
    codes = run_local(specs, timeout_s=120, output=out, job_id=job_id)
    log = out.getvalue()
    # Rank 0 saw rank 1's segment and died; rank 1 was stopped while waiting
    # for rank 0's, so its own segment was never opened nor unlinked by it.
    assert codes[0] == -9 and codes[1] != 0, log
    assert f"SEEN /hetjax-{job_id}-" in log, log
    assert "[launch] removed 1 shared-memory segment(s)" in log, log
    assert segments.job_segments(job_id) == []


def test_survivor_of_a_start_up_kill_removes_its_own_segment():
    """No launcher: rank 1 times out waiting for the dead rank 0 and must
    leave nothing behind on its own."""
    job_id = secrets.token_hex(6)
    env = pair_env(HETJAX_TRANSPORT="shm", HETJAX_TIMEOUT="5", HETJAX_JOB_ID=job_id)
    codes, outputs = run_pair([str(WORKER)], env, timeout_s=120)
    assert codes[0] == -9 and "SEEN" in outputs[0], outputs[0][-2000:]
    assert codes[1] == 3 and "FAILED" in outputs[1], outputs[1][-2000:]
    assert segments.job_segments(job_id) == []
