"""Shared test helpers.

MPI tests carry ``@pytest.mark.mpi`` and run under mpiexec with
``--with-mpi`` (``make test`` does this at several process counts); a plain
``pytest`` run skips them and runs the serial tests (kernels, selection).

Inputs are generated from (seed, rank), so every rank can recompute every
other rank's input and build the exact reference locally with numpy.
"""
from __future__ import annotations

import numpy as np
import pytest

from mpicoll import dtypes as _dtypes

ALL_DTYPES = _dtypes.names()
INT_DTYPES = [d.name for d in _dtypes.ALL if not d.is_float]
FLOAT_DTYPES = [d.name for d in _dtypes.ALL if d.is_float]


def np_dtype(name):
    """numpy dtype used to hold values of ``name`` in references (bf16 -> ml_dtypes)."""
    if name == "bfloat16":
        bf16 = _dtypes.bfloat16_numpy()
        if bf16 is None:
            pytest.skip("ml_dtypes not installed")
        return bf16
    return np.dtype(name)


def exact_values(name, op, n, seed):
    """Values for which every reduction order gives the same exact result:
    small integers (sums of up to 16 stay exact in float16/bfloat16) and,
    for prod, powers of two (-2, -1, 1, 2, 0.5)."""
    rng = np.random.default_rng(seed)
    dt = np_dtype(name)
    if op == "prod":
        choices = [-1, 1, 2] if dt.kind in "iu" or name in INT_DTYPES else [-2.0, -1.0, 0.5, 1.0, 2.0]
        if np.dtype(dt).kind == "u":
            choices = [1, 2, 3]
        vals = rng.choice(choices, n)
    elif np.dtype(dt).kind == "u":
        vals = rng.integers(0, 8, n)
    else:
        vals = rng.integers(-8, 8, n)
    return vals.astype(dt)


NUMPY_OPS = {
    "sum": np.add,
    "prod": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
    "land": lambda a, b: np.logical_and(a, b).astype(a.dtype),
    "lor": lambda a, b: np.logical_or(a, b).astype(a.dtype),
    "lxor": lambda a, b: np.logical_xor(a, b).astype(a.dtype),
}


def ops_for(name):
    from mpicoll import ops

    return [o.name for o in ops.ALL if (name in FLOAT_DTYPES) == ("float" in o.kinds) or
            ("int" in o.kinds and name in INT_DTYPES)]


