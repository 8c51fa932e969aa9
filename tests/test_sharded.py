"""ShardedOptimizer under mpiexec: reduce-scatter + shard update + all-gather
gives the unsharded bucketed all-reduce's result (bit for bit with the ring,
to rounding otherwise), identical bits on every rank, and ~1/p of the
optimizer state per rank."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import assert_identical_everywhere

pytestmark = pytest.mark.mpi

# Mixed dtypes and sizes, several buckets at these caps; every bucket has >= 8 elements.
SHAPES = [(3, 4), (9,), (0,), (100, 10), (7, 7, 7), (2000,), (2,), (11,), (33, 3)]
DTYPES = [np.float32, np.float64, np.float32, np.float32, np.float64, np.float32, np.float32, np.float64,
          np.float32]
CAPS = dict(bucket_bytes=2048, first_bucket_bytes=256)


def initial():
    rng = np.random.default_rng(7)
    return [rng.standard_normal(s).astype(d) for s, d in zip(SHAPES, DTYPES)]


def grads_for(rank, step):
    rng = np.random.default_rng([rank, step])
    return [rng.standard_normal(s).astype(d) for s, d in zip(SHAPES, DTYPES)]


def adam(w, g, state):
    """Adam with decoupled weight decay: elementwise, with a step counter in the state."""
    state["t"] += 1
    t = float(state["t"][0])
    m, v = state["m"], state["v"]
    m *= 0.9
    m += 0.1 * g
    v *= 0.999
    v += 0.001 * g * g
    w -= 0.01 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8) + 0.001 * w


def adam_state(w):
    return {"m": np.zeros_like(w), "v": np.zeros_like(w), "t": np.zeros(1, np.int64)}


def unsharded(comm, steps, algorithm, op="avg"):
    """The reference: bucketed all-reduce, then the same update on each whole bucket."""
    params = initial()
    b = mpicoll.GradientBucketer([(w.shape, w.dtype) for w in params], comm=comm, op=op, algorithm=algorithm,
                                 **CAPS)
    # Per-parameter state: for an elementwise step the same as per bucket (the counters agree).
    states = [adam_state(w.reshape(-1)) for w in params]
    for step in range(steps):
        g = grads_for(comm.rank, step)
        for i in reversed(range(len(params))):
            b.views[i][...] = g[i]
            b.mark_ready(i)
        out = b.wait()
        for w, gi, st in zip(params, out, states):
            adam(w.reshape(-1), gi.reshape(-1), st)
    return params, b


def sharded(comm, steps, algorithm, op="avg", order_seed=None):
    opt = mpicoll.ShardedOptimizer(initial(), adam, init_state=adam_state, comm=comm, op=op,
                                   algorithm=algorithm, **CAPS)
    for step in range(steps):
        opt.wait_params()
        g = grads_for(comm.rank, step)
        order = range(len(SHAPES) - 1, -1, -1) if order_seed is None else \
            np.random.default_rng([comm.rank, step, order_seed]).permutation(len(SHAPES))
        for i in order:
            opt.grads[i][...] = g[i]
            opt.mark_ready(int(i))
        opt.step()
    opt.wait_params()
    return opt


@pytest.mark.parametrize("op", ["avg", "sum"])
def test_ring_sharded_is_bit_identical_to_unsharded(op):
    comm = MPI.COMM_WORLD
    ref, bucketer = unsharded(comm, 4, "ring", op)
    opt = sharded(comm, 4, "ring", op, order_seed=3)  # any marking order per rank
    assert opt.buckets == bucketer.buckets
    assert min(n // np.dtype(DTYPES[b[0]]).itemsize for b, n in zip(bucketer.buckets, bucketer.bucket_nbytes())) \
        >= comm.size
    for i, (got, want) in enumerate(zip(opt.params, ref)):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert np.array_equal(got, want), f"parameter {i} differs from the unsharded path"
    assert_identical_everywhere(comm, *opt.params)


@pytest.mark.parametrize("algorithm", ["auto", "mpi"])
def test_other_algorithms_match_to_rounding(algorithm):
    comm = MPI.COMM_WORLD
    ref, _ = unsharded(comm, 3, algorithm)
    opt = sharded(comm, 3, algorithm)
    for got, want in zip(opt.params, ref):
        np.testing.assert_allclose(got, want, rtol=1e-5 if got.dtype == np.float32 else 1e-12, atol=1e-6)
    assert_identical_everywhere(comm, *opt.params)


def test_state_is_one_pth():
    comm = MPI.COMM_WORLD
    p = comm.size
    opt = sharded(comm, 1, "auto")
    total = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in zip(SHAPES, DTYPES))
    mine = opt.state_nbytes()
    counters = 8 * len(opt.buckets)  # one int64 step counter per bucket
    per_rank = comm.allgather(mine - counters)
    assert sum(per_rank) == 2 * total  # m and v: every element's state on exactly one rank
    # array_split blocks: at most one element per bucket over an even share.
    slack = 2 * 8 * len(opt.buckets)
    assert max(per_rank) <= 2 * total / p + slack
    for (lo, hi), b in zip(opt.shard_bounds(), opt.state()):
        assert b["m"].size == hi - lo


def test_forward_waits_per_bucket():
    """wait_params(i) finishes only what i needs; the other buckets complete later, same result."""
    comm = MPI.COMM_WORLD
    ref, _ = unsharded(comm, 2, "ring")
    opt = mpicoll.ShardedOptimizer(initial(), adam, init_state=adam_state, comm=comm, algorithm="ring", **CAPS)
    for step in range(2):
        # forward order: first parameters first
        for i in range(len(SHAPES)):
            opt.wait_params(i)
        g = grads_for(comm.rank, step)
        for i in reversed(range(len(SHAPES))):
            opt.grads[i][...] = g[i]
            opt.mark_ready(i)
        opt.step()
    first = next(b for b in opt.buckets if 0 in b)
    opt.wait_params([0])
    for i in first:
        assert np.array_equal(opt.params[i], ref[i])
    opt.wait_params()
    for got, want in zip(opt.params, ref):
        assert np.array_equal(got, want)


def test_rank0_parameters_are_broadcast_and_errors():
    comm = MPI.COMM_WORLD
    mine = [np.full(10, float(comm.rank), np.float32)]
    opt = mpicoll.ShardedOptimizer(mine, lambda w, g, s: None, comm=comm)
    assert np.all(opt.params[0] == 0.0)
    assert opt.state_nbytes() == 0
    with pytest.raises(TypeError):
        mpicoll.ShardedOptimizer(mine, None, comm=comm)


def test_training_example_sharded_equals_allreduce():
    ex = load_example()
    comm = MPI.COMM_WORLD
    data = ex.load_data()
    kw = dict(hidden=(32,), epochs=1, batch=128, lr=0.1, bucket_bytes=4096, first_bucket_bytes=1024,
              algorithm="ring")
    ref, ref_hist, _ = ex.train(comm, data, **kw)
    params, hist, opt = ex.train(comm, data, sharded=True, **kw)
    assert all(np.array_equal(a, b) for a, b in zip(params, ref))
    assert hist[-1]["test_acc"] == ref_hist[-1]["test_acc"]
    assert hist[-1]["state_bytes"] <= ref_hist[-1]["state_bytes"] / comm.size + 4 * 8 * len(opt.buckets)


def load_example():
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("scikit-learn not installed (the example's data set)")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_data_parallel.py")
    spec = importlib.util.spec_from_file_location("train_data_parallel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reproducible_sharded_is_the_rank_ordered_sum():
    """reproducible=True: bit-identical to the reproducible bucketed all-reduce, and the
    shards' "sum" is numpy's serial rank-ordered sum, whatever p is."""
    comm = MPI.COMM_WORLD
    p = comm.size
    params = initial()
    b = mpicoll.GradientBucketer([(w.shape, w.dtype) for w in params], comm=comm, op="avg", reproducible=True,
                                 **CAPS)
    states = [adam_state(w.reshape(-1)) for w in params]
    opt = mpicoll.ShardedOptimizer(initial(), adam, init_state=adam_state, comm=comm, reproducible=True, **CAPS)
    for step in range(3):
        g = grads_for(comm.rank, step)
        opt.wait_params()
        for i in reversed(range(len(params))):
            b.views[i][...] = g[i]
            b.mark_ready(i)
            opt.grads[i][...] = g[i]
            opt.mark_ready(i)
        for w, gi, st in zip(params, b.wait(), states):
            adam(w.reshape(-1), gi.reshape(-1), st)
        opt.step()
    opt.wait_params()
    for got, want in zip(opt.params, params):
        assert np.array_equal(got, want)
    assert_identical_everywhere(comm, *opt.params)
    # The sum itself: numpy's ((g0 + g1) + g2) ..., element by element.
    seen = []
    summ = mpicoll.ShardedOptimizer(initial(), lambda w, g, s: seen.append(g.copy()), comm=comm, op="sum",
                                    reproducible=True, **CAPS)
    g = grads_for(comm.rank, 0)
    for i in reversed(range(len(SHAPES))):
        summ.grads[i][...] = g[i]
        summ.mark_ready(i)
    summ.step()
    summ.wait_params()
    everyone = [grads_for(r, 0) for r in range(p)]
    for k, (bucket, (lo, hi)) in enumerate(zip(summ.buckets, summ.shard_bounds())):
        flat = [np.concatenate([e[i].reshape(-1) for i in bucket]) for e in everyone]
        acc = flat[0].copy()
        for x in flat[1:]:
            acc += x
        assert np.array_equal(seen[len(seen) - 1 - k], acc[lo:hi])  # step() visits buckets last first
