"""--optimizer, --lr-schedule, --weight-decay, --b1, --b2: from the flags
into the job, each optimizer optax's own, each schedule's shape, ZeRO-1
refusing what it cannot shard, and a few steps of training with one."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from hetjax import cli
from hetjax.job import JobError
from hetjax.pipeline.runtime.optim import lr_schedule, make_optimizer
from hetjax.pipeline.runtime.optimizer_config import LR_SCHEDULES, OPTIMIZERS, OptimizerConfig
from tests.train_flags import job_from_flags, spec_from_flags

FLAGS = ["--optimizer", "lion", "--lr-schedule", "wsd", "--weight-decay", "0.05", "--b1", "0.8", "--b2", "0.99"]


def test_the_flags_reach_the_optimizer(tmp_path):
    job, _, _ = job_from_flags("tiny", *FLAGS, "--steps", "20", "--out", str(tmp_path))
    cfg = job.optimizer_config()
    assert (cfg.name, cfg.lr_schedule, cfg.weight_decay, cfg.b1, cfg.b2, cfg.steps) == (
        "lion",
        "wsd",
        0.05,
        0.8,
        0.99,
        20,
    )
    default = job_from_flags("tiny", "--out", str(tmp_path))[0].optimizer_config()
    assert (default.name, default.lr_schedule) == ("adamw", "cosine")


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_each_optimizer_is_optaxs_own(name):
    cfg = OptimizerConfig(lr=1e-2, steps=10, warmup_steps=2, name=name, weight_decay=0.1, b1=0.9, b2=0.99)
    lr = lr_schedule(cfg)
    want = {
        "adamw": optax.adamw(lr, b1=0.9, b2=0.99, eps=cfg.eps, weight_decay=0.1),
        "lion": optax.lion(lr, b1=0.9, b2=0.99, weight_decay=0.1),
        "sgd": optax.chain(optax.add_decayed_weights(0.1), optax.sgd(lr, momentum=0.9)),
        "adafactor": optax.adafactor(lr, multiply_by_parameter_scale=False, weight_decay_rate=0.1),
    }[name]
    got = make_optimizer(cfg, mask=None)
    params = {"w": jnp.arange(12.0).reshape(3, 4) / 10, "b": jnp.ones(4)}
    grads = jax.tree.map(lambda p: jnp.sin(p) + 0.5, params)
    got_state, want_state = got.init(params), want.init(params)
    for _ in range(3):
        got_updates, got_state = got.update(grads, got_state, params)
        want_updates, want_state = want.update(grads, want_state, params)
        for key in params:
            np.testing.assert_array_equal(got_updates[key], want_updates[key])


def test_the_schedules_shapes():
    lr, steps, warmup = 1.0, 100, 10
    at = {s: lr_schedule(OptimizerConfig(lr=lr, steps=steps, warmup_steps=warmup, lr_schedule=s)) for s in LR_SCHEDULES}
    for s in LR_SCHEDULES:
        assert float(at[s](0)) == 0.0 and float(at[s](warmup)) == pytest.approx(lr), s
    assert float(at["constant"](steps)) == pytest.approx(lr)
    for s in ("cosine", "linear", "wsd"):
        assert float(at[s](steps)) == pytest.approx(0.1 * lr), s
    assert float(at["linear"](55)) == pytest.approx(0.55)  # halfway down from 1 to 0.1
    assert float(at["wsd"](80)) == pytest.approx(lr)  # stable until the last 20%
    assert float(at["wsd"](90)) == pytest.approx(0.55)


def test_zero1_refuses_an_optimizer_it_cannot_shard():
    spec = spec_from_flags("tiny", "--parallel", "data", "--zero", "1", "--optimizer", "adafactor")
    with pytest.raises(JobError, match=r"--zero 1 updates flat blocks .* --optimizer adafactor cannot"):
        spec.validate()
    spec_from_flags("tiny", "--parallel", "data", "--zero", "1", "--optimizer", "lion").validate()


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--optimizer", "adam"], "argument --optimizer: invalid choice: 'adam'"),
        (["--lr-schedule", "step"], "argument --lr-schedule: invalid choice: 'step'"),
        (["--weight-decay", "-1"], "argument --weight-decay: expected a number >= 0, got '-1'"),
        (["--b1", "1"], "argument --b1: expected a number in [0, 1), got '1'"),
        (["--b2", "x"], "argument --b2: expected a number in [0, 1), got 'x'"),
    ],
)
def test_bad_values_are_one_line(capsys, flags, line):
    with pytest.raises(SystemExit) as done:
        cli.main(["train", *flags])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and line in err, err


def test_a_few_steps_with_lion_and_wsd_lower_the_loss(tmp_path):
    from hetjax.data import make_source
    from hetjax.pipeline.job import microbatches
    from hetjax.pipeline.job_executor import build_executor
    from hetjax.zoo import model_of

    job, _, _ = job_from_flags(
        "tiny",
        *FLAGS,
        "--islands",
        "cpu",
        "--stages",
        "2",
        "--steps",
        "6",
        "--seq-len",
        "16",
        "--batch",
        "4",
        "--microbatches",
        "2",
        "--lr",
        "3e-3",
        "--out",
        str(tmp_path),
    )
    model = model_of(job)
    executor = build_executor(job, model, 0)
    source = make_source(job.data, seed=job.seed, vocab_size=model.config.vocab_size)
    inputs, targets = microbatches(source.windows(0, job.batch, job.seq_len), job.microbatches)
    losses = [executor.step(inputs, targets).loss for _ in range(6)]  # the same batch: it must fit it
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
