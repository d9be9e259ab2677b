"""A stop asked for after every worker passed its last step boundary (a
Ctrl-C, or a scheduler's warning, in the last moment of a run): the run is
complete, and `hetjax train` says so, prints its summary and exits 0."""

import json

import hetjax.launch
from hetjax import cli
from hetjax.job.step_stop import StepStop


def test_a_stop_asked_after_the_last_step_ends_as_a_finished_run(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"

    def finished_then_warned(specs, output, **kwargs):
        # What the workers leave when they finish (the last stage's rows and
        # summary), then a scheduler's warning reaching a worker too late.
        rows = [{"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "step_time_s": 0.01} for s in range(2)]
        (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        summary = {"first_loss": 5.0, "last_loss": 4.0, "steps": 2, "tokens_per_s": 1.0, "step_time_s": 0.01}
        (out / "summary.json").write_text(json.dumps(summary))
        attempt = json.loads((out / "job.json").read_text())["attempt"]
        StepStop(out, attempt).request("SIGUSR1")
        return [0] * len(specs)

    monkeypatch.setattr(hetjax.launch, "run_local", finished_then_warned)
    flags = ["train", "tiny", "--islands", "cpu,cpu", "--steps", "2", "--no-progress", "--no-plot"]
    assert cli.main([*flags, "--out", str(out)]) == 0
    said = capsys.readouterr()
    assert "hetjax train: SIGUSR1 came after the last step; the run had finished" in said.out, said
    assert "interrupted" not in said.out + said.err, said
    assert not list(out.glob("stop-*")), "the stop files of a finished run are removed"
