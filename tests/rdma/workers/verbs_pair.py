"""Both bridge ranks of the guest check, over verbs (HETJAX_TRANSPORT=verbs).

One pair of processes runs every check in turn, because importing jax under
emulation costs about a minute per process. Each check prints one line
`CHECK <name> ok|FAIL <detail>` that the host-side tests read.

  env            pyverbs (hetjax.info) sees rxe0 and rxe1 active, with GIDs
  wrong_secret   rank 1 first knocks on the rendezvous with a wrong secret
  link           both ranks agreed on verbs, with queue pairs on every device
  topology       the start-up log says which devices were chosen and why
  dtypes         one jitted program sends every dtype, token-threaded
  large          a 12 MiB message (three of a queue pair's 4 MiB rings), inside jit
  out_of_order   three tags received in another order than sent
  collectives    all-reduce (ring, and ordered) and all-gather of two islands over verbs
  killed         rank 1 is SIGKILLed mid-message; rank 0 gets PeerLostError
"""

import logging
import os
import signal
import sys
import threading
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import hetjax.bridge as bridge  # noqa: E402
from hetjax import _native  # noqa: E402
from hetjax.bridge.rendezvous import RendezvousClient  # noqa: E402
from hetjax.errors import AuthenticationError, PeerLostError  # noqa: E402

DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
)
LARGE = (3, 1 << 20)  # float32: 12 MiB
KILLED_BYTES = 256 << 20


class _LogLines(logging.Handler):
    """Keeps the messages of one logger that start with `prefix`."""

    def __init__(self, logger, prefix):
        super().__init__(logging.INFO)
        self.prefix, self.lines = prefix, []
        logging.getLogger(logger).addHandler(self)
        logging.getLogger(logger).setLevel(logging.INFO)

    def emit(self, record):
        message = record.getMessage()
        if message.startswith(self.prefix):
            self.lines.append(message)


def check(name, ok, detail=""):
    print(f"CHECK {name} {'ok' if ok else 'FAIL'} {detail}", flush=True)


def sample(dtype, n=5, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=n) * 100
    if dtype == "bool":
        return values > 0
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return (values + 1j * values[::-1]).astype(dtype)
    return np.asarray(values).astype(jnp.dtype(dtype))


def knock_with_wrong_secret():
    try:
        RendezvousClient(os.environ["HETJAX_COORDINATOR"], b"not-the-secret", rank=1, timeout_s=30)
    except AuthenticationError as e:
        check("wrong_secret", True, f"refused: {e}")
        return
    check("wrong_secret", False, "a wrong secret was let in")


def run_dtypes(me, peer):
    arrays = [sample(d, seed=i) for i, d in enumerate(DTYPES)]
    if me == 0:

        @jax.jit
        def send_all(*xs):
            token = bridge.new_token()
            for tag, x in enumerate(xs):
                token = bridge.send(x, peer=peer, tag=100 + tag, token=token)
            return token

        send_all(*arrays).block_until_ready()
        return

    @jax.jit
    def recv_all():
        token, out = bridge.new_token(), []
        for tag, x in enumerate(arrays):
            y, token = bridge.recv(x.shape, x.dtype, peer=peer, tag=100 + tag, token=token)
            out.append(y)
        return out

    got = recv_all()
    bad = [
        d
        for d, x, y in zip(DTYPES, arrays, got)
        if np.asarray(y).dtype != x.dtype or np.asarray(y).tobytes() != x.tobytes()
    ]
    check("dtypes", not bad, f"{len(DTYPES)} dtypes, wrong: {bad}")


def run_large(me, peer):
    if me == 0:
        x = jnp.arange(np.prod(LARGE), dtype=jnp.float32).reshape(LARGE)
        jax.jit(lambda x: bridge.send(x * 2, peer=peer, tag=200))(x).block_until_ready()
        return
    start = time.monotonic()
    y, _ = jax.jit(lambda: bridge.recv(LARGE, jnp.float32, peer=peer, tag=200))()
    y = np.asarray(y)
    seconds = time.monotonic() - start
    want = np.arange(np.prod(LARGE), dtype=np.float32).reshape(LARGE) * 2
    check("large", np.array_equal(y, want), f"{y.nbytes >> 20} MiB in {seconds:.2f} s")


