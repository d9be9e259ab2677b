"""One side of a GPU bridge test. JAX_PLATFORMS (set by the test) decides
whether this process is a GPU island or a CPU island.

    gpu_roundtrip.py roundtrip     every dtype, sizes up to 256 MiB, both ways
    gpu_roundtrip.py large         large messages of odd sizes both ways,
                                   programs dispatched ahead of the transfers
    gpu_roundtrip.py mismatch      a wrong-dtype receive on the GPU must raise
    gpu_roundtrip.py mismatch_cpu  the same on rank 1 (the CPU island's end)
"""

import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import hetjax.bridge as bridge  # noqa: E402

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
    np.complex128,
]
SMALL_SHAPES = [(), (0,), (7,), (3, 5), (2, 3, 1, 4)]
# Around the staging chunk (4 MiB) and up to 256 MiB.
BIG = [(np.uint8, (4 << 20) - 1), (np.float32, (1 << 20) + 3), (ml_dtypes.bfloat16, 3 << 22), (np.float32, 64 << 20)]


def pattern(seed, dtype, shape):
    """Arbitrary bit patterns (NaNs included), except bool's 0/1."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = rng.integers(0, 256, size=nbytes, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def cases():
    tag = 1
    for dtype in DTYPES:
        for shape in SMALL_SHAPES:
            yield tag, dtype, shape
            tag += 1
    for dtype, n in BIG:
        yield tag, dtype, (n,)
        tag += 1


def send_cases(peer, tag_base):
    device = jax.devices()[0]
    for tag, dtype, shape in cases():
        x = jax.device_put(pattern(tag, dtype, shape), device)
        step = jax.jit(lambda x, t=tag: bridge.send(x, peer=peer, tag=tag_base + t))
        with bridge.translate_errors():
            step(x).block_until_ready()


def recv_cases(peer, tag_base):
    for tag, dtype, shape in cases():
        step = jax.jit(lambda t=tag, d=dtype, s=shape: bridge.recv(s, d, peer=peer, tag=tag_base + t)[0])
        with bridge.translate_errors():
            got = np.asarray(step())
        want = pattern(tag, dtype, shape)
        assert got.dtype == want.dtype and got.shape == want.shape, (tag, got.dtype, got.shape, want.dtype, want.shape)
        assert got.tobytes() == want.tobytes(), f"{np.dtype(dtype).name}{shape} (tag {tag_base + tag}) differs"


def timed_transfer(me, nbytes=256 << 20, reps=3):
    """Rank 0 -> rank 1, one program per message; best GB/s seen by rank 1.

    Tags are static, so every message has its own program: all are compiled
    before the clock starts.
    """
    shape, tags = (nbytes // 4,), [900000 + r for r in range(reps + 1)]
    if me == 0:
        x = jnp.ones(shape, jnp.float32)
        sends = [jax.jit(lambda x, t=t: bridge.send(x, peer=1, tag=t)).lower(x).compile() for t in tags]
        for send in sends:
            send(x).block_until_ready()
        return None
    recvs = [jax.jit(lambda t=t: bridge.recv(shape, jnp.float32, peer=0, tag=t)[0]).lower().compile() for t in tags]
    best = 0.0
    for r, recv in enumerate(recvs):
        t0 = time.perf_counter()
        recv().block_until_ready()
        if r:  # the first also waits for the sender to start
            best = max(best, nbytes / (time.perf_counter() - t0) / 1e9)
    return best


def roundtrip(me, path):
    other = 1 - me
    if me == 0:
        send_cases(other, 0)
        recv_cases(other, 100000)
    else:
        recv_cases(other, 0)
        send_cases(other, 100000)
    gbps = timed_transfer(me)
    n = sum(1 for _ in cases())
    print(
        f"OK rank {me} on {jax.devices()[0].platform}, path {path}: {n} "
        f"arrays each way bitwise equal" + (f"; 256 MiB at {gbps:.2f} GB/s" if gbps else "")
    )


# Past the slots (16 MiB on the GPU <-> CPU path), the ring (8 of them) and
# the copy threads' 4 KiB pieces: none of them divides these sizes.
LARGE = [
    (np.uint8, ((256 << 20) + 4093,)),
    (ml_dtypes.bfloat16, (3, (5 << 20) + 1)),
    (np.float32, ((16 << 20) + 1,)),
    (np.int8, (1,)),
]


def large(me, path):
    """Each direction in turn: all messages dispatched ahead, so several are
    in the slots at once, then checked bit for bit by the receiver."""
    other, device = 1 - me, jax.devices()[0]
    for direction in (0, 1):
        tags = [700 + 10 * direction + k for k in range(len(LARGE))]
        if me == direction:
            tokens = []
            for tag, (dtype, shape) in zip(tags, LARGE):
                x = jax.device_put(pattern(tag, dtype, shape), device)
                tokens.append(jax.jit(lambda x, t=tag: bridge.send(x, peer=other, tag=t))(x))
            with bridge.translate_errors():
                jax.block_until_ready(tokens)
            continue
        recvs = [
            jax.jit(lambda t=tag, d=dtype, s=shape: bridge.recv(s, d, peer=other, tag=t)[0])()
            for tag, (dtype, shape) in zip(tags, LARGE)
        ]
        for tag, (dtype, shape), y in zip(tags, LARGE, recvs):
            with bridge.translate_errors():
                got = np.asarray(y)
            want = pattern(tag, dtype, shape)
            assert got.dtype == want.dtype and got.shape == want.shape, (tag, got.dtype, got.shape)
            assert got.tobytes() == want.tobytes(), f"{np.dtype(dtype).name}{shape} (tag {tag}) differs"
    print(f"OK rank {me} on {jax.devices()[0].platform}, path {path}: {len(LARGE)} large messages each way bitwise")


def mismatch_cpu(me, path):
    # Rank 1 is the CPU island of a GPU <-> CPU pair: its end of the channel
    # finds the mismatch itself.
    mismatch(me, path, receiver=1)


def mismatch(me, path, receiver=0):
    # Rank 0 is a GPU island in every setup: by default it is the receiver.
    sender = 1 - receiver
    if me == sender:
        bridge.send(jnp.arange(4, dtype=jnp.float32), peer=receiver, tag=7).block_until_ready()
        bridge.send(jnp.arange(4, dtype=jnp.float32), peer=receiver, tag=8).block_until_ready()
        return
    # The error may be known at the receive (message already there) or only
    # after it returned, then raised by the next op: within two ops it must
    # raise, naming the tag, and never hang.
    t0 = time.perf_counter()
    try:
        with bridge.translate_errors():
            y, _ = bridge.recv((4,), jnp.int32, peer=sender, tag=7)
            y.block_until_ready()
            z, _ = bridge.recv((4,), jnp.float32, peer=sender, tag=8)
            z.block_until_ready()
    except Exception as e:  # noqa: BLE001 - the type is what we print
        print(f"raised {type(e).__name__} after {time.perf_counter() - t0:.2f} s: {e}")
        return
    raise AssertionError("a float32 message received as int32 did not raise")


def main():
    info = bridge.init()
    path = info.links[1 - info.rank].gpu_path or "staged"
    modes = {"roundtrip": roundtrip, "large": large, "mismatch": mismatch, "mismatch_cpu": mismatch_cpu}
    modes[sys.argv[1]](info.rank, path)
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
