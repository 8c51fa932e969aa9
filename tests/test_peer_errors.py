"""The receive-size check tells a truncated message (an argument mismatch)
from any other MPI error of a message (a dead peer, a broken connection).

Unit level: the drivers' completion calls are replaced by ones that fail
the way MPI does (MPI_ERR_IN_STATUS with the error in each status), on
mpicoll's state of MPI.COMM_SELF, so no process has to die. Both drivers
share ``schedule.receive_error``; each is driven once.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpicoll import engine
from mpicoll import schedule as sched
from mpicoll.commstate import state
from mpicoll.errors import MismatchError, PeerFailure


def _ctx():
    return sched.Context(state(MPI.COMM_SELF), 7, {}, ("allreduce", "ring", 64, 0))


def _ops(ctx):
    # A receive and a send: the shape of every ring/tree step.
    return [ctx.recv(np.zeros(16, np.uint8), 3), ctx.send(np.zeros(16, np.uint8), 5)]


def _failing_wait(codes):
    """A Waitall/Testall that fails with MPI_ERR_IN_STATUS, ``codes`` being
    the error code of each request's status."""
    def wait(reqs, statuses=None):
        for s, c in zip(statuses, codes):
            s.Set_error(c)
        raise MPI.Exception(MPI.ERR_IN_STATUS)
    return wait


class _Req:
    """Stands for a posted request: the faked Waitall never looks at it."""


class _MPI:
    """mpi4py's MPI module with its Request class replaced (mpi4py's types
    are immutable, so the driver modules get this stand-in instead)."""

    def __init__(self, **request):
        self.Request = type("Request", (), {k: staticmethod(v) for k, v in request.items()})

    def __getattr__(self, name):
        return getattr(MPI, name)


def _error(ops, codes):
    statuses = [MPI.Status() for _ in ops]
    for s, c in zip(statuses, codes):
        s.Set_error(c)
    return sched.receive_error(ops, MPI.Exception(MPI.ERR_IN_STATUS), statuses)


def test_truncated_receive_is_a_mismatch():
    ops = _ops(_ctx())
    err = _error(ops, [MPI.ERR_TRUNCATE, MPI.SUCCESS])
    assert isinstance(err, MismatchError)
    assert "truncated" in str(err) and "rank 3" in str(err)


@pytest.mark.parametrize("code", [MPI.ERR_OTHER, MPI.ERR_INTERN, getattr(MPI, "ERR_PROC_FAILED", MPI.ERR_OTHER)])
def test_failed_receive_is_a_peer_failure(code):
    ops = _ops(_ctx())
    err = _error(ops, [code, MPI.ERR_PENDING])
    assert isinstance(err, PeerFailure) and not isinstance(err, MismatchError)
    assert err.peers == [3] and err.error_class == MPI.Get_error_class(code)
    assert "truncated" not in str(err) and "rank(s) 3" in str(err)


def test_failed_send_names_its_peer():
    ops = _ops(_ctx())
    err = _error(ops, [MPI.SUCCESS, MPI.ERR_OTHER])
    assert isinstance(err, PeerFailure) and err.peers == [5]


def test_single_wait_error_class():
    """MPI_Wait (one request) reports the class itself, no ERR_IN_STATUS."""
    ctx = _ctx()
    op = ctx.recv(np.zeros(4, np.uint8), 2)
    assert isinstance(sched.receive_error([op], MPI.Exception(MPI.ERR_TRUNCATE)), MismatchError)
    err = sched.receive_error([op], MPI.Exception(MPI.ERR_OTHER))
    assert isinstance(err, PeerFailure) and err.peers == [2]


def test_blocking_driver_reports_peer_failure(monkeypatch):
    ctx = _ctx()
    ops = _ops(ctx)
    for op in ops:
        op.req = _Req()
    monkeypatch.setattr(sched, "MPI", _MPI(Waitall=_failing_wait([MPI.ERR_OTHER, MPI.ERR_PENDING])))
    with pytest.raises(PeerFailure) as info:
        sched.wait_ops(ops)
    assert info.value.peers == [3]
    assert isinstance(info.value.__cause__, MPI.Exception)


def test_blocking_driver_reports_truncation(monkeypatch):
    ops = _ops(_ctx())
    for op in ops:
        op.req = _Req()
    monkeypatch.setattr(sched, "MPI", _MPI(Waitall=_failing_wait([MPI.ERR_TRUNCATE, MPI.SUCCESS])))
    with pytest.raises(MismatchError, match="truncated"):
        sched.wait_ops(ops)


def test_nonblocking_driver_reports_peer_failure(monkeypatch):
    ctx = _ctx()

    def schedule():
        ops = _ops(ctx)
        for op in ops:
            op.req = _Req()
        yield ops

    monkeypatch.setattr(engine, "MPI", _MPI(Testall=_failing_wait([MPI.ERR_OTHER, MPI.SUCCESS])))
    req = engine.start(schedule(), None, None, None, 64)
    with pytest.raises(PeerFailure) as info:
        req.wait()
    assert info.value.peers == [3]