def run_out_of_order(me, peer):
    if me == 0:

        @jax.jit
        def send_three():
            token = bridge.new_token()
            for tag in (31, 32, 33):
                token = bridge.send(jnp.full((3,), tag, jnp.int32), peer=peer, tag=tag, token=token)
            return token

        send_three().block_until_ready()
        return

    @jax.jit
    def recv_reversed():
        token, out = bridge.new_token(), []
        for tag in (33, 31, 32):
            y, token = bridge.recv((3,), jnp.int32, peer=peer, tag=tag, token=token)
            out.append(y)
        return out

    got = [np.asarray(y).tolist() for y in recv_reversed()]
    check("out_of_order", got == [[33] * 3, [31] * 3, [32] * 3], f"got {got}")


def run_collectives(me):
    """The island collectives' host ring over the verbs transport: what CPU
    islands on two hosts (and GPU islands on the staged path) use."""
    import hetjax.collectives as hc

    group = hc.all_islands()
    x = jnp.arange(1 << 18, dtype=jnp.float32) * (me + 1)  # 1 MiB: several of the ring's pieces

    @jax.jit
    def run(x):
        total, token = hc.psum(x, group=group)
        ordered, token = hc.all_reduce(x, group=group, deterministic=True, token=token)
        both, token = hc.all_gather(x, group=group, token=token)
        return total, ordered, both, token

    total, ordered, both, _ = (np.asarray(v) for v in run(x))
    base = np.arange(1 << 18, dtype=np.float32)
    ok = (
        np.array_equal(total, base * 3)
        and np.array_equal(ordered, base + base * 2)
        and np.array_equal(both, np.stack([base, base * 2]))
    )
    check("collectives", ok, f"rank {me}: psum, ordered all_reduce and all_gather of {x.nbytes >> 20} MiB")


def run_killed(me, peer):
    if me == 1:
        payload = np.ones(KILLED_BYTES, np.uint8)
        threading.Thread(target=_native.send_array, args=(peer, 300, payload), daemon=True).start()
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        with bridge.translate_errors():
            y, _ = bridge.recv((KILLED_BYTES,), jnp.uint8, peer=peer, tag=300)
            y.block_until_ready()
        check("killed", False, "a receive from a killed peer succeeded")
    except PeerLostError as e:
        check("killed", "rank 1" in str(e), f"PeerLostError after {time.monotonic() - start:.2f} s: {e}")


def main():
    me = int(os.environ["HETJAX_RANK"])
    peer = 1 - me
    if me == 0:
        from hetjax.info import rdma_ports  # pyverbs, as `hetjax info` does

        found = rdma_ports()
        active = sorted(p["device"] for p in found.get("ports", []) if p["active"] and p["gids"])
        check("env", active == ["rxe0", "rxe1"], f"pyverbs: {found}")
    if me == 1:
        time.sleep(1.0)  # rank 0 serves the rendezvous
        knock_with_wrong_secret()
    choices = _LogLines("hetjax.bridge", "bridge RDMA devices")
    info = bridge.init()
    link = info.links[peer]
    check("topology", any("rxe0:1,rxe1:1" in line for line in choices.lines), f"rank {me}: {choices.lines}")
    ports = [p["device"] for p in _native.verbs_ports() if p["active"]]
    check(
        "link",
        link.kind == "verbs" and len(link.rdma_devices) == len(ports),
        f"rank {me}: {link.kind} over {list(link.rdma_devices)}",
    )
    run_dtypes(me, peer)
    run_large(me, peer)
    run_out_of_order(me, peer)
    run_collectives(me)
    run_killed(me, peer)
    # rank 0 only (rank 1 is dead): leaving must not hang on the dead peer.
    bridge.shutdown()
    check("survivor_shutdown", True)


if __name__ == "__main__":
    sys.exit(main())
