"""The end of `hetjax train`: the printed summary (hetjax/report.py) and the
loss plot (hetjax/plots.py), alone and after a real run."""

import json
import shutil
import struct

import pytest

from hetjax.report import format_summary
from tests.pipeline.report_run import STEPS, tiny_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# What MetricsWriter.finish writes (hetjax/pipeline/runtime/metrics.py).
PIPELINE_SUMMARY = {
    "model": "tiny",
    "schedule": "1f1b",
    "microbatches": 4,
    "steps": 30,
    "layers_per_stage": [2, 2],
    "islands": ["island0:cpu", "island1:cpu"],
    "devices": 2,
    "first_loss": 5.523189544677734,
    "last_loss": 3.2012345,
    "tokens_per_s": 12345.6,
    "step_time_s": 0.0125,
    "tflops_per_device": 0.0123,
}


def test_format_summary_takes_every_figure_from_the_summary(tmp_path):
    for name in ("summary.json", "metrics.jsonl", "job.json"):
        (tmp_path / name).write_text("{}")
    text = format_summary(PIPELINE_SUMMARY, tmp_path, tmp_path / "loss.png", wall_s=41.23)
    lines = text.splitlines()
    assert lines[0] == "trained tiny for 30 steps on 2 islands (cpu, cpu), 2 devices, in 41.2 s"
    assert "  layout      1f1b, 4 microbatches, layers per stage 2+2" in lines
    assert "  loss        5.5232 -> 3.2012" in lines
    (throughput,) = [line for line in lines if line.startswith("  throughput")]
    assert "12,346 tok/s" in throughput and "0.0123 TFLOP/s per device" in throughput and "12.5 ms/step" in throughput
    assert "median after the first 2 steps" in throughput
    assert f"  run folder  {tmp_path}   (summary.json, metrics.jsonl, job.json)" in lines
    assert f"  plot        {tmp_path / 'loss.png'}" in lines
    assert not any(line.lstrip().startswith("{") for line in lines)


def test_format_summary_leaves_out_what_the_summary_lacks(tmp_path):
    summary = {"model": "tiny", "steps": 3, "islands": ["gpus:cuda", "island1:rocm"], "last_loss": 4.5}
    text = format_summary(summary, tmp_path, None)
    assert text.splitlines() == [
        "trained tiny for 3 steps on 2 islands (gpus:cuda, rocm)",
        "  loss        4.5000 (last)",
        f"  run folder  {tmp_path}",
    ]
    # Nothing at all but the folder: still a headline, no made-up figures.
    bare = format_summary({}, tmp_path, None).splitlines()
    assert bare == ["trained a model", f"  run folder  {tmp_path}"]


def test_format_summary_of_a_short_data_parallel_run(tmp_path):
    summary = {
        **PIPELINE_SUMMARY,
        "schedule": "data",
        "steps": 3,
        "devices": 3,
        "layers_per_stage": [4, 4],
        "parallel": "data",
        "shares": [3, 1],
        "tokens_per_s": 57.25,
    }
    lines = format_summary(summary, tmp_path, None).splitlines()
    assert lines[0] == "trained tiny for 3 steps on 2 islands (cpu, cpu), 3 devices"
    assert "  layout      data parallel, microbatches per island 3+1" in lines
    (throughput,) = [line for line in lines if line.startswith("  throughput")]
    assert throughput.startswith("  throughput  57.2 tok/s") and throughput.endswith("(last step)")
    assert not any("plot" in line for line in lines)


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def metrics_rows(steps: int) -> list[dict]:
    return [
        {"step": k, "loss": 5.5 - 0.1 * k, "grad_norm": 1.0, "tokens_per_s": 20.0 if k == 0 else 5000.0 + k}
        for k in range(steps)
    ]


@pytest.mark.parametrize("steps", [1, 8, 300])
def test_plot_run_writes_a_png(tmp_path, steps):
    pytest.importorskip("matplotlib")
    from hetjax.plots import plot_run

    path = plot_run(metrics_rows(steps), tmp_path / "loss.png", title="tiny")
    assert path == tmp_path / "loss.png"
    width, height = png_size(path)
    assert 600 <= width <= 3000 and 300 <= height <= 1500 and width > height
    assert 5_000 < path.stat().st_size < 2_000_000


def test_plot_run_refuses_no_rows(tmp_path):
    pytest.importorskip("matplotlib")
    from hetjax.plots import plot_run

    with pytest.raises(ValueError, match="no metrics rows"):
        plot_run([], tmp_path / "loss.png")
    assert not (tmp_path / "loss.png").exists()


def test_import_hetjax_leaves_matplotlib_alone():
    import subprocess
    import sys

    code = "import sys, hetjax, hetjax.plots, hetjax.report; print('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


# ---- after a real run -----------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny `hetjax train` run of two islands with its plot, in a process of
    its own as a user starts it; the same run test_parent_without_jax.py
    reads (tests/pipeline/report_run.py)."""
    return tiny_run(tmp_path_factory)


def test_train_prints_the_summary_and_draws_the_plot(run):
    pytest.importorskip("matplotlib")
    out, stdout = run.out, run.command.stdout
    summary = json.loads((out / "summary.json").read_text())
    lines = stdout.splitlines()
    assert f"trained tiny for {STEPS} steps on 2 islands (cpu, cpu), 2 devices, in " in stdout
    assert f"  loss        {summary['first_loss']:.4f} -> {summary['last_loss']:.4f}" in lines
    assert any(
        line.startswith(f"  run folder  {out}   (summary.json, metrics.jsonl, job.json, tensorboard)") for line in lines
    )
    assert f"  plot        {out / 'loss.png'}" in lines
    png_size(out / "loss.png")
    # The summary stays a file; stdout has no raw JSON any more.
    assert not any(line.startswith("{") or line.startswith('  "') for line in lines)


def test_train_succeeds_without_its_plot(run, tmp_path, capsys, monkeypatch):
    """The end of a run whose plot fails: the runner's summing-up
    (_summarise: the plot, then the summary it prints), on a copy of the
    run's folder without its loss.png. After it the runner returns 0 with
    nothing else to do, so no second job of its own is needed for that."""
    import hetjax.plots
    from hetjax.job import runner
    from hetjax.job.spec import JobSpec
    from hetjax.pipeline.job import Job

    def no_matplotlib(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'matplotlib'")

    monkeypatch.setattr(hetjax.plots, "plot_run", no_matplotlib)
    out = shutil.copytree(run.out, tmp_path / "run", ignore=shutil.ignore_patterns("loss.png"))
    said = []
    spec = JobSpec().replace(run={"plot": True})
    runner._summarise(spec, Job.load(out / "job.json"), out, [], wall_s=1.0, say=said.append)
    stdout, stderr = "\n".join(said), capsys.readouterr().err
    assert "hetjax train: no plot (ModuleNotFoundError: No module named 'matplotlib')" in stderr
    assert "  loss        " in stdout and "  plot" not in stdout
    assert not (out / "loss.png").exists()
