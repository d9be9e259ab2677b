"""`--variant [I:]VARIABLE=VALUE`: environment of one island, so that two
islands of one platform can differ in one setting (XLA flags, jax's
matmul precision, a planted fault).

With an island index the variable is that island's; without one it is
every island's but the first, which stays the baseline. XLA_FLAGS is
added to the flags the island already has (a CPU island's device count),
any other variable replaces the island's value.
"""

from __future__ import annotations

import re

_VARIANT = re.compile(r"^(?:(?P<island>\d+):)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$", re.S)


def parse_variants(texts: list[str], islands: int) -> dict[int, dict[str, str]]:
    """{island index: {variable: value}} of the --variant values; ValueError
    naming the expected form or index range for a bad one."""
    out: dict[int, dict[str, str]] = {}
    for text in texts:
        m = _VARIANT.match(text)
        if not m:
            raise ValueError(f"--variant: expected [ISLAND:]VARIABLE=VALUE, got {text!r}")
        if m["island"] is None:
            targets = range(1, islands)
        else:
            index = int(m["island"])
            if index >= islands:
                raise ValueError(f"--variant {text!r}: expected an island index in 0..{islands - 1}, got {index}")
            targets = range(index, index + 1)
        for i in targets:
            out.setdefault(i, {})[m["name"]] = m["value"]
    return out


def with_variant(env: dict[str, str], variant: dict[str, str]) -> dict[str, str]:
    """An island process's environment with its variant applied."""
    merged = dict(env)
    for name, value in variant.items():
        if name == "XLA_FLAGS" and merged.get(name):
            merged[name] = f"{merged[name]} {value}"
        else:
            merged[name] = value
    return merged


def describe(variant: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(variant.items()))
