"""A run's configuration file: the JobSpec in YAML or TOML, in the form
`hetjax train --print-config` writes and job.json keeps under "spec"
(sections layout, schedule, gradients, optimizer, data, checkpoint, run).

    steps: 1000
    layout: {islands: "cuda:0-7,rocm:0-7", tflops: [600, 450]}
    data: {seq_len: 4096, batch: 32}

Every field is typed from the JobSpec by draccus; a field the file leaves
out keeps its default.
"""

from __future__ import annotations

import pathlib

import draccus
import yaml

from hetjax.job.spec import JobError, JobSpec
from hetjax.structured_files import FileSyntaxError, load_structured


def load_config(path: str | pathlib.Path) -> JobSpec:
    """The JobSpec of a .yaml/.yml/.toml file; JobError in one line naming
    the file (and line and column, or the field) where it is wrong."""
    path = pathlib.Path(path)
    try:
        raw = load_structured(path)
    except FileSyntaxError as e:
        raise JobError(f"--config {e}") from None
    except OSError as e:
        raise JobError(f"--config {path}: {e.strerror or e}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise JobError(f"--config {path}: expected a mapping of JobSpec fields, got {type(raw).__name__}")
    try:
        return draccus.decode(JobSpec, raw)
    except draccus.utils.DecodingError as e:
        raise JobError(f"--config {path}: {' '.join(str(e).split())}") from None


def dump_config(spec: JobSpec) -> str:
    """The spec as the YAML `load_config` reads back to an equal spec."""
    return yaml.safe_dump(spec.to_dict(), sort_keys=False)
