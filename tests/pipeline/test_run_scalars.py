"""The scalars a run logs beside the loss: MFU where the devices' peak is
known, the bridge's traffic per step from every process's counters, and the
same scalars in W&B with --wandb (a stand-in wandb package records the
calls; the real service is never reached)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetjax import cli
from hetjax.job import bridge_traffic
from hetjax.job.mfu import card_peak_tflops, peak_tflops_per_device
from hetjax.job.scalar_log import BRIDGE_MESSAGES_SENT, BRIDGE_MIB_SENT, MFU, ScalarLog
from tests.train_flags import job_from_flags

FAKE_WANDB = Path(__file__).parent / "fake_wandb"


class Recorder:
    """A writer that keeps {tag: {step: value}}."""

    def __init__(self):
        self.scalars: dict[str, dict[int, float]] = {}
        self.closed = False

    def add_scalar(self, tag, value, step):
        self.scalars.setdefault(tag, {})[step] = value

    def close(self):
        self.closed = True


def row(step: int, tflops: float) -> dict:
    return {
        "step": step,
        "loss": 1.0,
        "grad_norm": 0.5,
        "tokens_per_s": 1e3,
        "step_time_s": 0.1,
        "tflops_per_device": tflops,
    }


def write_rows(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def test_peaks_by_card_and_dtype():
    assert card_peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4
    assert card_peak_tflops("NVIDIA H100 PCIe", "bfloat16") == 756.0
    assert card_peak_tflops("NVIDIA H200", "float32") == 494.7
    assert card_peak_tflops("Tesla T4", "bfloat16") is None


def test_mfu_against_the_cards_peak_and_none_on_cpu(tmp_path):
    gpu, _, _ = job_from_flags("tiny", "--islands", "cuda:0,cuda:1", "--dtype", "bfloat16", "--out", str(tmp_path))
    assert peak_tflops_per_device(gpu, card_of=lambda ids: ("NVIDIA H100 80GB HBM3", 80.0)) == 989.4
    assert peak_tflops_per_device(gpu, card_of=lambda ids: None) is None  # a card nvidia-smi does not name
    cpu, _, _ = job_from_flags("tiny", "--out", str(tmp_path))
    assert peak_tflops_per_device(cpu) is None
    writer = Recorder()
    log = ScalarLog(gpu, [writer], peak_tflops=989.4)
    write_rows(tmp_path / "metrics.jsonl", [row(0, 197.88), row(1, 494.7)])
    log.close([])
    assert writer.scalars[MFU] == pytest.approx({0: 0.2, 1: 0.5}) and writer.closed


def test_bridge_traffic_per_step_once_every_process_reported(tmp_path):
    job, _, _ = job_from_flags("tiny", "--out", str(tmp_path))  # two islands: ranks 0 and 1
    writer = Recorder()
    log = ScalarLog(job, [writer])
    counts = {"bytes_sent": 2**20, "bytes_received": 0, "messages_sent": 3, "messages_received": 0}
    write_rows(bridge_traffic.rows_path(tmp_path, 0), [{"step": s, **counts} for s in range(3)])
    write_rows(bridge_traffic.rows_path(tmp_path, 1), [{"step": 0, **counts}])
    log.add_new_rows()
    assert writer.scalars[BRIDGE_MIB_SENT] == {0: 2.0} and writer.scalars[BRIDGE_MESSAGES_SENT] == {0: 6.0}
    write_rows(bridge_traffic.rows_path(tmp_path, 1), [{"step": s, **counts} for s in (1, 2)])
    log.close([])
    assert writer.scalars[BRIDGE_MIB_SENT] == {0: 2.0, 1: 2.0, 2: 2.0}


SCALARS_TO_WANDB = """
import json, sys
from hetjax.job.runner import _scalar_log
from tests.train_flags import job_from_flags, spec_from_flags
out = sys.argv[1]
flags = ("tiny", "--steps", "3", "--out", out, "--wandb", "hetjax-tests", "--no-tensorboard")
job, _, _ = job_from_flags(*flags)
log = _scalar_log(spec_from_flags(*flags), job)
with open(out + "/metrics.jsonl", "w") as f:
    for s in range(3):
        f.write(json.dumps({"step": s, "loss": 5.0 - s, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 10.0,
                            "step_time_s": 0.1, "tflops_per_device": 0.01}) + "\\n")
log.close(["island0", "island1"])
"""


def test_wandb_gets_the_same_scalars_in_one_run_per_folder(tmp_path):
    calls_file = tmp_path / "calls.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAKE_WANDB), os.environ.get("PYTHONPATH", "")]),
        "FAKE_WANDB_CALLS": str(calls_file),
    }
    out = tmp_path / "run"
    out.mkdir()
    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, "-c", SCALARS_TO_WANDB, str(out)],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    calls = json.loads(calls_file.read_text())
    (init,) = [args for name, args in calls if name == "init"]
    assert init["project"] == "hetjax-tests" and init["resume"] == "allow" and init["name"] == "run"
    assert init["id"] == (out / "wandb-run-id").read_text() and "model" in init["config_keys"]
    logged = [args["data"] for name, args in calls if name == "log"]
    assert [d["step"] for d in logged] == [0, 1, 2]
    assert [d["train/loss"] for d in logged] == [5.0, 4.0, 3.0] and all("train/learning_rate" in d for d in logged)
    assert calls[-1][0] == "finish"


def test_wandb_not_installed_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    assert cli.main(["train", "--wandb", "proj", "--out", str(tmp_path / "r"), "--no-progress"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("hetjax train: --wandb proj: the wandb package is not importable"), line
    assert not (tmp_path / "r").exists()
