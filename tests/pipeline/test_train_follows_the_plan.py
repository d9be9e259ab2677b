"""What `hetjax train` chooses by itself is what `hetjax plan` shows: the
schedule the plan recommends (unless --schedule is given), and with
--replicas the microbatches counted per replica in the plan's header and in
the summary alike. In-process; no worker starts."""

import json
import re

from hetjax import cli
from hetjax.report import format_summary


def picked_by_plan(capsys, *flags: str) -> str:
    assert cli.main(["plan", "tiny", *flags]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.endswith("<- picked")]
    return row.split()[0]


def trained_schedule(tmp_path, capsys, *flags: str) -> tuple[str, str]:
    """(schedule in job.json, stdout) of a `hetjax train` whose workers never start."""
    out = tmp_path / "run"
    assert cli.main(["train", "tiny", *flags, "--out", str(out), "--no-progress", "--no-plot"]) == 1
    return json.loads((out / "job.json").read_text())["schedule"], capsys.readouterr().out


def test_train_runs_the_schedule_plan_recommends(tmp_path, capsys, launches):
    recommended = picked_by_plan(capsys)
    schedule, out = trained_schedule(tmp_path, capsys)
    assert schedule == recommended and len(launches) == 1
    assert f"hetjax: schedule {recommended}, the planner's pick" in out
    assert f"plan for tiny: {recommended}, 4 microbatches" in out


def test_a_given_schedule_is_run_as_given(tmp_path, capsys, launches):
    other = "gpipe" if picked_by_plan(capsys) != "gpipe" else "1f1b"
    schedule, out = trained_schedule(tmp_path, capsys, "--schedule", other)
    assert schedule == other and "the planner's pick" not in out


def test_replicas_count_microbatches_per_replica_in_header_and_summary(tmp_path, capsys, launches):
    flags = ("--islands", "cpu,cpu,cpu,cpu", "--replicas", "2", "--microbatches", "4")
    _, out = trained_schedule(tmp_path, capsys, *flags)
    header = re.search(r"plan for tiny: \S+, (\d+) microbatches per replica", out)
    assert header and header[1] == "2", out
    summary = {"model": "tiny", "schedule": "1f1b", "microbatches": 4, "replicas": 2, "layers_per_stage": [2, 2]}
    layout = [line for line in format_summary(summary, tmp_path, None).splitlines() if "layout" in line]
    assert layout == ["  layout      1f1b, 2 microbatches per replica, layers per stage 2+2, x 2 pipeline replicas"]
