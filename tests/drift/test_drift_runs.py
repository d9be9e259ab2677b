"""`hetjax drift --runs A B` on two tiny runs of one job, checkpointed after
every step, the second with one layer's parameters scaled as step
PLANTED_STEP begins: they agree bitwise before it and part at the
checkpoint after it, most at the planted layer."""

from __future__ import annotations

import json

from tests.drift.conftest import PLANTED_LAYER, PLANTED_STEP


def test_two_runs_part_at_the_checkpoint_after_the_planted_step(checkpointed_runs, tmp_path, capsys):
    from hetjax.cli import main

    out = tmp_path / "bisect"
    assert (
        main(["drift", "--runs", str(checkpointed_runs["plain"]), str(checkpointed_runs["planted"]), "--out", str(out)])
        == 0
    )
    stdout = capsys.readouterr().out
    result = json.loads((out / "runs.json").read_text())
    first = result["first_parting"]
    # A save that falls due while the previous one still writes is merged
    # into the next, so the runs hold the checkpoints they could write: the
    # parting is the first one both hold after the plant.
    steps = result["steps"]
    after = min(s for s in steps if s > PLANTED_STEP)
    before = max(s for s in steps if s <= PLANTED_STEP)
    assert (first["step"], first["part"]) == (after, f"layer{PLANTED_LAYER}"), first
    assert result["agreed_until"] == before and steps[-1] == 7
    # The same job on the same CPU: bitwise equal until the plant.
    assert all(e["distance"] == 0 for e in result["entries"] if e["step"] <= PLANTED_STEP)
    assert f"part first at the checkpoint of step {after}, after agreeing at step {before}" in stdout
    assert (out / "runs.png").stat().st_size > 0


def test_a_run_against_itself_agrees_everywhere(checkpointed_runs, tmp_path, capsys):
    from hetjax.cli import main

    plain = str(checkpointed_runs["plain"])
    assert main(["drift", "--runs", plain, plain, "--out", str(tmp_path / "same")]) == 0
    said = capsys.readouterr().out
    assert "the runs agree at every common checkpoint (" in said and "steps 1.." in said and "..7)" in said, said


def test_runs_without_checkpoints_stop_in_one_line(tmp_path, capsys):
    from hetjax.cli import main

    assert main(["drift", "--runs", str(tmp_path), str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("hetjax drift: ") and "expected a run folder of `hetjax train`" in err and err.count("\n") == 1
    )
