"""One single-process island in a collectives check.

Every device of every island contributes row g (its global index) of one
array X[G, ...] built from a seed all islands share. Each cross-island
collective must equal jax.lax's own collective computed here on a mesh of all
G devices in this one process (XLA_FLAGS gives the process G devices; the
island itself uses only the first HETJAX_TEST_LOCAL_DEVICES of them).

env: HETJAX_TEST_LOCAL_DEVICES (this island's devices), HETJAX_TEST_CHECKS (comma list of
reduce, hierarchical, gather, scatter, broadcast, deterministic, wire, started: workers/started.py's
checks, which read HETJAX_TEST_HANDSHAKE), HETJAX_TEST_REF_PLATFORM (where
lax's reference runs; default: the island's own platform). A GPU island
(JAX_PLATFORMS=cuda,cpu, HETJAX_TEST_REF_PLATFORM=cpu) uses its GPUs and checks against
lax on G host devices (tests/gpu/test_collectives_gpu.py).
"""

import dataclasses
import os
import sys
import zlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from gpu_stand_in import maybe_stand_in, print_paths
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from started import check_started

import hetjax.bridge as bridge
import hetjax.collectives as hc

SHAPES = [(), (0,), (3, 7)]
REDUCE_CASES = [
    (jnp.float32, ["sum", "mean", "max", "min"]),
    (jnp.bfloat16, ["sum", "mean"]),
    (jnp.float16, ["sum"]),
    (jnp.int32, ["sum", "max", "min"]),
    (jnp.uint8, ["sum"]),
]  # uint8 sums wrap around, as XLA's do


