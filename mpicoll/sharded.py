"""Sharded data parallelism (the ZeRO / FSDP communication pattern) for numpy
parameters: reduce-scatter the gradients, update 1/p of the parameters on
each rank, all-gather the updated parameters.

    opt = mpicoll.ShardedOptimizer(params, sgd, init_state=lambda w: {"v": np.zeros_like(w)})
    params, grads = opt.params, opt.grads       # views into fused buckets: use these
    for step in ...:
        for layer in range(nlayers):            # forward, first layer first
            opt.wait_params(layer_param_indices)  # this layer's all-gather (no-op the first time)
            ...
        for i in reversed(range(len(grads))):   # backward: last layer first
            compute_gradient(i, out=grads[i])
            opt.mark_ready(i)                   # a full bucket starts its ireduce_scatter at once
        opt.step()                              # shard updates, then the iallgathers start

    def sgd(w, g, state):                       # flat arrays: this rank's shard of one bucket
        v = state["v"]; v *= 0.9; v += g; w -= 0.1 * v

How one step runs:

* Gradients are bucketed exactly as mpicoll.GradientBucketer buckets them
  (reverse registration order, one dtype per bucket, a small first bucket):
  the bucketer itself is reused, with each bucket's all-reduce replaced by
  ``mpicoll.ireduce_scatter`` (op "avg" by default). Bucket of n elements,
  rank r owns ``np.array_split(range(n), p)[r]``: the block reduce-scatter
  and the ring all-reduce both use.
* ``step()`` waits for the reduce-scatters, then for each bucket - first
  layers' bucket first, since the next forward needs those first - calls the
  user's ``step(shard_params, shard_grads, state)`` on this rank's block and
  starts ``mpicoll.iallgather`` of the updated block. The all-gathers run
  (progress thread) while the next forward computes; ``wait_params(i)``
  waits only for the bucket that holds parameter i.
* The optimizer state is created per bucket by ``init_state(shard_params)``
  from this rank's block only, so it holds about 1/p of what an unsharded
  optimizer holds (``state_nbytes()``). Parameters and gradients stay whole
  on every rank (ZeRO stages 1 and 2 in communication, stage 1 in memory):
  the forward and backward run unchanged on full arrays.

What is guaranteed (and tested in tests/test_sharded.py):

* Every rank ends every step with bit-identical parameters (the all-gather
  copies bits; each block has one owner).
* With ``algorithm="ring"`` the result is bit-identical to the unsharded
  path - ``GradientBucketer(..., algorithm="ring")`` with the same bucket
  caps, then the same ``step`` applied to each whole bucket - for any p,
  provided ``step`` is elementwise (every output element depends only on the
  same element of params, grads and state, as SGD, momentum, Adam, weight
  decay are) and every bucket has at least p elements. Why: the ring
  all-reduce is the ring reduce-scatter (the same schedule, the same
  array_split blocks, so the same order of additions for every element)
  followed by an all-gather that only copies; "avg" divides the same sums by
  the same p. A bucket smaller than p elements is all-reduced by recursive
  doubling instead, whose order differs.
* With ``reproducible=True`` each shard is the serial rank-ordered reduction
  ((g0 op g1) op g2) ... computed by the same kernel and scaling as
  ``allreduce(..., reproducible=True)``: the parameters are bit-identical to
  ``GradientBucketer(..., reproducible=True)`` plus the same elementwise
  update, and, since that order does not depend on p or on the blocks, the
  same for every process count (given the same per-rank gradients).
* With other algorithms ("auto", "mpi", ...) reduce-scatter and all-reduce
  may add in different orders: the result equals the unsharded one up to
  float rounding (a few ulps per step), not bit for bit. A non-elementwise
  ``step`` (one that mixes elements, e.g. a norm over the shard) sees a
  shard, not the whole bucket, so it computes something else.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import dtypes as _dtypes
from . import arguments as _args
from .algorithms.common import block_bounds
from .bucketing import BUCKET_BYTES, FIRST_BUCKET_BYTES, GradientBucketer
from .api import iallgather, ireduce_scatter
from .engine import waitall


class _ReduceScatterBucketer(GradientBucketer):
    """GradientBucketer whose full buckets are reduce-scattered, each into
    this rank's shard buffer, instead of all-reduced."""

    def __init__(self, grads, shard_out, reproducible=False, **kw):
        self._shard_out = shard_out  # bucket index -> output array (set after the layout exists)
        super().__init__(grads, **kw)
        # Its own communicator: these all-to-alls must not interleave with anything else's collectives.
        self._rcomm = self._st.comm.Dup() if reproducible and self._st.size > 1 else None
        self._reproducible = reproducible

    def _launch(self, b) -> None:
        out = self._shard_out[b.index]
        if self._reproducible:
            b.request = _RankOrderedReduceScatter(self._rcomm, b.buffer, out, self._op.name, self._st.size,
                                                  self._st.rank)
        else:
            b.request = ireduce_scatter(b.buffer, op=self._op.name, comm=self._comm, out=out,
                                        algorithm=self._algorithm)


