"""Collectives across islands, called inside shard_map over an island's mesh
axis, like jax.lax's own (psum, all_gather, psum_scatter) but over every
device of every island of a group.

Hierarchical: inside the island XLA's collective does the heavy lifting
(psum_scatter / all_gather over the island's devices); across islands each
device exchanges only its own slots with their owners in the other islands,
so all device pairs use the wire at once. See docs/collectives.md.

Each op is one FFI custom call per device (the device's index in the island
is an operand, from lax.axis_index: every device runs the same call with the
same static attributes). Ops take and return a token: thread it through
every bridge op of a program in the same order on every island.

The targets exist for platforms cpu, CUDA and ROCM alike (register_ffi_targets
registers every platform the native module offers). On a GPU, between GPU
processes of one host with slot channels (HETJAX_GPU_PATH ipc or host), the
collective runs device to device over those channels, reduces in a device
kernel and is only enqueued on XLA's stream; anywhere else, or with
HETJAX_GPU_COLLECTIVES=staged, it stages through pinned host memory and the
host algorithms (docs/collectives.md).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from hetjax.bridge import runtime
from hetjax.bridge.ffi_call import effect_free_ffi_call, register_ffi_targets
from hetjax.bridge.ops import new_token
from hetjax.bridge.tuning import GPU_COLLECTIVES
from hetjax.collectives.group import Group

_TOKEN = jax.ShapeDtypeStruct((), jnp.uint8)
_REDUCE_OPS = {"sum": 0, "mean": 0, "max": 1, "min": 2}
_ALGORITHMS = {"ring": 0, "ordered": 1}
_HALVES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# HETJAX_GPU_COLLECTIVES: whether a group with a GPU member may run the
# channel collectives (attribute gpu_path; a CPU island in such a group runs
# them on its host device). Every rank must choose alike: start-up checks it
# (BridgeTuning), and the islands agree on the path before any data moves.
_GPU_PATHS = {path: code for code, path in enumerate(GPU_COLLECTIVES)}


def path_counts() -> dict[str, int]:
    """How many collective ops this process has run, by path: "channels"
    (the channel algorithms; on a GPU only enqueued), "staged" (a GPU's op
    through pinned host memory, its host thread blocked) and "host" (a CPU
    island's op on the host ring). Which path a group takes:
    docs/collectives.md, "Which groups take this path"."""
    # Imported when first needed, so that hetjax imports where the native
    # module was not built.
    from hetjax import _native

    return {key: int(value) for key, value in _native.collective_paths().items()}


def gpu_collectives_path() -> str:
    """channels (default): the channel collectives wherever a group has a GPU
    member and every member is a one-device process of known platform
    (slot channels, or staged bridge messages where a pair has none);
    staged: GPU handlers always stage through pinned host memory and CPU
    handlers run the host algorithms (for comparison and as a fallback).
    HETJAX_GPU_COLLECTIVES, as this rank's bridge started with it."""
    return runtime.current_tuning().gpu_collectives


def _wire(wire_dtype, dtype, op: str):
    """The dtype a sum crosses the bridge in: None keeps the value's own
    (float32 island partials for halves); a half dtype for float values
    rounds the island's partial once before it leaves, and every island
    still accumulates in float32."""
    if wire_dtype is None:
        return None
    wire_dtype = jnp.dtype(wire_dtype)
    if wire_dtype not in _HALVES:
        raise ValueError(f"wire_dtype: expected bfloat16 or float16, got {wire_dtype}")
    if op not in ("sum", "mean") or not jnp.issubdtype(dtype, jnp.floating):
        raise ValueError(f"wire_dtype {wire_dtype} rounds float sums; got op {op!r} on {jnp.dtype(dtype)}")
    return wire_dtype


def _call(target, token, device, x, result, attrs):
    register_ffi_targets()
    call = effect_free_ffi_call(target, (_TOKEN, result))
    token = new_token() if token is None else token
    token, y = call(token, device, x, **attrs)
    return y, token


def _device_index(group: Group, axis_name):
    if axis_name is None:
        if group.local_devices != 1:
            raise ValueError(
                f"island {group.island} has {group.local_devices} devices: call inside shard_map and pass its axis_name"
            )
        return jnp.zeros((), jnp.int32)
    size = lax.axis_size(axis_name)
    if size != group.local_devices:
        raise ValueError(
            f"mesh axis {axis_name!r} has {size} devices, the group says "
            f"island {group.island} has {group.local_devices}"
        )
    return lax.axis_index(axis_name).astype(jnp.int32)


def _pad_to(flat, multiple: int):
    """Pads to whole slots, at least one: XLA may drop a custom call whose
    buffers are empty on some islands and not others, so none is empty."""
    pad = max(1, -(-flat.size // multiple)) * multiple - flat.size
    return jnp.pad(flat, (0, pad)) if pad else flat


def _my_segment(full, device, parts: int):
    size = full.size // parts
    return lax.dynamic_slice(full, (device * size,), (size,))


_checked_staging: set[int] = set()  # group ids whose layout was looked at once


def staging_warning(group: Group, platform: str, path: str) -> str | None:
    """Why this group's GPU collectives will stage through host memory
    although the channels path was asked for, or None when they need not."""
    if platform == "cpu" or path != "channels" or group.num_islands < 2:
        return None
    several = group.processes_holding_several_devices()
    if not several:
        return None
    rank, devices = next(iter(several.items()))
    return (
        f"hetjax collectives: bridge rank {rank} holds {devices} of collective group {group.group_id}'s "
        f"devices, so collectives between its islands stage through pinned host memory instead of "
        f"riding the GPU slot channels, many times slower. "
        f"Give every GPU its own process, e.g. --islands cuda:0-1/2,cuda:2-3/2 (docs/collectives.md)"
    )


def _warn_if_staged(group: Group) -> None:
    if group.group_id in _checked_staging:
        return
    _checked_staging.add(group.group_id)
    message = staging_warning(group, jax.default_backend(), gpu_collectives_path())
    if message:
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def _attrs(group, tag, x):
    _warn_if_staged(group)
    return {
        **group.ffi_attrs(group.next_tag() if tag is None else tag),
        "shape": np.array(x.shape, np.int64),
        "gpu_path": np.int64(_GPU_PATHS[gpu_collectives_path()]),
    }


def all_reduce(
    x,
    axis_name=None,
    *,
    group: Group,
    op: str = "sum",
    deterministic: bool = False,
    replicated: bool = False,
    token=None,
    tag: int | None = None,
    wire_dtype=None,
):
    """Reduces x over every device of every island; returns (y, token).

    op: sum | mean | max | min. With replicated=False (the default) every
    device contributes its x, as lax.psum over the union of all islands'
    devices; mean divides by that device count. With replicated=True x is
    the same on every device of an island (e.g. gradients already summed in
    the island) and each island contributes it once; mean divides by the
    number of islands.

    float16/bfloat16 sums reduce in float32 and round once. wire_dtype
    (bfloat16 or float16, sums of floats only): the island's partial is
    rounded to it before it crosses the bridge, which then moves half the
    bytes of float32; islands still accumulate in float32, and the result
    is cast back to x's dtype. deterministic:
    islands are reduced in island order (x_0 + x_1 + ...), independent of
    timing, chunking and the layout of slots; otherwise a pipelined ring
    whose order is fixed per slot, also repeatable run to run.
    """
    parts = _all_reduce_parts(x, axis_name, group, op, deterministic, replicated, tag, wire_dtype)
    return _run(parts, token)


def _run(parts: _CallParts, token):
    y, token = _call(parts.target, token, parts.device, parts.segment, parts.result, parts.attrs)
    return parts.finish(y), token


@dataclasses.dataclass(frozen=True)
class _CallParts:
    """What crosses the bridge for one collective, and how the island turns
    the bridge's result back into the caller's value."""

    device: jax.Array  # this device's index in its island
    segment: jax.Array  # this device's slots, in the dtype they cross in
    result: jax.ShapeDtypeStruct
    attrs: dict
    finish: Callable  # the bridge's result -> the caller's value
    target: str  # the one-call FFI target; its started form adds "_start"


def _all_reduce_parts(x, axis_name, group, op, deterministic, replicated, tag, wire_dtype) -> _CallParts:
    if op not in _REDUCE_OPS:
        raise ValueError(f"op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
    x = jnp.asarray(x)
    dtype = x.dtype
    if op == "mean" and not jnp.issubdtype(dtype, jnp.inexact):
        raise TypeError(f"mean needs a float dtype, got {dtype}")
    device = _device_index(group, axis_name)
    d, slots = group.local_devices, group.slots
    attrs = _attrs(group, tag, x)
    # Island partials of half sums are exact in float32 when they cross; only
    # single-device islands send their raw halves. Same rule on every island.
    summing = op in ("sum", "mean")
    wire = jnp.float32 if summing and dtype in _HALVES and max(group.island_sizes) > 1 and not replicated else dtype
    flat = _pad_to(x.reshape(-1).astype(wire), slots)
    if d == 1:
        segment = flat
    elif replicated:
        segment = _my_segment(flat, device, d)
    elif summing:
        segment = lax.psum_scatter(flat, axis_name, scatter_dimension=0, tiled=True)
    else:
        island = lax.pmax(flat, axis_name) if op == "max" else lax.pmin(flat, axis_name)
        segment = _my_segment(island, device, d)
    divisor = 1.0
    if op == "mean":
        divisor = float(group.num_islands if replicated else group.total_devices)
    attrs.update(
        op=np.int64(_REDUCE_OPS[op]),
        divisor=np.float64(divisor),
        algorithm=np.int64(_ALGORITHMS["ordered" if deterministic else "ring"]),
    )
    crossing = _wire(wire_dtype, dtype, op) or dtype
    segment = segment.astype(crossing) if wire_dtype is not None else segment

    def finish(y):
        if d > 1:
            y = lax.all_gather(y, axis_name, tiled=True)
        return y[: x.size].reshape(x.shape).astype(dtype)

    return _CallParts(
        device, segment, jax.ShapeDtypeStruct(segment.shape, crossing), attrs, finish, "hetjax_all_reduce"
    )


@dataclasses.dataclass(frozen=True)
class PendingCollective:
    """A collective in flight (`all_reduce_start`, `psum_scatter_start`);
    its done (`all_reduce_done`, `psum_scatter_done`) finishes it. Holds the
    operand and the result buffer, so XLA keeps both alive while the bytes
    move."""

    parts: _CallParts
    kept: jax.Array
    result: jax.Array


def _start(parts: _CallParts, token) -> tuple[PendingCollective, jax.Array]:
    register_ffi_targets()
    start = effect_free_ffi_call(
        parts.target + "_start",
        (_TOKEN, jax.ShapeDtypeStruct(parts.segment.shape, parts.segment.dtype), parts.result),
        input_output_aliases={2: 1},  # the operand stays where the op reads it
    )
    token = new_token() if token is None else token
    token, kept, y = start(token, parts.device, parts.segment, **parts.attrs)
    return PendingCollective(parts, kept, y), token


def _done(pending: PendingCollective, token):
    register_ffi_targets()
    done = effect_free_ffi_call(
        "hetjax_collective_done",
        (_TOKEN, pending.parts.result),
        input_output_aliases={3: 1},
    )
    token = new_token() if token is None else token
    base_tag = pending.parts.attrs["base_tag"]
    token, y = done(token, pending.parts.device, pending.kept, pending.result, base_tag=base_tag)
    return pending.parts.finish(y), token


def all_reduce_start(
    x,
    axis_name=None,
    *,
    group: Group,
    op: str = "sum",
    deterministic: bool = False,
    replicated: bool = False,
    token=None,
    tag: int | None = None,
    wire_dtype=None,
):
    """`all_reduce` in two halves: launches it and returns (pending, token)
    at once, so the program can compute while the bytes move; pass pending
    to `all_reduce_done` for the result. Same arguments and result as
    `all_reduce`, bit for bit.

    On CPU islands the reduction runs on a host thread of the device; on
    GPU islands over the slot channels on a communication stream of the
    device, which XLA's stream waits for at the done (elsewhere on a GPU
    the start enqueues the copy to pinned memory and a host thread of the
    device runs the rest). Start every pending op of a program before the
    first done that follows it, in the same order on every island: the tags
    say which op is which, and each device runs its started ops in order.
    """
    return _start(_all_reduce_parts(x, axis_name, group, op, deterministic, replicated, tag, wire_dtype), token)


def all_reduce_done(pending: PendingCollective, *, token=None):
    """Waits for a started all-reduce; returns (y, token)."""
    return _done(pending, token)


def psum(x, axis_name=None, *, group, **kw):
    return all_reduce(x, axis_name, group=group, op="sum", **kw)


def pmean(x, axis_name=None, *, group, **kw):
    return all_reduce(x, axis_name, group=group, op="mean", **kw)


def pmax(x, axis_name=None, *, group, **kw):
    return all_reduce(x, axis_name, group=group, op="max", **kw)


def pmin(x, axis_name=None, *, group, **kw):
    return all_reduce(x, axis_name, group=group, op="min", **kw)


def all_gather(x, axis_name=None, *, group: Group, tiled: bool = False, token=None, tag: int | None = None):
    """lax.all_gather over every device of every island (islands in order,
    devices in mesh order); returns (y, token). y: [G, *x.shape], or with
    tiled the G blocks concatenated along axis 0."""
    x = jnp.asarray(x)
    device = _device_index(group, axis_name)
    d, slots, m = group.local_devices, group.slots, x.size
    attrs = _attrs(group, tag, x)
    # Elements per slot of each island's block (at least one, see _pad_to).
    counts = [max(1, -(-dk * m // slots)) for dk in group.island_sizes]
    if m and d * m % slots == 0:
        # The island's block needs no padding, so this device's segment of it
        # is its own x: no island all-gather before the exchange. (Gathering
        # the own block beside the exchange instead, for XLA to overlap, ran
        # 0.67 of XLA where this runs 0.71-0.73 on 4 x H100.)
        mine = x.reshape(-1)
    else:
        block = lax.all_gather(x, axis_name) if d > 1 and m else jnp.broadcast_to(x, (d,) + x.shape)
        mine = _my_segment(_pad_to(block.reshape(-1), slots), device, d)
    y, token = _call(
        "hetjax_all_gather", token, device, mine, jax.ShapeDtypeStruct((slots // d * sum(counts),), x.dtype), attrs
    )
    if d > 1:
        y = lax.all_gather(y, axis_name, tiled=True)
    if slots == 1 and m:
        # One slot, no padding: the islands' blocks already lie in order.
        # (Slicing and concatenating them copied the whole result, which on
        # a CPU island cost more than the exchange.)
        out = y.reshape((sum(group.island_sizes),) + x.shape)
    else:
        by_slot = y.reshape(slots, sum(counts))
        blocks, at = [], 0
        for dk, count in zip(group.island_sizes, counts):
            island = by_slot[:, at : at + count].reshape(-1)[: dk * m]
            blocks.append(island.reshape((dk,) + x.shape))
            at += count
        out = jnp.concatenate(blocks, axis=0)
    if tiled:
        out = out.reshape((-1,) + x.shape[1:]) if x.ndim else out
    return out, token


def psum_scatter(
    x,
    axis_name=None,
    *,
    group: Group,
    scatter_dimension: int = 0,
    tiled: bool = False,
    op: str = "sum",
    token=None,
    tag: int | None = None,
    wire_dtype=None,
):
    """lax.psum_scatter over every device of every island; returns (y, token).

    Global device g (islands in order) gets block g of the sum along
    scatter_dimension, whose size must be G (or divisible by G when tiled).
    With equal device counts the islands exchange only their blocks
    (reduce-scatter, islands reduced in island order); otherwise this is an
    all-reduce followed by a slice. wire_dtype: as for all_reduce.
    """
    parts = _psum_scatter_parts(x, axis_name, group, scatter_dimension, tiled, op, tag, wire_dtype)
    return _run(parts, token)


def psum_scatter_start(
    x,
    axis_name=None,
    *,
    group: Group,
    scatter_dimension: int = 0,
    tiled: bool = False,
    op: str = "sum",
    token=None,
    tag: int | None = None,
    wire_dtype=None,
):
    """`psum_scatter` in two halves, as `all_reduce_start`: returns
    (pending, token) at once; `psum_scatter_done(pending)` gives the block,
    bit for bit `psum_scatter`'s."""
    parts = _psum_scatter_parts(x, axis_name, group, scatter_dimension, tiled, op, tag, wire_dtype)
    return _start(parts, token)


def psum_scatter_done(pending: PendingCollective, *, token=None):
    """Waits for a started psum_scatter; returns (y, token)."""
    return _done(pending, token)


def _psum_scatter_parts(x, axis_name, group, scatter_dimension, tiled, op, tag, wire_dtype) -> _CallParts:
    x = jnp.asarray(x)
    crossing = _wire(wire_dtype, x.dtype, op) or x.dtype
    n, d, total = group.num_islands, group.local_devices, group.total_devices
    axis = scatter_dimension % x.ndim
    size = x.shape[axis]
    if (tiled and size % total) or (not tiled and size != total):
        raise ValueError(
            f"psum_scatter over {total} devices: dimension {axis} of "
            f"{x.shape} must be {'divisible by ' if tiled else ''}{total}"
        )
    if op not in ("sum", "mean"):
        raise ValueError(f"psum_scatter op must be sum or mean, got {op!r}")
    b = size // total

    def place(block):
        block = jnp.moveaxis(block, 0, axis)
        return block if tiled else jnp.squeeze(block, axis)

    if len(set(group.island_sizes)) != 1:
        parts = _all_reduce_parts(x, axis_name, group, op, True, False, tag, wire_dtype)
        g = group.device_offset + parts.device

        def slice_mine(y):
            full = parts.finish(y)
            return place(lax.dynamic_slice_in_dim(jnp.moveaxis(full, axis, 0), g * b, b, 0))

        return dataclasses.replace(parts, finish=slice_mine)
    device = _device_index(group, axis_name)
    moved = jnp.moveaxis(x, axis, 0)
    rest = moved.shape[1:]
    attrs = _attrs(group, tag, x)
    wire = jnp.float32 if x.dtype in _HALVES and d > 1 else x.dtype
    # Order blocks [device][island] so that the island's own psum_scatter
    # leaves device j the blocks of global devices k*d + j, for every k.
    arranged = moved.reshape((n, d, b) + rest).swapaxes(0, 1).astype(wire)
    arranged = arranged.reshape((d * n * b,) + rest)
    if d > 1:
        arranged = lax.psum_scatter(arranged, axis_name, scatter_dimension=0, tiled=True)
    attrs.update(op=np.int64(0), divisor=np.float64(total if op == "mean" else 1.0))
    result = jax.ShapeDtypeStruct((b * int(np.prod(rest)),), crossing)

    def finish(y):
        return place(y.reshape((b,) + rest).astype(x.dtype))

    return _CallParts(device, arranged.reshape(-1).astype(crossing), result, attrs, finish, "hetjax_reduce_scatter")


def broadcast(x, axis_name=None, *, group: Group, root: int = 0, token=None, tag: int | None = None):
    """Every island gets island `root`'s x; returns (y, token). x must be the
    same on every device of an island (an island-level value)."""
    x = jnp.asarray(x)
    device = _device_index(group, axis_name)
    d = group.local_devices
    attrs = _attrs(group, tag, x)
    attrs.update(root=np.int64(root))
    flat = _pad_to(x.reshape(-1), group.slots)
    segment = _my_segment(flat, device, d) if d > 1 else flat
    y, token = _call("hetjax_broadcast", token, device, segment, jax.ShapeDtypeStruct(segment.shape, x.dtype), attrs)
    if d > 1:
        y = lax.all_gather(y, axis_name, tiled=True)
    return y[: x.size].reshape(x.shape), token
