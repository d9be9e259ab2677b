"""Rank 0 sends every dtype and shape inside jit; rank 1 checks bit for bit.

Both sides build the same data from the same seed, so nothing but the bridge
carries it. Rank 1 answers with a reply to prove the other direction.
Run by transfers.py.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from common import bridge

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    ml_dtypes.bfloat16,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
]
SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 1, 4)]
BIG = (np.float32, (4096, 4096))  # 64 MiB


def cases():
    for d, dtype in enumerate(DTYPES):
        yield d, dtype, SHAPES
    yield len(DTYPES), BIG[0], [BIG[1]]


def pattern(seed, dtype, shape):
    """Arbitrary bit patterns (NaNs included), except bool's 0/1."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def sender(case, dtype, shapes):
    @jax.jit
    def send_all(*xs):
        token = bridge.new_token()
        for i, x in enumerate(xs):
            token = bridge.send(x, peer=1, tag=100 * case + i, token=token)
        return token

    xs = [pattern(100 * case + i, dtype, s) for i, s in enumerate(shapes)]
    send_all(*xs).block_until_ready()


def receiver(case, dtype, shapes):
    @jax.jit
    def recv_all():
        token, ys = bridge.new_token(), []
        for i, s in enumerate(shapes):
            y, token = bridge.recv(s, dtype, peer=0, tag=100 * case + i, token=token)
            ys.append(y)
        return ys

    for i, (s, y) in enumerate(zip(shapes, recv_all())):
        want = pattern(100 * case + i, dtype, s)
        got = np.asarray(y)
        assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
        assert got.tobytes() == want.tobytes(), f"{np.dtype(dtype)}{s} differs"


def exchange(info) -> str:
    """Every case one way, the reply the other; returns the line to print
    once the bridge shut down cleanly."""
    me = info.rank
    for case, dtype, shapes in cases():
        (sender if me == 0 else receiver)(case, dtype, shapes)
    reply_tag = 999
    if me == 1:
        bridge.send(jnp.arange(5, dtype=jnp.int32) * 3, peer=0, tag=reply_tag).block_until_ready()
    else:
        y, _ = bridge.recv((5,), jnp.int32, peer=1, tag=reply_tag)
        np.testing.assert_array_equal(np.asarray(y), np.arange(5) * 3)
    kinds = sorted({link.kind for link in info.links.values()})
    slots = sorted({str(link.gpu_path) for link in info.links.values()})
    return f"OK rank {me} over {kinds}, slots {slots}: {sum(len(s) for *_, s in cases())} arrays bitwise equal"
