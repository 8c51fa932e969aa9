"""GradientBucketer under mpiexec: fused buckets give every gradient the
sum/average, whatever order each rank marks its gradients in; compressed
buckets stay within their error bounds; every rank holds identical bits."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import assert_identical_everywhere

pytestmark = pytest.mark.mpi

SHAPES = [(3, 4), (5,), (0,), (100, 10), (7, 7, 7), (20000,), (2,), (1,), (33, 3)]


def grads_for(rank, step, dtypes):
    rng = np.random.default_rng([rank, step])
    out = []
    for shape, dt in zip(SHAPES, dtypes):
        if np.dtype(dt).kind == "i":
            out.append(rng.integers(-100, 100, shape).astype(dt))
        else:
            out.append(rng.standard_normal(shape).astype(dt))
    return out


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("registered", ["arrays", "views"])
def test_bucketed_allreduce_any_marking_order(op, registered):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    dtypes = [np.float32, np.float64, np.float32, np.float32, np.float64, np.float32, np.float32, np.float64,
              np.float32] if op == "avg" else [np.int32, np.float64, np.float32, np.int32, np.float64,
                                               np.float32, np.int64, np.int32, np.float32]
    mine = grads_for(rank, 0, dtypes)
    spec = mine if registered == "arrays" else [(g.shape, g.dtype) for g in mine]
    # Small caps: several buckets per dtype, so launch order matters.
    b = mpicoll.GradientBucketer(spec, comm=comm, op=op, bucket_bytes=2048, first_bucket_bytes=256)
    assert len(b.buckets) >= 4
    for step in range(3):
        mine = grads_for(rank, step, dtypes)
        # Each rank produces its gradients in a different order.
        order = np.random.default_rng([rank, step, 99]).permutation(len(SHAPES))
        for i in order:
            if registered == "arrays":
                spec[i][...] = mine[i]
                b.mark_ready(int(i))
            else:
                b.views[i][...] = mine[i]
                b.mark_ready(int(i))
        out = b.wait()
        everyone = [grads_for(r, step, dtypes) for r in range(p)]
        for i, got in enumerate(out):
            if registered == "arrays":
                assert got is spec[i]
            else:
                assert got is b.views[i]
            want = np.sum([e[i].astype(np.float64) for e in everyone], axis=0)
            if op == "avg":
                want = want / p
            if np.dtype(dtypes[i]).kind == "i":
                np.testing.assert_array_equal(got, want.astype(dtypes[i]))
            else:
                tol = 4 * p * np.finfo(dtypes[i]).eps
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
        assert_identical_everywhere(comm, *out)


@pytest.mark.parametrize("compression", ["fp16", "bf16", "topk:0.1"])
def test_compressed_buckets(compression):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    dtypes = [np.float32] * len(SHAPES)
    spec = [(s, np.float32) for s in SHAPES]
    b = mpicoll.GradientBucketer(spec, comm=comm, op="avg", bucket_bytes=4096, first_bucket_bytes=512,
                                 compression=compression)
    sent_total = {}
    for step in range(2):
        for i in reversed(range(len(SHAPES))):
            b.views[i][...] = grads_for(rank, step, dtypes)[i]
            b.mark_ready(i)
        out = b.wait()
        assert_identical_everywhere(comm, *out)
        everyone = [grads_for(r, step, dtypes) for r in range(p)]
        for i, got in enumerate(out):
            stack = np.array([e[i].astype(np.float64) for e in everyone])
            want = stack.sum(axis=0) / p
            if compression == "topk:0.1":
                sent_total[i] = sent_total.get(i, 0) + np.count_nonzero(got)
                continue
            unit = 2.0 ** -11 if compression == "fp16" else 2.0 ** -8
            tol = (p + 1) * unit * np.abs(stack).sum(axis=0) / p + 1e-6
            assert np.all(np.abs(got - want) <= tol)
    if compression == "topk:0.1":
        # One residual per bucket: each bucket sends about 10% of its entries per rank.
        total = sum(int(np.prod(s)) for s in SHAPES)
        assert 0 < sum(sent_total.values()) <= 2 * p * int(np.ceil(0.1 * total)) + 2 * len(b.buckets) * p