class _RankOrderedReduceScatter:
    """Block r of ((x0 op x1) op x2) ... in exactly that order, as
    ``mpicoll.allreduce(..., reproducible=True)`` computes every block: an
    all-to-all of the blocks (data movement only), then the same k-input
    kernel over the p pieces in rank order and the same avg scaling."""

    def __init__(self, comm, buf, out, op, p, rank):
        self._out, self._p = out, p
        self._red = _args.reduction(op, _dtypes.resolve(buf.dtype))
        if comm is None:  # one rank: the sum of one input
            self._pieces, self._mpi = [buf], None
            return
        isz = buf.itemsize
        bounds = block_bounds(buf.size, p)
        mine = out.size
        self._recv = np.empty(p * mine, buf.dtype)
        sb = [buf, ([(hi - lo) * isz for lo, hi in bounds], [lo * isz for lo, _ in bounds]), MPI.BYTE]
        rb = [self._recv, ([mine * isz] * p, [q * mine * isz for q in range(p)]), MPI.BYTE]
        self._pieces = [self._recv[q * mine:(q + 1) * mine] for q in range(p)]
        self._mpi = comm.Ialltoallv(sb, rb)

    def wait(self):
        if self._mpi is not None:
            self._mpi.Wait()
            self._mpi = None
        if self._pieces is not None:
            if self._out.size:
                if len(self._pieces) == 1:
                    self._out[...] = self._pieces[0]
                else:
                    self._red.combine_many(self._out, self._pieces)
                self._red.finish(self._out, self._p)
            self._pieces = None
        return self._out


class _Shard:
    __slots__ = ("params", "bounds", "lo", "hi", "own", "send", "gathered", "direct", "grad", "state", "request")


