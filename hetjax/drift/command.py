"""`hetjax drift`: run one model, one set of weights and one batch on
several islands and show, layer by layer, where their numerics part from a
float64 CPU reference beyond the rounding of their dtype (docs/drift.md)."""

from __future__ import annotations

import pathlib
import sys

from hetjax.drift.spec import COMPUTE_DTYPES, DriftSpec
from hetjax.flags import DefaultsHelpFormatter, int_at_least


def add_arguments(p) -> None:
    p.formatter_class = DefaultsHelpFormatter
    defaults = DriftSpec()
    p.add_argument(
        "model", nargs="?", default=None, help=f"a preset of the model zoo (default: {defaults.model}, or the run's)"
    )
    p.add_argument(
        "--islands", default=defaults.islands, help="the islands to compare, one process each (hetjax train's syntax)"
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="[I:]VAR=VALUE",
        help="environment of island I (without I: of every island but the first), e.g. 1:XLA_FLAGS=...; repeatable",
    )
    p.add_argument("--dtype", choices=COMPUTE_DTYPES, default=defaults.dtype, help="the islands' compute dtype")
    p.add_argument(
        "--layers", type=int_at_least(1), default=None, help="keep the first N layers of the model (default: all)"
    )
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the weights and the batch")
    p.add_argument("--batch", type=int_at_least(1), default=defaults.batch)
    p.add_argument("--seq-len", type=int_at_least(1), default=defaults.seq_len)
    p.add_argument("--lr", type=float, default=defaults.lr, help="AdamW's learning rate for the update compared")
    p.add_argument(
        "--factor", type=float, default=defaults.factor, help="flag an error above this many times the noise"
    )
    p.add_argument(
        "--out", default=None, help="folder of drift.json and drift.png (default runs/drift-<model>-<timestamp>)"
    )
    p.add_argument(
        "--checkpoint",
        metavar="RUN_DIR",
        default=None,
        help="start from the newest complete checkpoint of this `hetjax train` run, on its own data",
    )
    p.add_argument(
        "--runs",
        nargs=2,
        metavar=("A", "B"),
        default=None,
        help="instead: the first checkpointed step where two runs' parameters part beyond rounding",
    )
    p.add_argument("--timeout", type=float, default=None, help="seconds before every process is stopped")


def run(args) -> int:
    import time

    from hetjax.cluster import ClusterSpecError
    from hetjax.drift.run import DriftError, check_islands, run_drift
    from hetjax.drift.variants import parse_variants

    if args.runs:
        return _run_bisect(args)
    try:
        model = _model_name(args)
    except ValueError as e:
        print(f"hetjax drift: {e}", file=sys.stderr)
        return 2
    out = args.out or f"runs/drift-{model}-{time.strftime('%Y%m%d-%H%M%S')}"
    spec = DriftSpec(
        model=model,
        checkpoint=str(pathlib.Path(args.checkpoint).absolute()) if args.checkpoint else None,
        islands=args.islands,
        dtype=args.dtype,
        num_layers=args.layers,
        seed=args.seed,
        batch=args.batch,
        seq_len=args.seq_len,
        lr=args.lr,
        factor=args.factor,
        out=out,
    )
    try:
        spec.validate()
        spec.variants = parse_variants(args.variant, len(check_islands(spec)))
        run_drift(spec, timeout_s=args.timeout)
    except (ValueError, ClusterSpecError, DriftError) as e:
        print(f"hetjax drift: {e}", file=sys.stderr)
        return 2 if not isinstance(e, DriftError) else 1
    return 0


def _model_name(args) -> str:
    """The model named, else the run's with --checkpoint, else the default."""
    if args.model or not args.checkpoint:
        return args.model or DriftSpec().model
    from hetjax.drift.checkpoint import run_job

    return run_job(args.checkpoint).model


def _run_bisect(args) -> int:
    from hetjax.drift.runs_command import run_bisect

    try:
        if args.model or args.checkpoint:
            raise ValueError(
                f"--runs: expected no model or --checkpoint (the runs name theirs), got {args.model or args.checkpoint!r}"
            )
        run_bisect(*args.runs, args.factor, args.out)
    except ValueError as e:  # CheckpointError included
        print(f"hetjax drift: {e}", file=sys.stderr)
        return 2
    return 0
