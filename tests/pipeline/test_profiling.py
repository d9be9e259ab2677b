"""The profile summary's arithmetic, on a hand-made Perfetto trace."""

import gzip
import json

import pytest

from hetjax.pipeline.runtime.profiling import categorize, kernel_kind, summarize


def write_trace(folder, events):
    folder.mkdir(parents=True)
    with gzip.open(folder / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_device_time_is_sorted_into_categories_and_idle_time(tmp_path):
    meta = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/host:CPU"}},
    ]
    kernels = [
        ("sm90_xmma_gemm_bf16", 0, 40),
        ("cudnn_fmha_fwd", 30, 20),  # overlap 30..40
        ("WaitFlagKernel", 60, 10),
        ("loop_add_fusion", 90, 10),
    ]
    events = meta + [{"ph": "X", "pid": 1, "tid": 7, "ts": ts, "dur": dur, "name": name} for name, ts, dur in kernels]
    events.append({"ph": "X", "pid": 2, "tid": 1, "ts": 0, "dur": 500, "name": "python"})
    write_trace(tmp_path / "rank0", events)
    ((device, entry),) = summarize(tmp_path / "rank0").items()
    assert device == "/device:GPU:0"
    assert entry["window_us"] == 100
    assert entry["busy_us"] == 50 + 10 + 10
    assert entry["idle_fraction"] == pytest.approx(0.3)
    assert entry["categories"] == {"matmul": 40, "attention": 20, "hetjax wait/signal": 10, "other kernels": 10}


def test_categories_match_kernel_names():
    assert categorize("ncclDevKernel_AllReduce_Sum") == "nccl"
    assert categorize("MemcpyDtoH") == "copy"
    assert categorize("input_reduce_fusion") == "other kernels"


def test_missing_trace_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="perfetto_trace"):
        summarize(tmp_path)


def test_device_time_is_attributed_to_the_xla_ops_that_launched_it(tmp_path):
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}}]
    events = meta + [
        {
            "ph": "X",
            "pid": 1,
            "tid": 7,
            "ts": 0,
            "dur": 30,
            "name": "memcpy128",
            "args": {"hlo_module": "jit_backward", "hlo_op": "copy.3"},
        },
        {
            "ph": "X",
            "pid": 1,
            "tid": 7,
            "ts": 40,
            "dur": 5,
            "name": "memcpy128",
            "args": {"hlo_module": "jit_backward", "hlo_op": "copy.3"},
        },
        {
            "ph": "X",
            "pid": 1,
            "tid": 7,
            "ts": 50,
            "dur": 8,
            "name": "loop_add_fusion",
            "args": {"hlo_module": "jit_update", "hlo_op": "add.1"},
        },
        {"ph": "X", "pid": 1, "tid": 7, "ts": 60, "dur": 9, "name": "MemcpyDtoH"},  # no op
    ]
    write_trace(tmp_path / "rank0", events)
    ((_, entry),) = summarize(tmp_path / "rank0").items()
    assert entry["ops"] == {"jit_backward/copy.3 (memcpy128)": 35, "jit_update/add.1 (loop_add_fusion)": 8}
    assert list(entry["ops"]) == sorted(entry["ops"], key=lambda k: -entry["ops"][k])


def test_numbered_copies_of_a_kernel_are_summed_by_kind(tmp_path):
    # An unrolled layer loop gives each layer's fusion its own number.
    meta = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}}]
    names = [
        ("loop_dynamic_update_slice_fusion_3", 10),
        ("loop_dynamic_update_slice_fusion_17", 20),
        ("fusion.2.1", 4),
        ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", 7),
    ]
    events = meta + [
        {"ph": "X", "pid": 1, "tid": 7, "ts": 100 * i, "dur": dur, "name": name} for i, (name, dur) in enumerate(names)
    ]
    write_trace(tmp_path / "rank0", events)
    ((_, entry),) = summarize(tmp_path / "rank0").items()
    assert entry["kinds"] == {
        "loop_dynamic_update_slice_fusion": 30,
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": 7,
        "fusion": 4,
    }
    assert kernel_kind("input_add_reduce_fusion_17") == "input_add_reduce_fusion"
