"""stage-memory-<rank>.json: every worker's stages with the planner's
predicted bytes and XLA's figures for each program that ran, read from a
run the suite launches anyway (tests.train_runs.SharedRuns)."""

import json

import pytest

from hetjax.job.stage_memory import GIB
from hetjax.pipeline.job import Job
from hetjax.pipeline.runtime.program_memory import FIELDS
from tests.pipeline.test_train_islands import TWO_ISLANDS

pytest.importorskip("hetjax._native", reason="the bridge's native module is not built")


@pytest.mark.slow  # a training job of two processes (shared with the slow tier)
def test_each_worker_records_xla_figures_of_its_stage_programs_beside_the_prediction(shared_runs):
    run, _ = shared_runs.finish(*TWO_ISLANDS)
    plan = Job.load(run / "job.json").the_plan()
    records = [json.loads((run / f"stage-memory-{rank}.json").read_text()) for rank in (0, 1)]
    assert [list(r["stages"]) for r in records] == [["0"], ["1"]]
    for record, stage in zip(records, plan.stages):
        got = record["stages"][str(stage.index)]
        assert got["predicted_bytes"] == int(stage.memory_gb * GIB) and got["peak_bytes_in_use"] is None  # CPU
        assert record["predicted_island_bytes"] == got["predicted_bytes"]  # one stage per island
        programs = got["programs"]
        last = "loss_backward" if stage.has_head else "backward"
        assert "forward" in programs or stage.has_head
        assert "update" in programs and any(name.startswith(last) for name in programs), programs
        for name, figures in programs.items():
            assert set(figures) == set(FIELDS), name
            assert figures["temp_bytes"] >= 0 and figures["argument_bytes"] > 0, (name, figures)
            assert figures["alias_bytes"] <= min(figures["argument_bytes"], figures["output_bytes"]), (name, figures)
        # fp32: the update reads the parameters, both Adam moments and the
        # gradient accumulators (16 bytes a parameter), the forward at
        # least the parameters' compute copy.
        params = stage.params * 4
        assert programs["update"]["argument_bytes"] >= 4 * params
        assert programs["update"]["alias_bytes"] >= params  # the parameters are updated in place
        if "forward" in programs:
            assert programs["forward"]["argument_bytes"] > params
