"""One process of `hetjax drift`: `python -m hetjax.drift.worker JOB_FILE ROLE`.

reference: with jax_enable_x64 on the CPU, initialises the weights and draws
    the batch (inputs.npz), runs the chain in float64 (reference.npz, the
    yardstick) and in the islands' compute dtype (noise-<dtype>.npz: what
    rounding to that dtype alone costs, on the CPU).
island: loads inputs.npz and runs the chain on its own platform in the
    compute dtype, with its planted faults (faults.py), into
    island-<name>.npz and island-<name>.json (platform, device, settings).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

WORKER_MODULE = "hetjax.drift.worker"
REFERENCE, ISLAND = "reference", "island"
REFERENCE_FILE = "reference.npz"
# What every drift worker imports, for a local launch's fork server
# (hetjax/forkserver.py) to import once. Nothing here may start a thread.
PRELOAD = (
    "jax",
    "jax.numpy",
    "flax.nnx",
    "optax",
    "hetjax.drift.chain",
    "hetjax.drift.checkpoint",
    "hetjax.drift.faults",
    "hetjax.drift.spec",
    "hetjax.drift.weights",
    "hetjax.pipeline.runtime.dtypes",
    "hetjax.zoo",
)


def worker_command(job_file: pathlib.Path, role: str) -> list[str]:
    return [sys.executable, "-m", WORKER_MODULE, str(job_file), role]


def noise_file(dtype: str) -> str:
    return f"noise-{dtype}.npz"


def island_files(name: str) -> tuple[str, str]:
    return f"island-{name}.npz", f"island-{name}.json"


def _run_reference(spec, folder: pathlib.Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from hetjax.drift.chain import run_chain
    from hetjax.drift.weights import save_inputs
    from hetjax.pipeline.runtime.dtypes import DTYPES

    model = _model(spec)
    params, tokens = _weights_and_batch(spec, model)
    save_inputs(folder, params, tokens)
    # The dtype's run first, before x64 is on: it is then the very program a
    # CPU island runs (x64 changes the types of some of optax's scalars).
    noise = run_chain(model, params, tokens, compute_dtype=DTYPES[spec.dtype], lr=spec.lr)
    _save(folder / noise_file(spec.dtype), noise)
    jax.config.update("jax_enable_x64", True)
    wide = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    # The textbook attention: XLA's fused one computes its softmax in float32 whatever the inputs.
    reference = run_chain(model, wide, tokens, compute_dtype=jnp.float64, lr=spec.lr, attention="reference")
    _save(folder / REFERENCE_FILE, reference)


def _run_island(spec, folder: pathlib.Path) -> None:
    import jax

    from hetjax.drift.chain import run_chain
    from hetjax.drift.faults import planted_faults
    from hetjax.drift.weights import load_inputs
    from hetjax.pipeline.checkpoint.faults import DRIFT_VARIABLE as VARIABLE
    from hetjax.pipeline.runtime.dtypes import DTYPES

    name = os.environ.get("HETJAX_ISLAND", "island")
    params, tokens = load_inputs(folder)
    faults = planted_faults(step=_step_compared(spec))
    results = run_chain(_model(spec), params, tokens, compute_dtype=DTYPES[spec.dtype], lr=spec.lr, faults=faults)
    arrays, about = island_files(name)
    _save(folder / arrays, results)
    device = jax.devices()[0]
    settings = {k: os.environ[k] for k in ("XLA_FLAGS", "JAX_DEFAULT_MATMUL_PRECISION", VARIABLE) if os.environ.get(k)}
    info = {"island": name, "platform": device.platform, "device": device.device_kind, "jax": jax.__version__}
    (folder / about).write_text(json.dumps({**info, "settings": settings}, indent=2))


def _model(spec):
    from hetjax.zoo import zoo_model

    if spec.checkpoint:
        from hetjax.drift.checkpoint import run_model

        return run_model(spec.checkpoint)
    return zoo_model(spec.model, spec.model_overrides())


def _step_compared(spec) -> int:
    """The training step whose computation is compared: the checkpoint's next, else the first."""
    if not spec.checkpoint:
        return 0
    from hetjax.drift.checkpoint import latest_checkpoint

    return latest_checkpoint(spec.checkpoint)[1].step


def _weights_and_batch(spec, model):
    """(params, tokens): the seeded ones, or the checkpoint's and the run's
    own batch of the step after it."""
    from hetjax.drift import checkpoint
    from hetjax.drift.weights import batch_tokens, seeded_params

    if not spec.checkpoint:
        return seeded_params(model, spec.seed), batch_tokens(model, spec.seed, spec.batch, spec.seq_len)
    folder, saved = checkpoint.latest_checkpoint(spec.checkpoint)
    print(f"reference: weights of {folder} (after step {saved.step})", flush=True)
    tokens = checkpoint.run_tokens(
        checkpoint.run_job(spec.checkpoint), model.config.vocab_size, saved.step, spec.batch, spec.seq_len
    )
    return checkpoint.whole_model_params(model, folder), tokens


def _save(path: pathlib.Path, results: dict) -> None:
    import numpy as np

    # float32 or float64 on disk: numpy has no bfloat16 of its own, and a
    # bfloat16 value is exact in float32.
    wide = {k: np.asarray(v, np.float64 if v.dtype == np.float64 else np.float32) for k, v in results.items()}
    np.savez(path, **wide)


def main(argv: list[str] | None = None) -> int:
    from hetjax.drift.spec import DriftSpec

    job_file, role = (sys.argv[1:] if argv is None else argv)[:2]
    spec = DriftSpec.load(pathlib.Path(job_file))
    folder = pathlib.Path(job_file).parent
    started = time.perf_counter()
    if role == REFERENCE:
        _run_reference(spec, folder)
    elif role == ISLAND:
        _run_island(spec, folder)
    else:
        raise SystemExit(f"{WORKER_MODULE}: role: expected {REFERENCE!r} or {ISLAND!r}, got {role!r}")
    print(f"{role} done in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
