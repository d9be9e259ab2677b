"""hetjax.pipeline.Pipeline: a Flax model of the user's own (examples/own_model.py)
pipelined over two CPU islands, against the same model trained in one
process without hetjax."""

import argparse
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


SPLITS = {"modules": [], "markers": ["--markers"]}
TIMEOUT_S = 240


def losses(path) -> np.ndarray:
    return np.array(json.loads(pathlib.Path(path).read_text())["losses"])


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("own_model", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict[str, tuple[pathlib.Path, subprocess.Popen]]:
    """Both two-island launches of the example, side by side (they compile
    mostly one process at a time): split -> (losses file, process)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    started = {}
    for split, flags in SPLITS.items():
        out = tmp_path_factory.mktemp(split) / "losses.json"
        launch = [sys.executable, "-m", "hetjax.launch", "--nproc", "2", "--preload", "jax,flax.nnx,optax", "--"]
        launch += [sys.executable, str(EXAMPLE)]
        cmd = [*launch, *FLAGS, *flags, "--out", str(out)]
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started[split] = (out, proc)
    yield started
    for _, proc in started.values():
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def reference(launches, example) -> np.ndarray:
    """The example's plain loop (its --reference) in this process, while the launches run."""
    args = argparse.Namespace(steps=8, batch=32, microbatches=4, lr=1e-2, markers=False)
    return np.array(example.train_reference(args))


@pytest.mark.parametrize("split", SPLITS)
def test_own_model_on_two_islands_matches_one_process_without_hetjax(launches, reference, split):
    out, proc = launches[split]
    printed, _ = proc.communicate(timeout=TIMEOUT_S)
    assert proc.returncode == 0, printed[-4000:]
    assert "[rank1] step 7: loss" in printed  # the last stage's process reports
    assert json.loads(out.read_text())["rank"] == 1
    # Only the order of float32 sums differs (microbatches, stages): measured 1e-7.
    np.testing.assert_allclose(losses(out), reference, rtol=1e-5)


def test_both_stages_in_one_process_match_too_and_markers_exactly(reference, example):
    args = argparse.Namespace(steps=8, batch=32, microbatches=4, lr=1e-2, markers=False)
    modules = example.train_with_hetjax(args)
    np.testing.assert_allclose(modules, reference, rtol=1e-5)
    # The cut model replays the very operations of the stage modules.
    assert example.train_with_hetjax(argparse.Namespace(**{**vars(args), "markers": True})) == modules


def test_split_stages_refuses_forwards_it_cannot_cut():
    import jax.numpy as jnp
    from flax import nnx

    import hetjax.pipeline as hp

    class Skip(nnx.Module):  # the input jumps over the boundary
        def __init__(self, marked=True):
            self.a, self.b = nnx.Linear(4, 4, rngs=nnx.Rngs(0)), nnx.Linear(4, 4, rngs=nnx.Rngs(1))
            self.marked = marked

        def __call__(self, x):
            h = self.a(x)
            return self.b(hp.stage_boundary(h) if self.marked else h) + x

    class Shared(nnx.Module):  # one layer on both sides
        def __init__(self):
            self.a = nnx.Linear(4, 4, rngs=nnx.Rngs(0))

        def __call__(self, x):
            return self.a(hp.stage_boundary(self.a(x)))

    x = jnp.ones((2, 4))
    with pytest.raises(hp.SplitError, match=r"stage 1 reads a float32\[2,4\] value computed in the model.s input"):
        hp.split_stages(Skip(), x)
    with pytest.raises(hp.SplitError, match="no stage_boundary at the top level"):
        hp.split_stages(Skip(marked=False), x)
    with pytest.raises(hp.SplitError, match="parameter a/kernel is read by stages 0 and 1"):
        hp.split_stages(Shared(), x)


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


def test_save_and_restore_continue_bitwise(tmp_path, example):
    import hetjax.pipeline as hp

    def pipeline():
        return hp.Pipeline(example.stages(), loss_fn=example.loss_fn, optimizer=example.optimizer(1e-2), microbatches=2)

    data = list(example.batches(4, 8))
    with pipeline() as first:
        whole = []
        for step, (images, labels) in enumerate(data):
            whole.append(first.step(images, labels).loss)
            if step == 1:
                folder = first.save(tmp_path / "ckpt", step + 1)
    assert sorted(p.name for p in folder.iterdir()) == [
        "manifest.json",
        "stage0",
        "stage0.json",
        "stage1",
        "stage1.json",
    ]
    with pipeline() as second:
        assert second.restore(tmp_path / "ckpt") == 2
        assert [second.step(images, labels).loss for images, labels in data[2:]] == whole[2:]