class ShardedOptimizer:
    """Reduce-scatter, shard update, all-gather (see the module docstring).

    Parameters
    ----------
    params : list of numpy arrays, the initial parameters (the same on every rank;
        rank 0's values are broadcast at construction). They are copied into
        fused buckets: train on ``opt.params`` afterwards.
    step : callable ``step(shard_params, shard_grads, state)``: updates
        ``shard_params`` (a flat writable view, one dtype) in place from the
        reduced ``shard_grads``; ``state`` is the dict ``init_state`` returned
        for this shard. Called once per bucket per step.
    init_state : callable ``init_state(shard_params) -> dict`` of arrays, or None (no state)
    comm, op, bucket_bytes, first_bucket_bytes, algorithm : as GradientBucketer
        (op applies to the reduce-scatter; "avg" by default; algorithm is the
        reduce-scatter's and the all-gather's).
    reproducible : bool; if True each shard is the serial rank-ordered
        reduction (the bits of ``allreduce(..., reproducible=True)``, whatever p
        is), by an all-to-all of the blocks and a local reduction in rank order
        (same bytes as a ring reduce-scatter, p messages per rank instead of p-1
        neighbour steps, no overlap of the reduction with communication).
    """

    def __init__(self, params, step, *, init_state=None, comm=None, op="avg", bucket_bytes=BUCKET_BYTES,
                 first_bucket_bytes=FIRST_BUCKET_BYTES, algorithm="auto", reproducible=False):
        params = [np.asarray(w) for w in params]
        if not callable(step):
            raise TypeError("mpicoll: step must be callable as step(shard_params, shard_grads, state)")
        self._step = step
        shard_out = {}
        self._grads = _ReduceScatterBucketer([(w.shape, w.dtype) for w in params], shard_out, comm=comm, op=op,
                                             bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                                             algorithm=algorithm, reproducible=bool(reproducible))
        st = self._grads._st
        self._comm, self._algorithm = self._grads._comm, algorithm
        p, rank = st.size, st.rank
        self.grads = self._grads.views
        self.params = [None] * len(params)
        self._shards = []
        self._where = self._grads._where
        for b in self._grads._buckets:
            s = _Shard()
            n = b.buffer.size
            s.params = np.empty_like(b.buffer)
            offset = 0
            for i in b.grads:
                k = params[i].size
                view = s.params[offset:offset + k].reshape(params[i].shape)
                np.copyto(view, params[i], casting="same_kind")
                self.params[i] = view
                offset += k
            s.bounds = block_bounds(n, p)
            s.lo, s.hi = s.bounds[rank]
            m = -(-n // p)  # the longest block: the all-gather moves equal blocks
            s.send = np.zeros(m, b.buffer.dtype)
            # Equal blocks: gather straight into the parameters; otherwise into
            # scratch, then the rows are copied out, shortest ones trimmed.
            s.direct = m * p == n
            s.gathered = s.params.reshape(p, m) if s.direct else np.zeros((p, m), b.buffer.dtype)
            s.own = s.send[:s.hi - s.lo]          # this rank's block: the authoritative copy
            s.grad = np.zeros(s.hi - s.lo, b.buffer.dtype)
            shard_out[b.index] = s.grad
            s.request = None
            self._shards.append(s)
        # Same starting point everywhere, whatever the caller's seeds did.
        for s in self._shards:
            if p > 1 and s.params.size:
                st.comm.Bcast(s.params, root=0)
            s.own[...] = s.params[s.lo:s.hi]
            s.state = {} if init_state is None else dict(init_state(s.own))
            for name, v in s.state.items():
                if not isinstance(v, np.ndarray):
                    raise TypeError(f"mpicoll: init_state must return a dict of numpy arrays; {name!r} is "
                                    f"{type(v).__name__}")

    # ---- introspection ----------------------------------------------------

    @property
    def buckets(self) -> list:
        """Parameter indices of each bucket, in reduce-scatter launch order."""
        return self._grads.buckets

    def shard_bounds(self) -> list:
        """[(start, stop)] of this rank's block in each bucket."""
        return [(s.lo, s.hi) for s in self._shards]

    def state_nbytes(self) -> int:
        """Bytes of optimizer state on this rank."""
        return sum(v.nbytes for s in self._shards for v in s.state.values())

    def state(self) -> list:
        """Each bucket's state dict (this rank's shard)."""
        return [s.state for s in self._shards]

    # ---- one training step ------------------------------------------------

    def mark_ready(self, i: int, grad=None) -> None:
        """Gradient ``i`` is final (written into ``grads[i]``, or given as ``grad``)."""
        self._grads.mark_ready(i, grad)

    def step(self) -> None:
        """Wait for the reduce-scatters, update this rank's shards, start the all-gathers."""
        self.wait_params()  # a forward that skipped some waits: never write a block being gathered
        self._grads.wait()
        # First layers' bucket (the last one) first: the next forward waits for it first, and
        # every rank starts its all-gathers in this same order.
        for s in reversed(self._shards):
            self._step(s.own, s.grad, s.state)
            s.request = iallgather(s.send, comm=self._comm, out=s.gathered, algorithm=self._algorithm)

    def wait_params(self, indices=None) -> None:
        """Wait for the all-gathers of the buckets holding parameters
        ``indices`` (an int, a list, or None for all)."""
        if indices is None:
            todo = [s for s in self._shards if s.request is not None]
        else:
            if isinstance(indices, (int, np.integer)):
                indices = [indices]
            todo = [self._shards[k] for k in sorted({self._where[int(i)] for i in indices})]
            todo = [s for s in todo if s.request is not None]
        if not todo:
            return
        waitall([s.request for s in todo])
        for s in todo:
            s.request = None
            if not s.direct:
                _copy_rows(s.params, s.gathered, s.bounds)


def _copy_rows(flat, rows, bounds) -> None:
    """flat[a:b] = rows[r, :b-a] for every block: array_split blocks are
    m long for the first n % p ranks and m-1 after, so two copies do it."""
    p, m = rows.shape
    long_ = sum(1 for a, b in bounds if b - a == m)
    flat[:long_ * m] = rows[:long_].reshape(-1)
    if m > 1 or long_ < p:
        flat[long_ * m:] = rows[long_:, :m - 1].reshape(-1)
