"""Compressed all-reduce under mpiexec: fp16/bf16 error bounds and bytes,
top-k against a locally recomputed reference, identical bits everywhere."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import assert_identical_everywhere
from mpicoll import compression as C
from mpicoll.algorithms.common import block_bounds
from mpicoll.arguments import reduction as _reduction
from mpicoll.algorithms import get as get_algorithm
from mpicoll.bench.wire import counting
from mpicoll.commstate import state
from mpicoll import dtypes

pytestmark = pytest.mark.mpi

UNIT = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}


def counts_for(p):
    return sorted({0, 1, max(p - 1, 1), 2 * p + 1, 70001})


def inputs(n, p, dtype, seed=0):
    return [np.random.default_rng(seed * 1000 + r).standard_normal(n).astype(dtype) for r in range(p)]


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_half_precision_error_bound(fmt, dtype):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    for n in counts_for(p):
        xs = inputs(n, p, dtype)
        exact = np.sum(np.array(xs, np.float64), axis=0) if n else np.zeros(0)
        sumabs = np.sum(np.abs(np.array(xs, np.float64)), axis=0) if n else np.zeros(0)
        # Each option in both states, not every combination: the suite runs at 6 process counts.
        for prescale, op, in_place in ((False, "sum", False), (False, "avg", True), (True, "sum", True),
                                       (True, "avg", False)):
            spec = C.HalfPrecision(fmt, prescale=prescale)
            scale = p if op == "avg" else 1
            x = xs[rank].copy()
            got = mpicoll.allreduce(x, op=op, compression=spec, out=x if in_place else None)
            assert got.dtype == dtype and got.shape == (n,)
            if in_place:
                assert got is x
            else:
                np.testing.assert_array_equal(x, xs[rank])
            # Each of the <= p hops rounds a partial sum once to 16 bits.
            tol = (p + 1) * UNIT[fmt] * sumabs / scale + 1e-6
            err = np.abs(got.astype(np.float64) - exact / scale)
            assert np.all(err <= tol), f"{fmt} {op} n={n} prescale={prescale}: max err {err.max()}"
            assert_identical_everywhere(comm, got)


def test_fp16_prescale_avoids_overflow():
    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.full(10, 30000.0, np.float32)
    got = mpicoll.allreduce(x, compression=C.HalfPrecision("fp16", prescale=True))
    np.testing.assert_allclose(got, 30000.0 * p, rtol=p * 2.0 ** -11)
    if p >= 3:  # 90000 > 65504: without pre-division the 16-bit sum overflows
        assert np.all(np.isinf(mpicoll.allreduce(x, compression="fp16")))


def test_half_precision_moves_half_the_bytes():
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    st = state(comm)
    n = 70001
    x = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    fp16 = counting(st)
    C.run(fp16, x, np.empty_like(x), False, C.HalfPrecision("fp16"))
    if p == 1:
        assert fp16.sent == 0
        return
    ring = counting(st)
    get_algorithm("allreduce", "ring")(ring, x.copy(), _reduction("sum", dtypes.BY_NAME["float32"]))
    # The ring sends every block but its own (reduce-scatter) and every block
    # but its right neighbour's (allgather).
    size = [b - a for a, b in block_bounds(n, p)]
    assert ring.sent == 4 * ((n - size[rank]) + (n - size[(rank + 1) % p]))
    assert fp16.sent * 2 == ring.sent


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_topk_matches_local_reference_with_error_feedback(dtype):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    n, ratio = 5003, 0.01
    mine = C.TopK(ratio)
    shadows = [C.TopK(ratio) for _ in range(p)]  # every rank's compressor, replayed locally
    st = state(comm)
    for step in range(3):
        xs = inputs(n, p, dtype, seed=step + 1)
        cst = counting(st)
        got = np.empty(n, dtype)
        C.run(cst, xs[rank], got, False, mine)
        pairs = [s.select(xs[r]) for r, s in enumerate(shadows)]
        want = np.bincount(np.concatenate([i for i, _ in pairs]),
                           weights=np.concatenate([v for _, v in pairs]).astype(np.float64), minlength=n)
        np.testing.assert_array_equal(got, want.astype(dtype))
        np.testing.assert_array_equal(mine.residual, shadows[rank].residual)
        assert_identical_everywhere(comm, got)
        k = mine.k_for(n)
        assert cst.sent == (p - 1) * (8 * k + 8)


def test_topk_avg_and_public_entry():
    comm = MPI.COMM_WORLD
    p = comm.size
    x = np.arange(1, 101, dtype=np.float32) * (comm.rank + 1)
    got = mpicoll.allreduce(x, op="avg", compression="topk:0.05")  # the 5 largest: indices 95..99
    want = np.zeros(100, np.float64)
    want[95:] = np.arange(96, 101) * sum(range(1, p + 1)) / p
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert_identical_everywhere(comm, got)


def _at_offset(values, offset):
    """``values`` copied into a view that starts ``offset`` bytes into a byte
    buffer (misaligned for its element type when offset is not a multiple)."""
    raw = np.zeros(values.nbytes + 16, np.uint8)
    view = np.frombuffer(raw, values.dtype, count=values.size, offset=offset)
    view[...] = values
    return view


@pytest.mark.parametrize("offset", [1, 2, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_misaligned_views_match_an_aligned_copy(offset, dtype):
    """Input, output or both at a byte offset: the same bits as the same
    values in aligned arrays (the wire kernels get aligned scratch copies,
    never a misaligned typed pointer), for 16-bit formats and top-k."""
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    n = 3 * p + 1001
    x = inputs(n, p, dtype, seed=offset)[rank]
    for spec in ("fp16", C.HalfPrecision("bf16", prescale=True)):
        for op in ("sum", "avg"):
            want = mpicoll.allreduce(x.copy(), op=op, compression=spec)
            mis = _at_offset(x, offset)
            got = mpicoll.allreduce(mis, op=op, compression=spec)  # misaligned input
            assert got.tobytes() == want.tobytes(), (spec, op)
            out = _at_offset(np.zeros_like(x), offset)
            mpicoll.allreduce(x, op=op, compression=spec, out=out)  # misaligned output
            assert out.tobytes() == want.tobytes(), (spec, op)
            mpicoll.allreduce(mis, op=op, compression=spec, out=mis)  # both, in place
            assert mis.tobytes() == want.tobytes(), (spec, op)
            req = mpicoll.iallreduce(_at_offset(x, offset), op=op, compression=spec)
            assert req.wait().tobytes() == want.tobytes(), (spec, op)
    want = mpicoll.allreduce(x.copy(), compression=C.TopK(0.05))
    assert mpicoll.allreduce(_at_offset(x, offset), compression=C.TopK(0.05)).tobytes() == want.tobytes()
