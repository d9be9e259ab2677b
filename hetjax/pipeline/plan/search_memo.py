"""The planner's figures remembered for the length of one search.

Resolving a job plans dozens of layouts (schedules, microbatch counts,
tensor-parallel degrees, stage counts), which ask for the same stage's cost
and plan many times over (`hetjax plan llama3-8b --islands
cuda:0-1,cuda:2-3`: 10,382 asks of the planner's stages). Inside
`search()` a function marked `remembered` computes each set of arguments
once; outside, it computes every time, so a figure changed between two
searches (a measured constant, a test's stand-in) is never served stale.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

_memo: dict | None = None


@contextlib.contextmanager
def search() -> Iterator[None]:
    """Remembers the marked functions' results until the outermost search ends."""
    global _memo
    outermost = _memo is None
    if outermost:
        _memo = {}
    try:
        yield
    finally:
        if outermost:
            _memo = None


def remembered(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn` (of hashable arguments, with no effects) remembered within a search."""

    @functools.wraps(fn)
    def remembering(*args, **kwargs) -> T:
        if _memo is None:
            return fn(*args, **kwargs)
        key = (fn, args, tuple(kwargs.items()))
        if key not in _memo:
            _memo[key] = fn(*args, **kwargs)
        return _memo[key]

    return remembering
