"""A worker that runs out of device memory where Python never sees it (XLA's
CUDA-graph instantiation aborts the process from C++): the parent still
names the island in the one out-of-memory line, and does not restart."""

import io
import signal

import hetjax.launch
from hetjax import cli
from hetjax.job.oom_lines import OutOfMemoryLines

ABORT_LINES = (
    "[island1] W1127 17:11:35.065062    4217 cuda_command_buffer.cc:1069] Retry CUDA graph instantiation after OOM error\n"
    "[island1] F1127 17:12:15.068575    4226 rendezvous.cc:161] Termination timeout exceeded.\n"
)


def test_the_lines_name_each_island_that_ran_out_once():
    seen = OutOfMemoryLines(io.StringIO())
    seen.write("[island0] step 1\n[island1] jaxlib...RESOURCE_EXHAUSTED: Out of mem")
    seen.write("ory while trying to allocate 6.28GiB\n[island2.1] hipErrorOutOfMemory\n")
    seen.write(ABORT_LINES)
    assert seen.islands == ["island1", "island2.1"]
    assert seen.output.getvalue().count("\n") == 5
    clean = OutOfMemoryLines(io.StringIO())
    clean.write("[island0] hetjax worker rank 0: PeerLostError: peer rank 1 lost\n")
    assert clean.islands == []


def test_an_abort_after_an_oom_line_is_reported_as_out_of_memory(tmp_path, monkeypatch, capsys):
    def aborted(specs, output, **kwargs):
        output.write(ABORT_LINES)
        return [-signal.SIGTERM, -signal.SIGABRT]

    monkeypatch.setattr(hetjax.launch, "run_local", aborted)
    flags = ["train", "tiny", "--islands", "cpu,cpu", "--steps", "2", "--no-progress", "--no-plot"]
    assert cli.main([*flags, "--out", str(tmp_path / "run"), "--max-restarts", "2", "--checkpoint-every", "1"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "out of memory" in line]
    assert len(lines) == 1 and lines[0].startswith("hetjax train: out of memory on island1 (stage 1"), err
    assert "restart" not in err, err
