"""What one `hetjax drift` comparison runs: written to <out>/drift_job.json
by the parent and read by every process it starts, so the reference and
the islands compute on exactly the same settings."""

from __future__ import annotations

import dataclasses
import json
import pathlib

JOB_FILE = "drift_job.json"
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass
class DriftSpec:
    model: str = "tiny"
    islands: str = "cpu,cpu"  # the --islands syntax (hetjax/cluster.py)
    # island index -> {variable: value}: each island's own settings (variants.py).
    variants: dict[int, dict[str, str]] = dataclasses.field(default_factory=dict)
    dtype: str = "float32"  # compute dtype of the islands; parameters stay float32
    num_layers: int | None = None  # fewer layers than the preset has, for a quick look
    seed: int = 0
    batch: int = 2
    seq_len: int = 32
    lr: float = 1e-3  # AdamW's step size for the one update compared
    factor: float = 10.0  # flag when an error exceeds factor x the dtype's noise (compare.py)
    out: str = "runs/drift"
    # A `hetjax train` run folder: its newest complete checkpoint's weights
    # and its own data at that step, instead of the seeded ones.
    checkpoint: str | None = None

    def validate(self) -> None:
        if self.dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype: expected one of {COMPUTE_DTYPES}, got {self.dtype!r}")
        for name in ("batch", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive integer, got {getattr(self, name)}")
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"layers: expected a positive integer, got {self.num_layers}")
        if self.checkpoint and self.num_layers is not None:
            raise ValueError(f"layers: expected none with a checkpoint (its model is the run's), got {self.num_layers}")
        if not self.factor > 1:
            raise ValueError(f"factor: expected a number above 1, got {self.factor:g}")

    def model_overrides(self) -> dict | None:
        return {"num_layers": self.num_layers} if self.num_layers is not None else None

    def save(self, folder: pathlib.Path) -> pathlib.Path:
        path = folder / JOB_FILE
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))
        return path

    @classmethod
    def load(cls, path: pathlib.Path) -> DriftSpec:
        raw = json.loads(pathlib.Path(path).read_text())
        raw["variants"] = {int(k): v for k, v in raw.get("variants", {}).items()}
        return cls(**raw)
