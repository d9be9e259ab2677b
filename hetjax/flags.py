"""Command-line values checked where they are parsed.

Every bad value stops the command in the parent with one line on stderr and
exit status 2, before any process starts: argparse's own errors (a choice, a
type) and the ranges below alike.
"""

from __future__ import annotations

import argparse
import math
import sys
import weakref
from collections.abc import Callable
from typing import NoReturn

_FLAG_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def flag_group(parser: argparse.ArgumentParser, title: str):
    """The argument group `title` of `parser`, made on first use, so that
    flags added in several places share a group in --help."""
    groups = _FLAG_GROUPS.setdefault(parser, {})
    if title not in groups:
        groups[title] = parser.add_argument_group(title)
    return groups[title]


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help with each flag's default: appended as "(default: X)" unless the
    help says it already; a switch's is "off"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text.lower() or action.default is argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        default = getattr(action.default, "value", action.default)  # a default marked by config_flags.Unset
        if action.nargs == 0 and action.const is True and default is False:  # a store_true switch
            return f"{text} (default: off)"
        if default is None:
            return text
        return f"{text} (default: %(default)s)"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (`prog: message`), not usage plus message."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def positive_floats(text: str) -> list[float]:
    """An argparse type: comma-separated numbers > 0 (one per island)."""
    try:
        return [positive_float(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} in {text!r} (comma-separated, one per island)") from None


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers >= 1 (one, or one per island)."""
    as_int = int_at_least(1)
    try:
        return [as_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} in {text!r} (comma-separated, one per island)") from None


def int_at_least_or_auto(low: int) -> Callable[[str], int | str]:
    """An argparse type: an integer >= low, or 'auto' (the command picks)."""
    as_int = int_at_least(low)

    def parse(text: str) -> int | str:
        if text == "auto":
            return "auto"
        try:
            int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low} or 'auto', got {text!r}") from None
        return as_int(text)

    parse.__name__ = f"integer >= {low} or 'auto'"
    return parse
