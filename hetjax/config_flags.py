"""`hetjax train --config run.yaml [flags]`: a configuration file
(hetjax/job/config_file.py) with every flag given on the command line
laid over it, and `--print-config`, which writes the result.

A flag overrides the file only when it is given: each default is marked
(`Unset`) when the parser is built, and which JobSpec fields a flag sets is
read off `spec_of` itself, so every flag, present and future, overrides the
field it fills without a table to keep in step.
"""

from __future__ import annotations

import argparse
import dataclasses

from hetjax.flags import flag_group
from hetjax.job.config_file import load_config
from hetjax.job.spec import JobSpec
from hetjax.job_flags import spec_of

_CONFIG_DESTS = ("config", "print_config")


class Unset:
    """A flag's default, marked so that a flag left out can be told from one
    given with the same value; prints as the value (in --help)."""

    def __init__(self, value):
        self.value = value

    def __str__(self) -> str:
        return str(self.value)

    def __repr__(self) -> str:
        return repr(self.value)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    group = flag_group(p, "configuration file")
    group.add_argument(
        "--config",
        metavar="FILE",
        default=None,
        help="a run's configuration in YAML or TOML (the form --print-config writes; job.json keeps it under "
        "'spec'); flags given with it override its fields (default: none)",
    )
    group.add_argument(
        "--print-config",
        action="store_true",
        help="write the run's configuration (--config and the flags) as YAML and exit",
    )


def mark_defaults(p: argparse.ArgumentParser) -> None:
    """Wraps every default of `p` (added so far) in Unset. Call it last."""
    defaults = vars(p.parse_args([]))
    p.set_defaults(**{dest: Unset(v) for dest, v in defaults.items() if not dest.startswith("_")})


def unmarked(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed values with the defaults' Unset marks taken off."""
    return argparse.Namespace(**{d: v.value if isinstance(v, Unset) else v for d, v in vars(args).items()})


def spec_of_command_line(args: argparse.Namespace) -> JobSpec:
    """The JobSpec of the parsed command line: the flags' (spec_of), or with
    --config the file's with each flag that was given laid over it.
    JobError (one line) for a configuration file that is wrong."""
    plain = unmarked(args)
    flags = spec_of(plain)
    if not plain.config:
        return flags
    given = [d for d, v in vars(args).items() if not isinstance(v, Unset) and d not in _CONFIG_DESTS]
    spec = load_config(plain.config)
    changes: dict[str, dict] = {}
    for dest in given:
        for section, field in _fields_set_by(dest, plain):
            if field is None:
                changes[section] = getattr(flags, section)
            else:
                changes.setdefault(section, {})[field] = getattr(getattr(flags, section), field)
    return spec.replace(**changes)


def _fields_set_by(dest: str, plain: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(section, field) of each JobSpec field the flag `dest` fills (field
    None for a top-level one): the fields that hold a probe value put in its
    place, else (a flag spec_of transforms, --no-progress) those that change
    with it."""
    probe = object()
    found = [path for path, value in _fields(spec_of(_with(plain, dest, probe))) if value is probe]
    if found:
        return found
    current = getattr(plain, dest)
    other = (not current) if isinstance(current, bool) else None
    before, after = dict(_fields(spec_of(plain))), dict(_fields(spec_of(_with(plain, dest, other))))
    return [path for path in before if before[path] != after[path]]


def _with(ns: argparse.Namespace, dest: str, value) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(ns), dest: value})


def _fields(spec: JobSpec):
    """((section, field), value) of every field; field None for a top-level one."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if dataclasses.is_dataclass(value):
            for inner in dataclasses.fields(value):
                yield (f.name, inner.name), getattr(value, inner.name)
        else:
            yield (f.name, None), value
