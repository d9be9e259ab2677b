"""The optimizer a job names: the choices and their settings, without jax
(the command line and the job's checks read them; hetjax/pipeline/runtime/optim.py
makes the optax schedule and transformation)."""

from __future__ import annotations

import dataclasses

OPTIMIZERS = ("adamw", "lion", "sgd", "adafactor")
LR_SCHEDULES = ("cosine", "linear", "constant", "wsd")
# Optimizers whose update of an element depends on that element's own
# gradient and state only, and so runs unchanged on ZeRO-1's flat blocks.
ELEMENTWISE_OPTIMIZERS = ("adamw", "lion", "sgd")
WSD_DECAY_FRACTION = 0.2  # warmup-stable-decay: the last 20% of the steps decay


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    lr: float = 3e-3
    steps: int = 100
    warmup_steps: int | None = None  # default: 10% of steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    b1: float = 0.9  # Adam's and Lion's first moment; SGD's momentum
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    name: str = "adamw"  # one of OPTIMIZERS
    lr_schedule: str = "cosine"  # one of LR_SCHEDULES, after the linear warmup
