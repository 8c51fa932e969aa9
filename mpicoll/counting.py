"""The counting driver: the schedules of all p ranks of one collective run
in one process, without MPI.

Sends are matched to receives per (source, destination) pair in posting
order, as MPI does for one tag, and a send completes at once (eager). Per
rank it counts the messages and bytes sent and the bytes reduced - the
figures the cost model (``mpicoll.model.terms``) predicts - while
computing the real result, so the tests check every algorithm's result and
costs at any p without launching a job. The schedules are the same
generators the blocking and nonblocking drivers run (mpicoll/schedule.py).
"""
from __future__ import annotations

import numpy as np

from .schedule import RECV, SEND, Context, size_mismatch


class SimStats:
    """Per-rank counts of one simulated call."""

    __slots__ = ("messages", "bytes_sent", "bytes_reduced")

    def __init__(self):
        self.messages = 0
        self.bytes_sent = 0
        self.bytes_reduced = 0

    def __repr__(self):
        return f"SimStats(messages={self.messages}, bytes_sent={self.bytes_sent}, bytes_reduced={self.bytes_reduced})"


class _SimComm:
    """A stand-in for CommState in the simulator: rank and size."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.comm = None
        self.extra = {}


class _SimContext(Context):
    __slots__ = ("net", "stats")

    def post_op(self, op):
        self.net.post(op)

    def native(self, blocking, start):
        raise NotImplementedError("the MPI library's own collectives cannot be simulated")

    def sub(self, st):
        raise NotImplementedError("sub-communicators are not simulated")


class CountingReduction:
    """A Reduction that also counts the bytes it reduces (per rank)."""

    def __init__(self, red, stats: SimStats):
        self._red, self._stats = red, stats
        self.op, self.dtype = red.op, red.dtype

    def combine(self, dst, a, b):
        self._stats.bytes_reduced += dst.nbytes
        self._red.combine(dst, a, b)

    def combine_many(self, dst, srcs):
        self._stats.bytes_reduced += dst.nbytes * max(len(srcs) - 1, 0)
        self._red.combine_many(dst, srcs)

    def finish(self, buf, size):
        self._red.finish(buf, size)


class _Network:
    """Matches simulated sends and receives: per (source, dest) pair in
    posting order, as MPI does for one tag. A send is buffered when posted
    (eager), so it completes at once."""

    def __init__(self):
        self.queues = {}  # (src, dst) -> list of bytes in flight
        self.recvs = {}  # (src, dst) -> list of posted, unmatched receive ops

    def post(self, op):
        r = op.ctx.rank
        if op.kind == SEND:
            op.ctx.stats.messages += 1
            op.ctx.stats.bytes_sent += op.buf.nbytes
            data = op.buf.view(np.uint8).copy() if op.buf.nbytes else np.empty(0, np.uint8)
            waiting = self.recvs.get((r, op.peer))
            if waiting:
                self._deliver(waiting.pop(0), data)
            else:
                self.queues.setdefault((r, op.peer), []).append(data)
            op.req = True  # complete
        elif op.kind == RECV:
            q = self.queues.get((op.peer, r))
            if q:
                self._deliver(op, q.pop(0))
            else:
                self.recvs.setdefault((op.peer, r), []).append(op)
                op.req = False  # pending
        else:
            raise NotImplementedError("only point-to-point operations are simulated")

    @staticmethod
    def _deliver(op, data):
        if data.nbytes != op.buf.nbytes:
            raise size_mismatch(op, data.nbytes)
        if data.nbytes:
            op.buf.view(np.uint8)[...] = data
        op.req = True


def simulate(p: int, make):
    """Run one collective on ``p`` simulated ranks; returns per-rank SimStats.

    ``make(ctx, stats)`` returns rank ``ctx.rank``'s schedule generator (it
    may wrap its Reduction in ``CountingReduction(red, stats)``). Raises
    RuntimeError if the schedules deadlock (a receive nobody sends).
    """
    net = _Network()
    stats = [SimStats() for _ in range(p)]
    gens, waiting = [], []
    for r in range(p):
        ctx = _SimContext(_SimComm(r, p), tag=0, pool={}, info=("simulated", "?", 0, 0))
        ctx.net, ctx.stats = net, stats[r]
        gens.append(make(ctx, stats[r]))
        waiting.append(None)
    live = set(range(p))

    def advance(r):
        try:
            ops = next(gens[r]) if waiting[r] is None else gens[r].send(None)
        except StopIteration:
            live.discard(r)
            return
        for op in ops:
            if op.req is None:
                net.post(op)
        waiting[r] = list(ops)

    for r in range(p):
        advance(r)
    while live:
        moved = False
        for r in sorted(live):
            if all(op.req is True for op in waiting[r]):
                advance(r)
                moved = True
        if not moved:
            stuck = {r: [op.describe() for op in waiting[r] if op.req is not True] for r in sorted(live)}
            raise RuntimeError(f"simulated schedules deadlock: {stuck}")
    return stats
