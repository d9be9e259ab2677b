"""YAML and TOML files the user writes (run configs, cluster files), read
with a syntax error as one line: `file:line:column: what is wrong`."""

from __future__ import annotations

import pathlib
import re

import tomllib
import yaml

SUFFIXES = (".yaml", ".yml", ".toml")


class FileSyntaxError(ValueError):
    """A YAML or TOML file that does not parse; the message is `path:line:column: problem`."""


def load_structured(path: str | pathlib.Path):
    """The data of a .yaml/.yml/.toml file; FileSyntaxError naming line and
    column where it does not parse, OSError where it cannot be read."""
    path = pathlib.Path(path)
    text = path.read_text()
    if path.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise FileSyntaxError(_toml_line(path, e)) from None
    if path.suffix in (".yaml", ".yml"):
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise FileSyntaxError(_yaml_line(path, e)) from None
    raise FileSyntaxError(f"{path}: expected a {', '.join(SUFFIXES)} file")


def _yaml_line(path: pathlib.Path, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    context = getattr(error, "context", None)
    what = f"{problem} ({context})" if context else problem
    if mark is None:
        return f"{path}: YAML syntax error: {what}"
    return f"{path}:{mark.line + 1}:{mark.column + 1}: YAML syntax error: {what}"


# Python's tomllib ends its messages with "(at line L, column C)".
_TOML_WHERE = re.compile(r"^(.*?)\s*\(at line (\d+), column (\d+)\)$")


def _toml_line(path: pathlib.Path, error: tomllib.TOMLDecodeError) -> str:
    message = str(error).splitlines()[0]
    where = _TOML_WHERE.match(message)
    if where is None:
        return f"{path}: TOML syntax error: {message}"
    return f"{path}:{where.group(2)}:{where.group(3)}: TOML syntax error: {where.group(1)}"
