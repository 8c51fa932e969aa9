"""Building blocks shared by the algorithms: block partitions, the
non-power-of-two fold, and typed point-to-point helpers.

Messages are sent as raw bytes (``MPI.BYTE``): algorithms move storage
arrays whose real element type only the kernels need to know (float16 and
bfloat16 have no MPI datatype).
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..check import is_truncation, size_mismatch

BYTE = MPI.BYTE

# One tag per collective, on mpicoll's private duplicate communicator.
# Blocking collectives run one at a time per communicator, and MPI never
# reorders messages between one pair of ranks with one tag, so a fixed tag
# per collective is enough to keep consecutive calls apart.
TAG_ALLREDUCE = 11
TAG_REDUCE_SCATTER = 12
TAG_ALLGATHER = 13
TAG_BCAST = 14
TAG_REDUCE = 15
TAG_FOLD = 16


def block_bounds(n: int, p: int) -> list:
    """[(start, stop)] of ``p`` blocks of ``n`` elements, np.array_split's
    convention: the first ``n % p`` blocks hold one element more."""
    q, r = divmod(n, p)
    bounds = []
    start = 0
    for i in range(p):
        stop = start + q + (1 if i < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def split_range(start: int, stop: int, pieces: int) -> list:
    """[start, stop) cut into ``pieces`` ranges by block_bounds' convention
    (pipeline segments of one block: sender and receiver cut a block the
    same way as long as ``pieces`` is the same on both)."""
    return [(start + a, start + b) for a, b in block_bounds(stop - start, pieces)]


def counts_to_bounds(counts) -> list:
    bounds = []
    start = 0
    for c in counts:
        bounds.append((start, start + c))
        start += c
    return bounds


def send(comm, buf: np.ndarray, dest: int, tag: int) -> None:
    comm.Send([buf, BYTE], dest, tag)


def _exact(comm, call, expected: int, source: int) -> None:
    """Run ``call(status)`` (a blocking receive of ``expected`` bytes) and
    raise MismatchError unless exactly that many arrived: MPI reports a
    longer message as MPI_ERR_TRUNCATE and a shorter one not at all."""
    status = MPI.Status()
    try:
        call(status)
    except MPI.Exception as exc:
        if is_truncation(exc):
            raise size_mismatch(comm, expected, -1, source) from exc
        raise
    got = status.Get_count(BYTE)
    if got != expected:
        raise size_mismatch(comm, expected, got, source)


def recv(comm, buf: np.ndarray, source: int, tag: int) -> None:
    """Receive exactly ``buf.nbytes`` bytes from ``source``."""
    _exact(comm, lambda status: comm.Recv([buf, BYTE], source, tag, status), buf.nbytes, source)


def sendrecv(comm, sendbuf: np.ndarray, dest: int, recvbuf: np.ndarray, source: int, tag: int) -> None:
    """Send ``sendbuf`` to ``dest`` while receiving exactly ``recvbuf.nbytes`` bytes from ``source``."""
    _exact(comm, lambda status: comm.Sendrecv([sendbuf, BYTE], dest, tag, [recvbuf, BYTE], source, tag, status),
           recvbuf.nbytes, source)


def scratch_like(st, name: str, n: int, dtype: np.dtype) -> np.ndarray:
    """A reusable temporary of ``n`` elements of ``dtype`` (see CommState.scratch)."""
    return st.scratch(name, n * dtype.itemsize).view(dtype)


class Fold:
    """Reduce a communicator of any size to a power of two and back.

    The standard fold-in (Thakur, Rabenseifner & Gropp 2005): with
    ``pof2`` the largest power of two <= p and ``rem = p - pof2``, each
    even rank below ``2*rem`` hands its vector to the odd rank above it,
    which combines them (lower rank first) and takes part for both; the
    even ranks sit out and get the result back at the end. The survivors
    are renumbered 0..pof2-1 in rank order (``newrank``), so "lower
    newrank" still means "lower ranks" when combining.

    Cost: one extra send of the whole vector before and after (2 n beta
    plus n gamma) on ``2*rem`` ranks; nothing when p is a power of two.
    """

    def __init__(self, rank: int, size: int):
        self.pof2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.pof2
        if rank < 2 * self.rem:
            self.newrank = -1 if rank % 2 == 0 else rank // 2
        else:
            self.newrank = rank - self.rem
        self.rank = rank

    def real(self, newrank: int) -> int:
        """The communicator rank of a survivor's new rank."""
        return newrank * 2 + 1 if newrank < self.rem else newrank + self.rem

    def fold_in(self, st, buf: np.ndarray, red) -> None:
        if self.rank >= 2 * self.rem:
            return
        if self.newrank < 0:
            send(st.comm, buf, self.rank + 1, TAG_FOLD)
        else:
            tmp = scratch_like(st, "fold", buf.size, buf.dtype)
            recv(st.comm, tmp, self.rank - 1, TAG_FOLD)
            red.combine(buf, tmp, buf)

    def fold_out(self, st, buf: np.ndarray) -> None:
        if self.rank >= 2 * self.rem:
            return
        if self.newrank < 0:
            recv(st.comm, buf, self.rank + 1, TAG_FOLD)
        else:
            send(st.comm, buf, self.rank - 1, TAG_FOLD)
