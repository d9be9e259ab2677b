"""Rank 0 sends ROUNDS messages; rank 1 receives each into the buffer the
last one filled (donated), so every message lands in the same memory.
transfers.py runs this exchange after roundtrip.py's on CPU islands; run
alone, this script is one island of tests/gpu/test_gpu_bridge.py."""

import functools
import sys

import common
import jax
import jax.numpy as jnp
import numpy as np
from common import bridge

ROUNDS, N = 4, 3 << 20  # 12 MiB of float32: several of the CPU end's copy pieces


def message(k: int) -> np.ndarray:
    return np.arange(N, dtype=np.float32) * (k + 1) - k


def exchange(info) -> str:
    """Returns the line to print once the bridge shut down (cleanly on CPU)."""
    me, peer = info.rank, 1 - info.rank
    if me == 0:
        send = jax.jit(lambda x, k: bridge.send(x, peer=peer, tag=10 + k), static_argnums=1)
        for k in range(ROUNDS):
            send(jnp.asarray(message(k)), k).block_until_ready()
    else:

        @functools.partial(jax.jit, static_argnums=1, donate_argnums=0)
        def receive(buffer, k):
            return bridge.recv_into(buffer, peer=peer, tag=10 + k)[0]

        buffer = jnp.full((N,), -1.0, jnp.float32)
        where = buffer.unsafe_buffer_pointer()
        for k in range(ROUNDS):
            with bridge.translate_errors():
                buffer = receive(buffer, k).block_until_ready()
            np.testing.assert_array_equal(np.asarray(buffer), message(k))
            # Donated and aliased: the message was written where the buffer was.
            assert buffer.unsafe_buffer_pointer() == where, (k, hex(where), hex(buffer.unsafe_buffer_pointer()))
        # Not donated: XLA copies the buffer first; the caller's array is untouched.
        kept = jnp.zeros((N,), jnp.float32)
        send_back = jax.jit(lambda: bridge.recv_into(kept, peer=peer, tag=99)[0])
        bridge.send(jnp.ones((1,), jnp.float32), peer=peer, tag=98).block_until_ready()
        got = send_back()
        np.testing.assert_array_equal(np.asarray(got), message(0))
        assert not np.asarray(kept).any()
    if me == 0:
        bridge.recv((1,), jnp.float32, peer=peer, tag=98)[0].block_until_ready()
        bridge.send(jnp.asarray(message(0)), peer=peer, tag=99).block_until_ready()
    return f"OK rank {me} recv_into over {[link.describe() for link in info.links.values()]}"


def main():
    info = bridge.init()
    ok = exchange(info)
    if jax.default_backend() == "cpu":
        common.shutdown_and_check_clean(info)
    else:  # a GPU runtime keeps sockets of its own open: nothing to check there
        bridge.shutdown()
    print(ok)


if __name__ == "__main__":
    sys.exit(main())