def make(total, shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if jnp.issubdtype(dtype, jnp.integer):
        return rng.integers(0, 100, (total,) + shape).astype(dtype)
    return rng.standard_normal((total,) + shape).astype(dtype)


def per_device(mesh, axis, fn, *arrays):
    """Runs fn on each device's row of every array; stacks results by device."""
    spec = P(axis)
    wrapped = jax.shard_map(
        lambda *xs: jax.tree.map(lambda y: y[None], fn(*(x[0] for x in xs))),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
        check_vma=False,
    )
    return jax.tree.map(np.asarray, jax.jit(wrapped)(*arrays))


def assert_close(got, want, dtype, what):
    got = np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if jnp.issubdtype(dtype, jnp.integer):
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        # Within one rounding of the result (plus the reference's own).
        eps = float(jnp.finfo(dtype).eps)
        g, w = got.astype(np.float64), want.astype(np.float64)
        np.testing.assert_allclose(g, w, rtol=2 * eps, atol=2 * eps * max(1.0, np.abs(w).max(initial=0)), err_msg=what)


@dataclasses.dataclass
class Case:
    """One comparison: `ours(x, token) -> (y, token)` on the island's
    mesh against `reference(x)` (jax.lax over all G devices) on X."""

    name: str
    ours: Callable
    reference: Callable
    dtype: type
    X: np.ndarray


class Checker:
    def __init__(self, group, island_devices, ref_devices):
        self.g = group
        self.total = group.total_devices
        assert len(ref_devices) >= self.total, "set XLA_FLAGS device count"
        self.island_mesh = Mesh(np.array(island_devices), ("d",))
        self.ref_mesh = Mesh(np.array(ref_devices[: self.total]), ("g",))
        local = len(island_devices)
        self.rows = slice(group.device_offset, group.device_offset + local)

    def compare(self, cases: list[Case]):
        """Every case in one island program, the token threaded through
        them in the same order on every island, and one reference program:
        a few dozen tiny programs each would cost a process seconds of
        tracing and compiling. Each case is then checked on its own.
        Zero-size operands run alone: beside other collectives in one
        program, XLA:CPU (jaxlib 0.11.2) crashes on an all-reduce or
        all-gather of zero elements (an island's own over its devices, and
        lax's reference)."""
        if len(cases) > 1 and any(not case.X.size for case in cases):
            for case in cases:
                if not case.X.size:
                    self.compare([case])
            cases = [case for case in cases if case.X.size]

        def ours(*xs):
            token, ys = None, []
            for case, x in zip(cases, xs):
                y, token = case.ours(x, token)
                ys.append(y)
            # The token is kept: a program whose outputs are all empty may
            # not run at all on a multi-device island.
            return ys, token

        got, _ = per_device(self.island_mesh, "d", ours, *(case.X[self.rows] for case in cases))
        if cases[0].X.size:
            lax_side = lambda *xs: [case.reference(x) for case, x in zip(cases, xs)]  # noqa: E731
            want = per_device(self.ref_mesh, "g", lax_side, *(case.X for case in cases))
        else:  # one zero-size case (above): lax is not asked to move zero elements
            want = [self.empty_reference(cases[0])]
        for case, mine, theirs in zip(cases, got, want):
            what = f"{case.name} {case.dtype.__name__}{list(case.X.shape[1:])}"
            for j in range(mine.shape[0]):
                assert_close(mine[j], theirs[self.rows.start + j], case.dtype, f"{what} device {j}")

    def empty_reference(self, case: Case) -> np.ndarray:
        """lax's result for a zero-size operand: its shape, and no values."""
        spec = P("g")
        program = jax.shard_map(
            lambda x: case.reference(x[0])[None], mesh=self.ref_mesh, in_specs=spec, out_specs=spec, check_vma=False
        )
        result = jax.eval_shape(program, jax.ShapeDtypeStruct(case.X.shape, case.X.dtype))
        assert result.size == 0, (case.name, result.shape)
        return np.zeros(result.shape, result.dtype)

    def reduce(self):
        cases = []
        for dtype, ops in REDUCE_CASES:
            for shape in SHAPES:
                X = make(self.total, shape, dtype, seed=zlib.crc32(f"{dtype.__name__}{shape}".encode()))
                for op in ops:
                    lax_op = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin, "mean": lax.pmean}[op]
                    cases.append(
                        Case(
                            f"all_reduce({op})",
                            lambda x, token, op=op: hc.all_reduce(x, "d", group=self.g, op=op, token=token),
                            lambda x, f=lax_op: f(x, "g"),
                            dtype,
                            X,
                        )
                    )
        self.compare(cases)

    def gather(self):
        ours = lambda x, token: hc.all_gather(x, "d", group=self.g, token=token)
        cases = [
            Case("all_gather", ours, lambda x: lax.all_gather(x, "g"), dtype, make(self.total, shape, dtype, seed=7))
            for dtype in [jnp.float32, jnp.int32, jnp.bfloat16]
            for shape in SHAPES
        ]
        tiled = Case(
            "all_gather(tiled)",
            lambda x, token: hc.all_gather(x, "d", group=self.g, tiled=True, token=token),
            lambda x: lax.all_gather(x, "g", tiled=True),
            jnp.float32,
            make(self.total, (2, 3), jnp.float32, seed=8),
        )
        self.compare([*cases, tiled])

    def scatter(self):
        G = self.total
        cases = []
        for dtype in [jnp.float32, jnp.int32, jnp.bfloat16]:
            for shape, tiled, dim in [((G,), False, 0), ((3, 2 * G), True, 1), ((G, 3), False, 0)]:
                cases.append(
                    Case(
                        f"psum_scatter(tiled={tiled}, dim={dim})",
                        lambda x, token, t=tiled, d=dim: hc.psum_scatter(
                            x, "d", group=self.g, scatter_dimension=d, tiled=t, token=token
                        ),
                        lambda x, t=tiled, d=dim: lax.psum_scatter(x, "g", scatter_dimension=d, tiled=t),
                        dtype,
                        make(G, shape, dtype, seed=9),
                    )
                )
        self.compare(cases)

    def broadcast(self):
        root = self.g.num_islands - 1
        root_offset = sum(self.g.island_sizes[:root])
        wanted, firsts = [], []
        for dtype in [jnp.float32, jnp.int32]:
            for shape in SHAPES:
                X = make(self.total, shape, dtype, seed=11)
                wanted.append(X[root_offset])
                # An island-level value: every device of island k holds row
                # (first device of k); the root island's must reach everyone.
                firsts.append(
                    np.concatenate(
                        [
                            np.repeat(X[sum(self.g.island_sizes[:k])][None], dk, 0)
                            for k, dk in enumerate(self.g.island_sizes)
                        ]
                    )
                )

        def broadcast_all(*xs):
            token, ys = None, []
            for x in xs:
                y, token = hc.broadcast(x, "d", group=self.g, root=root, token=token)
                ys.append(y)
            return ys, token

        # One program as compare's, zero-size operands alone (see compare).
        cases = list(range(len(firsts)))
        batches = [[k for k in cases if firsts[k].size]] + [[k] for k in cases if not firsts[k].size]
        for batch in batches:
            got, _ = per_device(self.island_mesh, "d", broadcast_all, *(firsts[k][self.rows] for k in batch))
            for k, mine in zip(batch, got):
                for j in range(mine.shape[0]):
                    np.testing.assert_array_equal(mine[j], wanted[k], err_msg=f"broadcast case {k} device {j}")

    def hierarchical(self):
        # psum over every device of every island = lax.psum over all G
        # devices as one island (4 MiB per device in the large case).
        cases = []
        for dtype, shape in [(jnp.float32, (3, 7)), (jnp.float32, ((1 << 20) + 5,)), (jnp.bfloat16, (1000,))]:
            X = make(self.total, shape, dtype, seed=21)
            for deterministic in (False, True):
                cases.append(
                    Case(
                        f"psum(deterministic={deterministic})",
                        lambda x, token, d=deterministic: hc.psum(x, "d", group=self.g, deterministic=d, token=token),
                        lambda x: lax.psum(x, "g"),
                        dtype,
                        X,
                    )
                )
        self.compare(cases)

    def deterministic(self):
        # Over 4 MiB per slot segment: several pipelined pieces per message.
        X = make(self.total, ((1 << 21) + 3,), jnp.float32, seed=12) * np.float32(1e3)
        run = lambda: per_device(
            self.island_mesh, "d", lambda x: hc.psum(x, "d", group=self.g, deterministic=True), X[self.rows]
        )[0]
        first, second = run(), run()
        assert first.tobytes() == second.tobytes(), "deterministic psum differs run to run"
        if all(d == 1 for d in self.g.island_sizes):
            # Island order, exactly: ((x0 + x1) + x2) ... in float32.
            want = X[0].copy()
            for row in X[1:]:
                want = want + row
            assert first[0].tobytes() == want.tobytes(), "not the island-order sum"
        Xh = make(self.total, (257,), jnp.bfloat16, seed=13)
        got, _ = per_device(
            self.island_mesh, "d", lambda x: hc.psum(x, "d", group=self.g, deterministic=True), Xh[self.rows]
        )
        exact = Xh.astype(np.float32).sum(0)  # one rounding of the exact-ish sum
        assert_close(got[0], exact.astype(jnp.bfloat16), jnp.bfloat16, "bf16 sum in f32")
        print("deterministic: bitwise equal over two runs")

    def rounded_island_sum(self, X, dtype):
        """Each island's float32 partial rounded to dtype, the partials summed
        in float32 in island order, the sum rounded to dtype, as float32."""
        partials, at = [], 0
        for size in self.g.island_sizes:
            p = X[at]
            for row in X[at + 1 : at + size]:
                p = p + row
            partials.append(p.astype(dtype).astype(np.float32))
            at += size
        total = partials[0]
        for p in partials[1:]:
            total = total + p
        return total.astype(dtype).astype(np.float32)

    def wire(self):
        """Sums whose island partials cross the bridge in bfloat16."""
        bf16 = jnp.bfloat16
        X = make(self.total, (1000,), jnp.float32, seed=31)
        want = self.rounded_island_sum(X, bf16)
        for deterministic in (True, False):
            got, _ = per_device(
                self.island_mesh,
                "d",
                lambda x, d=deterministic: hc.psum(x, "d", group=self.g, deterministic=d, wire_dtype=bf16),
                X[self.rows],
            )
            assert got.dtype == np.float32, got.dtype
            for j in range(got.shape[0]):
                if deterministic:
                    assert got[j].tobytes() == want.tobytes(), f"wire psum device {j}: not the rounded island sum"
                else:
                    assert_close(got[j], want, bf16, f"wire psum (ring) device {j}")
        assert np.abs(got[0] - X.sum(0)).max() > 0, "a bfloat16 wire left the float32 sum untouched"
        G = self.total
        Xs = make(G, (G, 6), jnp.float32, seed=32)
        want = self.rounded_island_sum(Xs, bf16)
        got, _ = per_device(
            self.island_mesh, "d", lambda x: hc.psum_scatter(x, "d", group=self.g, wire_dtype=bf16), Xs[self.rows]
        )
        for j in range(got.shape[0]):
            assert_close(got[j], want[self.rows.start + j], bf16, f"wire psum_scatter device {j}")
        print("wire: bfloat16 partials, float32 accumulation")

    def started(self):
        """Started collectives equal the one-call ones (workers/started.py),
        checked in these processes rather than in a launch of their own."""
        check_started(self.g, self.island_mesh)


def main():
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    info = bridge.init()
    maybe_stand_in(info)
    local = int(os.environ["HETJAX_TEST_LOCAL_DEVICES"])
    group = hc.all_islands(local_devices=local)
    island_devices = jax.devices()[:local]
    checker = Checker(group, island_devices, jax.devices(os.environ.get("HETJAX_TEST_REF_PLATFORM") or None))
    platform = island_devices[0].platform
    for check in os.environ["HETJAX_TEST_CHECKS"].split(","):
        getattr(checker, check)()
        print(f"OK {check} on rank {info.rank} of islands {group.island_sizes} ({platform})")
    print_paths(info)
    bridge.shutdown()


if __name__ == "__main__":
    sys.exit(main())
