"""hetjax.pipeline.Pipeline: a Flax model of the user's own (examples/own_model.py)
pipelined over two CPU islands, against the same model trained in one
process without hetjax."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "own_model.py"
FLAGS = ["--steps", "8", "--batch", "32", "--microbatches", "4"]


def run(*argv, timeout=240) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return done.stdout


def losses(path) -> np.ndarray:
    return np.array(json.loads(pathlib.Path(path).read_text())["losses"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> np.ndarray:
    out = tmp_path_factory.mktemp("reference") / "losses.json"
    run(sys.executable, str(EXAMPLE), "--reference", *FLAGS, "--out", str(out))
    return losses(out)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_own_model_on_two_islands_matches_one_process_without_hetjax(tmp_path, reference):
    out = tmp_path / "losses.json"
    printed = run(
        sys.executable,
        "-m",
        "hetjax.launch",
        "--nproc",
        "2",
        "--",
        sys.executable,
        str(EXAMPLE),
        *FLAGS,
        "--out",
        str(out),
    )
    assert "[rank1] step 7: loss" in printed  # the last stage's process reports
    assert json.loads(out.read_text())["rank"] == 1
    # Only the order of float32 sums differs (microbatches, stages): measured 1e-7.
    np.testing.assert_allclose(losses(out), reference, rtol=1e-5)


def test_both_stages_in_one_process_match_too(reference, example):
    import argparse

    args = argparse.Namespace(steps=8, batch=32, microbatches=4, lr=1e-2)
    np.testing.assert_allclose(example.train_with_hetjax(args), reference, rtol=1e-5)


def test_bad_arguments_say_what_was_expected(example):
    import optax

    import hetjax.pipeline as hp

    common = dict(loss_fn=example.loss_fn, optimizer=optax.sgd(0.1), microbatches=2)
    with pytest.raises(ValueError, match=r"stage_ranks: expected 2 ranks in 0..0 \(one per stage\), got \[0, 1\]"):
        hp.Pipeline(example.stages(), stage_ranks=[0, 1], **common)
    with pytest.raises(TypeError, match="a stage factory returned int, expected an nnx.Module"):
        hp.Pipeline([lambda: 3], **common)
    pipe = hp.Pipeline(example.stages(), **common)
    images, labels = next(example.batches(1, 6))
    with pytest.raises(ValueError, match="a batch of 6 inputs and 5 targets: expected equal counts"):
        pipe.step(images, labels[:5])
    images, labels = next(example.batches(1, 5))
    with pytest.raises(ValueError, match="a multiple of microbatches=2"):
        pipe.step(images, labels)
