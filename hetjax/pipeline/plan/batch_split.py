"""How a data-parallel step's global batch is split over islands.

The global batch of B sequences is cut into M microbatches of B / M rows.
Island k runs m_k of them (sum m_k = M), so a faster island takes more;
the islands' microbatches interleave (`island_order`). The
split is in whole microbatches: every island compiles one microbatch shape,
and the losses and gradients stay exact (each device weighs its rows by
rows / B, so the sum over all devices is the mean over the unsplit batch).

Shares come from the user (``--shares 3,1``), from the islands' figures
(``auto``: effective TFLOP/s x devices, as in the cluster spec), or from a
measurement on the islands themselves (``measure``, done by the workers with
`balanced_shares` on the measured rates).
"""

from __future__ import annotations

from collections.abc import Sequence

AUTO, MEASURE = "auto", "measure"


class ShareError(ValueError):
    """Shares that cannot split the batch; raised before any process starts."""


def balanced_shares(total: int, rates: Sequence[float]) -> list[int]:
    """Microbatches per island that minimise the slowest island's time
    (m_k / rate_k), each island at least one.

    Greedy: every next microbatch goes to the island that would finish it
    first; ties go to the lower index, so every process that calls this with
    the same rates gets the same split.
    """
    n = len(rates)
    if n == 0:
        raise ShareError("no islands to split the batch over")
    if any(not r > 0 for r in rates):
        raise ShareError(f"island throughputs must be > 0, got {list(rates)}")
    if total < n:
        raise ShareError(
            f"{total} microbatches for {n} islands: every island needs at least "
            f"one; raise --microbatches to {n} or more"
        )
    shares = [1] * n
    for _ in range(total - n):
        k = min(range(n), key=lambda i: ((shares[i] + 1) / rates[i], i))
        shares[k] += 1
    return shares


def parse_shares(text: str, num_islands: int) -> list[int] | str:
    """``auto``, ``measure`` or microbatches per island (``3,1``)."""
    if text in (AUTO, MEASURE):
        return text
    try:
        shares = [int(v) for v in text.split(",")]
    except ValueError:
        raise ShareError(
            f"--shares: expected 'auto', 'measure' or microbatches per island like 3,1; got {text!r}"
        ) from None
    if len(shares) != num_islands:
        raise ShareError(f"--shares {text}: {len(shares)} values for {num_islands} islands")
    return shares


def check_split(shares: Sequence[int], islands, batch: int, microbatches: int) -> int:
    """Checks that the shares split the batch; returns the rows per microbatch."""
    if microbatches < 1 or batch % microbatches:
        raise ShareError(f"--batch {batch} must be a multiple of --microbatches {microbatches}")
    rows = batch // microbatches
    if any(m < 1 for m in shares):
        raise ShareError(f"--shares {list(shares)}: every island needs at least one microbatch")
    if sum(shares) != microbatches:
        raise ShareError(
            f"--shares {list(shares)} sum to {sum(shares)}, expected --microbatches "
            f"{microbatches} (microbatches of {rows} rows per island)"
        )
    for isl in islands:
        if rows % isl.total_devices:
            raise ShareError(
                f"a microbatch of {rows} rows does not split over island {isl.name}'s "
                f"{isl.total_devices} devices; make --batch / --microbatches a "
                f"multiple of {isl.total_devices}"
            )
    return rows


def resolve_shares(text: str, islands, batch: int, microbatches: int) -> list[int] | None:
    """The split a job runs with: a list, or None when the workers measure it."""
    shares = parse_shares(text, len(islands))
    if shares == MEASURE:
        # Any split the measurement may choose must be valid: check one.
        check_split(balanced_shares(microbatches, [1.0] * len(islands)), islands, batch, microbatches)
        return None
    if shares == AUTO:
        shares = balanced_shares(microbatches, [i.effective_tflops * i.total_devices for i in islands])
    check_split(shares, islands, batch, microbatches)
    return shares


def island_order(shares: Sequence[int]) -> list[list[int]]:
    """Each island's microbatches (indices into the step's M), interleaved:
    island k's j-th microbatch sits at (j + 1/2) / m_k of the step, ties to
    the lower island. With equal shares island k takes k, k + n, k + 2n, ...,
    so n one-device islands give every device the rows that one island of n
    devices gives it (that island splits each n-row microbatch over its
    devices in order): the two jobs then differ only in how the n devices'
    sums are added, and two of them add alike (a + b == b + a)."""
    slots = sorted((((j + 0.5) / m, k) for k, m in enumerate(shares) for j in range(m)))
    out: list[list[int]] = [[] for _ in shares]
    for position, (_, k) in enumerate(slots):
        out[k].append(position)
    return out
