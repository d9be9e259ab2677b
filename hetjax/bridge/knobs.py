"""What a tuning knob is: its variable, kind of value, meaning, and whether
every rank must have the same (the fields of tuning.BridgeTuning).

A kind parses the variable's text and checks a value given in Python; both
fail with one line naming the variable, what it takes and what came.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Protocol

from hetjax.errors import ConfigError


class Kind(Protocol):
    def parse(self, text: str):
        """The value `text` (stripped, not empty) stands for; ValueError if none."""

    def holds(self, value) -> bool:
        """Whether `value` is one this kind takes."""

    def expected(self) -> str:
        """What this kind takes, e.g. 'an integer from 1 to 8'."""

    def text(self, value) -> str:
        """`value` as the variable would be set to it."""


def _bounds(low, high) -> str:
    if low is not None and high is not None:
        return f" from {low} to {high}"
    if low is not None:
        return f" >= {low}"
    if high is not None:
        return f" <= {high}"
    return ""


@dataclasses.dataclass(frozen=True)
class Integer:
    low: int | None = None
    high: int | None = None
    multiple: int = 1

    def parse(self, text: str) -> int:
        return int(text, 10)

    def holds(self, value) -> bool:
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
            and value % self.multiple == 0
        )

    def expected(self) -> str:
        multiple = f", a multiple of {self.multiple}" if self.multiple > 1 else ""
        return f"an integer{_bounds(self.low, self.high)}{multiple}"

    def text(self, value) -> str:
        return str(value)


@dataclasses.dataclass(frozen=True)
class Number:
    """A float; `above` is an exclusive lower bound."""

    above: float | None = None

    def parse(self, text: str) -> float:
        return float(text)

    def holds(self, value) -> bool:
        return (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (self.above is None or value > self.above)
        )

    def expected(self) -> str:
        return "a number" if self.above is None else f"a number > {self.above:g}"

    def text(self, value) -> str:
        return f"{value:g}"


@dataclasses.dataclass(frozen=True)
class Flag:
    """On or off, written 1 or 0."""

    def parse(self, text: str) -> bool:
        if text not in ("0", "1"):
            raise ValueError(text)
        return text == "1"

    def holds(self, value) -> bool:
        return isinstance(value, bool)

    def expected(self) -> str:
        return "0 or 1"

    def text(self, value) -> str:
        return "1" if value else "0"


@dataclasses.dataclass(frozen=True)
class Choice:
    options: tuple[str, ...]

    def parse(self, text: str) -> str:
        return text.lower()

    def holds(self, value) -> bool:
        return value in self.options

    def expected(self) -> str:
        return f"one of {', '.join(self.options)}"

    def text(self, value) -> str:
        return str(value)


@dataclasses.dataclass(frozen=True)
class Names:
    """A comma-separated list, e.g. of RDMA ports."""

    def parse(self, text: str) -> tuple[str, ...]:
        return tuple(name.strip() for name in text.split(",") if name.strip())

    def holds(self, value) -> bool:
        return isinstance(value, tuple) and all(isinstance(name, str) and name for name in value)

    def expected(self) -> str:
        return "comma-separated names"

    def text(self, value) -> str:
        return ",".join(value)


@dataclasses.dataclass(frozen=True)
class Knob:
    env: str  # the variable that sets it
    kind: Kind
    meaning: str  # one sentence for docs/environment.md
    agree: bool = False  # must be the same on every rank (checked at start-up)
    native: bool = False  # handed to the native module's start
    default_text: str | None = None  # the default in words, where the value alone does not say it

    def parse(self, text: str):
        """The value of the variable's `text`; ConfigError if it is none."""
        try:
            value = self.kind.parse(text)
        except ValueError:
            value = None
        if value is None or not self.kind.holds(value):
            raise ConfigError(f"{self.env}: expected {self.kind.expected()}, got {text!r}")
        return value

    def check(self, field: str, value) -> None:
        """ConfigError unless `value` (given in Python, as `field`) fits."""
        if not self.kind.holds(value):
            raise ConfigError(f"{self.env} ({field}): expected {self.kind.expected()}, got {value!r}")


def knob(default, env: str, kind: Kind, meaning: str, **kw):
    """A dataclass field that is a knob. A default of None means the value
    depends on the machine or the path and is chosen where it is used;
    `default_text` then says how."""
    return dataclasses.field(default=default, metadata={"knob": Knob(env, kind, meaning, **kw)})


def knob_of(field: dataclasses.Field) -> Knob:
    return field.metadata["knob"]
