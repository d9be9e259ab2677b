"""A receive expecting another dtype/shape fails clearly, then work goes on."""

import sys

import common
import jax
import jax.numpy as jnp
import numpy as np
from common import bridge

from hetjax import _native
from hetjax.errors import MismatchError


def main():
    info = bridge.init()
    if info.rank == 0:
        bridge.send(jnp.arange(4, dtype=jnp.int32), peer=1, tag=7)
        _native.send_array(1, 9, np.zeros((2, 3), np.float32))
        bridge.send(jnp.ones(3, jnp.float32), peer=1, tag=8)
        # Wait for rank 1 to be done before closing our side.
        _native.recv_array(1, 10, np.zeros((), np.uint8))
    else:
        recv_f32 = jax.jit(lambda: bridge.recv((4,), jnp.float32, peer=0, tag=7)[0])
        try:
            with bridge.translate_errors():
                recv_f32().block_until_ready()
            raise AssertionError("a mismatched receive succeeded")
        except MismatchError as e:
            message = str(e)
        print("jit error:", message)
        for part in ("0", "tag 7", "float32[4]", "int32[4]"):
            assert part in message, f"{part!r} not in {message!r}"
        try:
            _native.recv_array(0, 9, np.zeros((3, 2), np.float32))
            raise AssertionError("a mismatched recv_array succeeded")
        except MismatchError as e:
            message = str(e)
        print("native error:", message)
        for part in ("tag 9", "float32[3,2]", "float32[2,3]"):
            assert part in message, f"{part!r} not in {message!r}"
        y, _ = bridge.recv((3,), jnp.float32, peer=0, tag=8)
        np.testing.assert_array_equal(np.asarray(y), np.ones(3, np.float32))
        _native.send_array(0, 10, np.zeros((), np.uint8))
    common.shutdown_and_check_clean(info)
    print(f"OK rank {info.rank}")


if __name__ == "__main__":
    sys.exit(main())
