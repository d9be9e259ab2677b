"""The planner's figures for --parallel data (plan/data_layout.py): what a
replica holds per device on GPU islands, by layer loop and gradient buckets."""

import pytest

from hetjax.cluster import parse_islands, with_figures
from hetjax.pipeline.plan.data_layout import BUCKETED_LAST_MICROBATCH_WORKING, replica_plan
from hetjax.pipeline.plan.planner import PlanError
from hetjax.zoo import zoo_model

CONFIG = zoo_model("llama3.2-1b").config


def gpus(spec: str, memory_gb: float = 1e6):
    islands = parse_islands(spec)
    return with_figures(islands, memory_gb=[memory_gb] * len(islands))


def replica(islands, per_island: int, **options):
    n = len(islands)
    return replica_plan(
        CONFIG, islands, [per_island] * n, 4096, 8 * per_island * n, per_island * n, "bfloat16", **options
    )


def test_a_scanned_layer_loop_holds_more_than_the_unrolled_one():
    # A scanned loop keeps every layer's residuals for its backward; the
    # unrolled one runs as one fused program (costs.fused_last_stage).
    islands = gpus("cuda:0,cuda:1")
    unrolled, scanned = (replica(islands, 1, layer_loop=loop).stages[0] for loop in ("unrolled", "scan"))
    assert scanned.memory_gb > 1.2 * unrolled.memory_gb


def test_buckets_add_half_a_microbatchs_working_memory_where_the_last_microbatch_runs_apart():
    islands = gpus("cuda:0,cuda:1")
    plain = replica(islands, 2).stages[0]
    bucketed = replica(islands, 2, bucket_mb=25.0).stages[0]
    assert bucketed.memory_gb == pytest.approx(plain.memory_gb + BUCKETED_LAST_MICROBATCH_WORKING * plain.working_gb)
    # One microbatch per island has no loop to run beside; one island has no
    # buckets (nothing crosses the bridge).
    assert replica(islands, 1, bucket_mb=25.0).stages[0].memory_gb == replica(islands, 1).stages[0].memory_gb
    one_island = gpus("cuda:0-1")
    assert replica(one_island, 2, bucket_mb=25.0).stages[0].memory_gb == replica(one_island, 2).stages[0].memory_gb


def test_a_replica_that_fits_only_without_buckets_is_refused_naming_the_flag():
    plain = replica(gpus("cuda:0,cuda:1"), 2).stages[0].memory_gb
    islands = gpus("cuda:0,cuda:1", memory_gb=plain + 1.0)
    replica(islands, 2)  # fits
    with pytest.raises(PlanError) as e:
        replica(islands, 2, bucket_mb=25.0)
    message = str(e.value)
    assert "every device of island0" in message and f"limit {plain + 1.0:.2f} GiB" in message
    assert "--grad-buckets 0" in message and "\n" not in message
