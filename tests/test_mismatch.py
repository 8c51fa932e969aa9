"""Ranks that disagree: with the pre-flight check on, every rank raises the
same MismatchError naming the field and the ranks; the receive-size checks
catch short and long messages; the communicator stays usable afterwards.
Run under mpiexec (``make test``); most cases need p >= 2."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpicoll
from mpicoll import schedule
from mpicoll.commstate import state

pytestmark = pytest.mark.mpi

comm = MPI.COMM_WORLD
needs2 = pytest.mark.skipif(comm.size < 2, reason="a mismatch needs two ranks")
LAST = comm.size - 1


def odd_one(normal, different):
    """``different`` on the last rank, ``normal`` elsewhere."""
    return different if comm.rank == LAST else normal


def expect_mismatch(fn, field):
    """fn() raises MismatchError on every rank, with the same message, naming
    ``field`` and the last rank; then the communicator still works."""
    with pytest.raises(mpicoll.MismatchError) as info:
        fn()
    err = info.value
    assert isinstance(err, ValueError)
    assert err.field == field, str(err)
    assert f"{field} differs" in str(err)
    assert any(LAST in ranks for ranks in err.values.values())
    messages = comm.allgather(str(err))
    assert all(m == messages[0] for m in messages), "ranks raised different errors"
    # nothing is left half-sent: a correct call right after works
    y = mpicoll.allreduce(np.ones(5, np.int32), comm=comm, check=True)
    assert (y == comm.size).all()


@needs2
@pytest.mark.parametrize("algorithm", mpicoll.algorithms("allreduce"))
def test_allreduce_count(algorithm):
    x = np.ones(odd_one(1000, 999), np.float32)
    expect_mismatch(lambda: mpicoll.allreduce(x, comm=comm, algorithm=algorithm, check=True), "count")


@needs2
def test_allreduce_dtype_op_algorithm():
    expect_mismatch(lambda: mpicoll.allreduce(np.ones(8, odd_one(np.float32, np.int32)), comm=comm, check=True),
                    "dtype")
    expect_mismatch(lambda: mpicoll.allreduce(np.ones(8), op=odd_one("sum", "max"), comm=comm, check=True), "op")
    expect_mismatch(lambda: mpicoll.allreduce(np.ones(8), algorithm=odd_one("ring", "tree"), comm=comm,
                                              check=True), "algorithm")
    # float16 and bfloat16 share uint16 storage: still a different dtype
    bits = np.zeros(8, np.uint16)
    expect_mismatch(lambda: mpicoll.allreduce(bits, dtype=odd_one("float16", "bfloat16"), comm=comm,
                                              check=True), "dtype")


@needs2
def test_other_collectives():
    expect_mismatch(lambda: mpicoll.bcast(np.zeros(4), root=odd_one(0, 1), comm=comm, check=True), "root")
    expect_mismatch(lambda: mpicoll.bcast(np.zeros(odd_one(4, 5)), comm=comm, check=True), "count")
    expect_mismatch(lambda: mpicoll.reduce(np.ones(4), root=odd_one(0, 1), comm=comm, check=True), "root")
    expect_mismatch(lambda: mpicoll.allgather(np.zeros(odd_one(3, 4), np.int8), comm=comm, check=True), "count")
    expect_mismatch(lambda: mpicoll.allgather(np.zeros((2, 3) if comm.rank != LAST else (3, 2)), comm=comm,
                                              check=True), "dtype")
    p = comm.size
    counts = [1] * p
    counts[0] += 1
    if comm.rank == LAST:
        counts = counts[::-1]
    if counts[0] != counts[-1] or p > 2:
        expect_mismatch(lambda: mpicoll.reduce_scatter(np.ones(p + 1), counts=counts, comm=comm, check=True),
                        "counts")


@needs2
def test_different_collectives():
    def call():
        if comm.rank == LAST:
            mpicoll.bcast(np.zeros(4), comm=comm, check=True)
        else:
            mpicoll.allreduce(np.zeros(4), comm=comm, check=True)
    expect_mismatch(call, "collective")


@needs2
def test_env_switch(monkeypatch):
    monkeypatch.setenv("MPICOLL_CHECK", "1")
    x = np.ones(odd_one(10, 11), np.int64)
    expect_mismatch(lambda: mpicoll.allreduce(x, comm=comm), "count")
    monkeypatch.setenv("MPICOLL_CHECK", "maybe")
    with pytest.raises(ValueError, match="MPICOLL_CHECK"):
        mpicoll.allreduce(np.ones(3), comm=comm)


def test_check_argument_and_agreeing_calls():
    with pytest.raises(TypeError, match="check"):
        mpicoll.allreduce(np.ones(3), comm=comm, check="yes")
    for n in (0, 1, 1001):  # agreeing calls pass the check and give the right answer
        y = mpicoll.allreduce(np.full(n, 2, np.int32), comm=comm, check=True)
        assert (y == 2 * comm.size).all()
    assert (mpicoll.reduce_scatter(np.ones(7), comm=comm, check=True) == comm.size).all()
    assert mpicoll.allgather(np.arange(3), comm=comm, check=True).shape == (comm.size, 3)


@needs2
@pytest.mark.parametrize("driver", ["blocking", "nonblocking"])
@pytest.mark.parametrize("extra", [-3, 3])
def test_receive_size_check(extra, driver):
    """The always-on check of both drivers: a short message and a long
    (truncated) one both raise MismatchError on the receiving rank; the
    sender is unaffected.

    Each rank records what its calls raised and the verdicts are compared
    after an allgather: a rank whose check failed to raise (or raised
    something else) must fail the test, not leave the other rank waiting
    in a barrier - without the nonblocking driver's size check the old
    form of this test hung instead of failing."""
    from mpicoll import engine

    st = state(comm)

    def run(tag, *make):  # one batch of the driver's operations
        ctx = schedule.Context(st, tag, {})

        def gen():
            yield [m(ctx) for m in make]

        if driver == "blocking":
            schedule.run(gen())
        else:
            engine.start(gen()).wait()

    def outcome(tag, *make):
        """None, or (exception class, message): reported, never raised."""
        try:
            run(tag, *make)
        except Exception as exc:
            return "MismatchError" if isinstance(exc, mpicoll.MismatchError) else type(exc).__name__, str(exc)
        return None

    got = [None, None]
    if comm.rank == 1:
        got[0] = outcome(30001, lambda c: c.recv(np.zeros(8, np.uint8), 0))
    elif comm.rank == 0:
        got[0] = outcome(30001, lambda c: c.send(np.zeros(8 + extra, np.uint8), 1))
    if comm.rank in (0, 1):
        other = 1 - comm.rank
        recvbuf = np.zeros(8, np.uint8)
        sendbuf = np.zeros(8 + (extra if comm.rank == 0 else 0), np.uint8)
        got[1] = outcome(30002, lambda c: c.recv(recvbuf, other), lambda c: c.send(sendbuf, other))
    verdicts = comm.allgather(got)
    assert verdicts[0] == [None, None], f"the sender: {verdicts[0]}"
    (cls0, msg0), (cls1, msg1) = (v or (None, "") for v in verdicts[1])
    assert cls0 == "MismatchError" and "expected 8 bytes from rank 0" in msg0, verdicts[1]
    assert cls1 == "MismatchError" and "disagree" in msg1, verdicts[1]
    assert all(v == [None, None] for v in verdicts[2:]), verdicts
