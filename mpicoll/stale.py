"""Asynchronous all-reduce with bounded staleness.

    avg = mpicoll.StaleAllreduce(grad.shape, grad.dtype, staleness=2)
    for t in range(steps):
        g = compute_gradient(params)
        a = avg.step(g)          # starts step t's all-reduce; returns step t-2's average
        if a is not None:        # (None for the first `staleness` steps)
            params -= lr * a

Step t's all-reduce is started by ``step(g)`` and may still be in flight
``staleness`` (k) steps later: up to k+1 all-reduces are outstanding, each in
its own buffer, advanced by the progress thread while the caller computes.

Which average does step t apply? The one of step t-k, always - waiting for
it if it has not completed. Not "the freshest one that has completed here":
completion is a local event (one rank may see step t-1 finish while another
is still receiving it), so choosing by completion would let the ranks apply
different sequences of averages and their replicas would drift apart with
nothing to bring them back. Choosing by step number makes every rank apply
the same averages in the same order (bit-identical replicas, as the
synchronous path), and bounds the staleness exactly at k. The price: a rank
that is more than k steps ahead of the slowest one waits for it, so a rank
that is slow at every step still sets everyone's pace; what staleness hides
is communication time and a rank's occasional delays, up to k steps' worth.

``staleness=0`` is the synchronous all-reduce (start, then wait at once).
The first k steps return None: no average exists yet. ``drain()`` returns
the averages still in flight at the end of training, oldest first.
"""
from __future__ import annotations

import numpy as np

from .commstate import check_intracomm
from .api import iallreduce


class StaleAllreduce:
    """All-reduce whose step-t result is applied at step t+staleness (see the module docstring).

    Parameters
    ----------
    shape, dtype : of the array reduced each step (the same on every rank)
    staleness : int >= 0, steps an all-reduce may stay in flight (k)
    comm : mpi4py intra-communicator, default MPI.COMM_WORLD
    op : "avg" (default) or any all-reduce op; algorithm, reproducible : as iallreduce
    """

    def __init__(self, shape, dtype=np.float32, *, staleness=0, comm=None, op="avg", algorithm="auto",
                 reproducible=False):
        if isinstance(staleness, bool) or not isinstance(staleness, (int, np.integer)) or staleness < 0:
            raise ValueError(f"mpicoll: staleness must be an int >= 0, got {staleness!r}")
        self.staleness = int(staleness)
        self._comm = check_intracomm(comm)
        self._op, self._algorithm, self._reproducible = op, algorithm, reproducible
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        # k+1 slots: step t writes slot t % (k+1), which held step t-k-1's
        # result, already handed out (and superseded) at step t-1.
        self._slots = [np.zeros(shape, dtype) for _ in range(self.staleness + 1)]
        self._requests = [None] * (self.staleness + 1)
        self.t = 0  # steps started

    @property
    def in_flight(self) -> int:
        return sum(r is not None for r in self._requests)

    def step(self, x):
        """Start the all-reduce of ``x`` (step t) and return step t-k's
        result (a view valid until the next ``step``), or None while t < k."""
        k, t = self.staleness, self.t
        slot = t % (k + 1)
        if self._requests[slot] is not None:  # only if a returned result was never collected
            self._requests[slot].wait()
        buf = self._slots[slot]
        np.copyto(buf, x, casting="same_kind")
        self._requests[slot] = iallreduce(buf, op=self._op, comm=self._comm, out=buf, algorithm=self._algorithm,
                                          reproducible=self._reproducible)
        self.t = t + 1
        if t < k:
            return None
        return self._collect((t - k) % (k + 1))

    def _collect(self, slot):
        req = self._requests[slot]
        req.wait()
        self._requests[slot] = None
        return self._slots[slot]

    def drain(self) -> list:
        """Wait for every all-reduce still in flight; their results, oldest
        first (copies). Afterwards the object starts over at step 0."""
        k, t = self.staleness, self.t
        out = []
        for s in range(max(0, t - k), t):
            slot = s % (k + 1)
            if self._requests[slot] is not None:
                out.append(self._collect(slot).copy())
        self.t = 0
        return out
