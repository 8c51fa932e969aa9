"""Counting the bytes a rank sends: a communicator proxy for benchmarks and tests.

``counting(st)`` returns a stand-in for a ``CommState`` whose ``comm``
forwards every call to the real duplicate communicator and adds up the bytes
this rank hands to MPI to send:

* point-to-point sends (Send, Isend, Sendrecv): the buffer's bytes, exactly;
* native collectives cannot be looked into, so they are charged what a
  bandwidth-optimal algorithm sends per rank: Allgather (p-1) m,
  Allreduce 2 (p-1)/p m (m: this rank's buffer bytes). The report says so.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI


def _nbytes(spec) -> int:
    if isinstance(spec, (list, tuple)):
        spec = spec[0]
    if spec is MPI.IN_PLACE:
        return -1
    return np.asarray(spec).nbytes if not isinstance(spec, np.ndarray) else spec.nbytes


class CountingComm:
    def __init__(self, comm):
        self._comm = comm
        self.sent = 0
        self.size = comm.Get_size()

    def __getattr__(self, name):  # everything not counted goes straight through
        return getattr(self._comm, name)

    def Send(self, buf, dest, tag=0):
        self.sent += _nbytes(buf)
        return self._comm.Send(buf, dest, tag)

    def Isend(self, buf, dest, tag=0):
        self.sent += _nbytes(buf)
        return self._comm.Isend(buf, dest, tag)

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=MPI.ANY_SOURCE, recvtag=MPI.ANY_TAG,
                 status=None):
        self.sent += _nbytes(sendbuf)
        return self._comm.Sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, status)

    def Allgather(self, sendbuf, recvbuf):
        m = _nbytes(recvbuf) // self.size if sendbuf is MPI.IN_PLACE else _nbytes(sendbuf)
        self.sent += (self.size - 1) * m
        return self._comm.Allgather(sendbuf, recvbuf)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        m = _nbytes(recvbuf if sendbuf is MPI.IN_PLACE else sendbuf)
        self.sent += 2 * (self.size - 1) * m // self.size
        return self._comm.Allreduce(sendbuf, recvbuf, op)


class CountingState:
    """A CommState look-alike whose ``comm`` counts; scratch and caches are the real state's."""

    def __init__(self, st):
        self._st = st
        self.comm = CountingComm(st.comm)
        self.rank, self.size = st.rank, st.size

    def __getattr__(self, name):
        return getattr(self._st, name)

    @property
    def sent(self) -> int:
        return self.comm.sent


def counting(st) -> CountingState:
    return CountingState(st)
