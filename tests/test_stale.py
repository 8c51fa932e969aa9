"""StaleAllreduce under mpiexec: staleness 0 is the synchronous all-reduce,
staleness k hands out step t-k's result at step t on every rank, whatever
the ranks' timing, and replicas trained with it stay bit-identical."""
from __future__ import annotations

import time

import importlib.util
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from conftest import assert_identical_everywhere

pytestmark = pytest.mark.mpi

N = 1000


def grad(rank, t):
    # Small integers in float64: every order of addition gives the exact sum.
    return np.random.default_rng([rank, t]).integers(-50, 50, N).astype(np.float64)


def exact_sum(p, t):
    return np.sum([grad(r, t) for r in range(p)], axis=0)


def test_staleness_zero_is_synchronous():
    comm = MPI.COMM_WORLD
    s = mpicoll.StaleAllreduce(N, np.float32, staleness=0, comm=comm, op="avg", algorithm="ring")
    for t in range(4):
        g = np.random.default_rng([comm.rank, t]).standard_normal(N).astype(np.float32)
        got = s.step(g)
        want = mpicoll.allreduce(g, op="avg", comm=comm, algorithm="ring")
        assert np.array_equal(got, want)
        assert s.in_flight == 0
    assert s.drain() == []


@pytest.mark.parametrize("k", [1, 2, 3])
def test_step_t_applies_step_t_minus_k(k):
    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    s = mpicoll.StaleAllreduce((N,), np.float64, staleness=k, comm=comm, op="sum")
    steps = 7
    jitter = np.random.default_rng([rank, k, 5])
    for t in range(steps):
        if jitter.random() < 0.3:  # uneven timing across ranks must not change what is returned
            time.sleep(0.002)
        got = s.step(grad(rank, t))
        if t < k:
            assert got is None
        else:
            np.testing.assert_array_equal(got, exact_sum(p, t - k))
        assert s.in_flight == min(t + 1, k)
    rest = s.drain()
    assert len(rest) == min(k, steps)
    for j, got in enumerate(rest):
        np.testing.assert_array_equal(got, exact_sum(p, steps - len(rest) + j))
    assert s.in_flight == 0


@pytest.mark.parametrize("k", [0, 1, 2])
def test_replicas_stay_identical(k):
    """SGD on a least-squares problem, each rank its own data: same bits everywhere."""
    comm = MPI.COMM_WORLD
    rank = comm.rank
    rng = np.random.default_rng(rank)
    a = rng.standard_normal((64, 16)).astype(np.float32)
    y = a @ np.arange(16, dtype=np.float32)
    w = np.zeros(16, np.float32)
    s = mpicoll.StaleAllreduce(w.shape, w.dtype, staleness=k, comm=comm)
    losses = []
    for t in range(40):
        if rank == 0 and t % 5 == 0:
            time.sleep(0.001)
        r = a @ w - y
        losses.append(float(r @ r))
        avg = s.step(a.T @ r / len(y))
        if avg is not None:
            w -= 0.01 * avg
    s.drain()
    assert_identical_everywhere(comm, w)
    assert losses[-1] < losses[0]


def test_bad_staleness():
    with pytest.raises(ValueError):
        mpicoll.StaleAllreduce(4, staleness=-1)
    with pytest.raises(ValueError):
        mpicoll.StaleAllreduce(4, staleness=1.5)


def test_training_example_with_staleness():
    ex = load_example()
    comm = MPI.COMM_WORLD
    data = ex.load_data()
    kw = dict(hidden=(32,), epochs=2, batch=128, lr=0.05, momentum=0.0)
    params, hist, s = ex.train(comm, data, staleness=1, slow_rank=comm.size - 1, slow_ms=1.0, **kw)
    assert_identical_everywhere(comm, *params)
    assert hist[-1]["loss"] < hist[0]["loss"]


def load_example():
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("scikit-learn not installed (the example's data set)")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples", "train_data_parallel.py")
    spec = importlib.util.spec_from_file_location("train_data_parallel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