def reference(inputs, op, size):
    """Rank-ordered serial reduction with numpy (with an errstate that
    tolerates integer wraparound)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if op == "avg":
            acc = inputs[0].copy()
            for x in inputs[1:]:
                acc = np.add(acc, x)
            return (acc / np.asarray(size, acc.dtype)).astype(acc.dtype)
        fn = NUMPY_OPS[op]
        acc = inputs[0].copy()
        for x in inputs[1:]:
            acc = fn(acc, x)
        return acc


def assert_identical_everywhere(comm, *arrays, what=""):
    """Every rank of ``comm`` holds the same bits in ``arrays`` (collective:
    call it on every rank, in the same order). Compares sha256 digests, and
    names the ranks that differ from rank 0."""
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    digests = comm.allgather(h.hexdigest())
    odd = [r for r, d in enumerate(digests) if d != digests[0]]
    assert not odd, f"ranks {odd} hold different bits from rank 0{': ' + what if what else ''}"


class IdenticalEverywhere:
    """``assert_identical_everywhere`` for a loop of cases, with one
    collective call instead of one per case: ``add()`` records each case's
    digest locally, ``check()`` (collective: every rank, after the same
    ``add()`` calls) compares them all in one allgather and names the first
    case whose bits differ between ranks. At 8 ranks on 2 cores an allgather
    costs about as much as the small all-reduce it checks."""

    def __init__(self, comm):
        self.comm = comm
        self.digests = []
        self.labels = []

    def add(self, *arrays, what=""):
        import hashlib

        h = hashlib.sha256()
        for a in arrays:
            h.update(np.ascontiguousarray(a).tobytes())
        self.digests.append(h.digest())
        self.labels.append(what)

    def check(self):
        mine, labels = self.digests, self.labels
        self.digests, self.labels = [], []
        everyone = self.comm.allgather(mine)
        assert all(len(d) == len(mine) for d in everyone), f"ranks recorded {[len(d) for d in everyone]} cases"
        for i, what in enumerate(labels):
            odd = [r for r, d in enumerate(everyone) if d[i] != everyone[0][i]]
            assert not odd, f"ranks {odd} hold different bits from rank 0{': ' + what if what else ''}"


# ---- shared by the plan-cache tests (test_plan_cache.py, test_dropin_kept.py) ----

@pytest.fixture(params=["native", "mpi4py"])
def kept_calls(request):
    """Each kept-plan test twice: kept calls of the MPI library's collectives
    made from C (mpicoll/native.py, where built) and through mpi4py. Every
    communicator's kept plans are dropped before and after, so each run
    keeps its own."""
    from mpicoll import native
    from mpicoll.commstate import _by_handle

    def drop():
        for st in list(_by_handle.values()):
            st.plans.clear()

    if request.param == "native" and not native.available():
        pytest.skip("mpicoll._native_* is not built for this MPI library")
    was = native.enabled()
    native.set_enabled(request.param == "native")
    drop()
    yield request.param
    native.set_enabled(was)
    drop()


@pytest.fixture
def comm():
    """A private duplicate of COMM_WORLD, freed after the test."""
    from mpi4py import MPI

    c = MPI.COMM_WORLD.Dup()
    yield c
    c.Free()


@pytest.fixture
def builds(monkeypatch):
    """Counts of full-path plan builds per collective (a kept plan builds none)."""
    from mpicoll import plan as _plan

    counts = {}
    for name in ("allreduce", "bcast", "reduce", "allgather", "scatter", "gather", "alltoall", "reduce_scatter",
                 "allgatherv", "alltoallv"):
        real = getattr(_plan, name)

        def counting(*args, _real=real, _name=name, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _real(*args, **kw)
        monkeypatch.setattr(_plan, name, counting)
    return counts


def pytest_ignore_collect(collection_path, config):
    """Under ``mpiexec -n P pytest --with-mpi -m mpi`` (make test-mpi) only
    the files that hold MPI tests are collected: every rank of every process
    count would otherwise import the serial-only files (ml_dtypes, the
    simulators, ...) only to deselect all of their tests. A file holds MPI
    tests when it says ``pytest.mark.mpi`` (on a test or as ``pytestmark``)."""
    if not (config.getoption("with_mpi", False) and config.getoption("markexpr", "") == "mpi"):
        return None
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if "pytest.mark.mpi" not in collection_path.read_text():
            return True
    return None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "waits: the test spends most of its time waiting for a deadline to fire, not computing "
        "(spread through the run so that xdist workers overlap it with tests that compute)")


def pytest_collection_modifyitems(config, items):
    """Spread the ``waits`` tests evenly through the run, keeping each
    group's own order. Much of the serial suite's wall time is these tests
    sleeping while an mpiexec job's deadline runs out (test_deadline_state,
    test_timeout, test_torch_timeout: ~210 s of waiting), and most of its
    CPU time is a few simulation-heavy files. In file order nearly half of
    the waiting came last, so the xdist workers first computed with 2 cores
    saturated and then sat idle together; mixed, one worker waits while
    another computes. Only in xdist's workers (they all collect the same
    order, which the controller requires); a single process keeps the file
    order."""
    if not hasattr(config, "workerinput"):
        return
    waits = [it.get_closest_marker("waits") is not None for it in items]
    groups = [[i for i, w in enumerate(waits) if w == g] for g in (True, False)]
    if not all(groups):
        return
    # Each test's place within its own group, as a fraction of the group: a
    # stable sort on it interleaves the two groups evenly, each in its order.
    place = {}
    for members in groups:
        for j, i in enumerate(members):
            place[i] = j / len(members)
    items[:] = [items[i] for i in sorted(range(len(items)), key=place.__getitem__)]
