"""Gradient bucketing for data-parallel training: fused all-reduces that start
while the backward pass is still running.

    grads = [w.grad for w in params]                  # or [(shape, dtype), ...]
    bucketer = mpicoll.GradientBucketer(grads, op="avg")
    for step in ...:
        for i in reversed(range(len(grads))):          # backward: last layer first
            compute_gradient(i, out=bucketer.views[i]) # zero-copy, or:
            bucketer.mark_ready(i)                     # copies grads[i] in if it is not a view
        bucketer.wait()                                # every gradient holds the average

What it does, following PyTorch DDP's Reducer and Horovod's tensor fusion:

* Layout (at construction, no messages but one check that every rank
  registered the same shapes and dtypes): gradients are taken in *reverse*
  registration order - the order backpropagation produces them - and packed
  into fused buckets, one dtype per bucket. A bucket is closed once it holds
  ``bucket_bytes`` (default 25 MiB, DDP's default); the first bucket of each
  dtype is closed at ``first_bucket_bytes`` (default 1 MiB, as DDP), so the
  first all-reduce starts early in the backward pass. A gradient larger than
  the cap gets a bucket of its own.
* ``views[i]`` is gradient i's slice of its bucket, with gradient i's shape:
  a backward pass that writes its gradients there costs no copies (DDP's
  ``gradient_as_bucket_view``). Gradients registered as arrays are copied in
  by ``mark_ready`` and the results copied back by ``wait`` (np.copyto, one
  call per gradient: no per-element Python).
* ``mark_ready(i)``: when the last gradient of a bucket is ready, the bucket
  is launched with ``mpicoll.iallreduce`` (nonblocking; the progress thread
  of mpicoll.engine moves it while the caller computes the next
  gradients). Buckets are launched strictly in bucket order - a bucket that
  is complete waits for the ones before it - because every rank must start
  collectives in the same order, whatever order its gradients came in.
* ``wait()`` waits for every bucket and returns the gradients (the
  registered arrays, or the views); then the bucketer is ready for the next
  step.

Compression (``compression="fp16" | "bf16" | "topk" | HalfPrecision | TopK``,
float32/float64 gradients, op "sum" or "avg"): each bucket is reduced with
mpicoll.compression when it is launched. There is no nonblocking compressed
all-reduce, so a compressed bucket is reduced *blocking* at launch time:
still as soon as it is ready, but without overlap. Top-k keeps one residual
per bucket (a TopK given here is a template for the ratio).
"""
from __future__ import annotations

import numpy as np

from . import compression as _compression
from . import dtypes as _dtypes
from .compression import HalfPrecision, TopK  # noqa: F401  (re-exported by mpicoll/__init__.py)
from . import ops as _ops
from .commstate import check_intracomm, state
from .api import iallreduce
from .engine import waitall

BUCKET_BYTES = 25 << 20
FIRST_BUCKET_BYTES = 1 << 20


class _Bucket:
    __slots__ = ("index", "grads", "buffer", "pending", "request", "compressor")

    def __init__(self, index, grads, buffer):
        self.index = index
        self.grads = grads          # gradient indices, in fill (reverse registration) order
        self.buffer = buffer        # the fused 1-D array
        self.pending = len(grads)   # gradients not yet marked ready this step
        self.request = None
        self.compressor = None


class GradientBucketer:
    """Fused, overlapped all-reduce of a fixed list of gradients (see module docstring).

    Parameters
    ----------
    grads : list of numpy arrays, or of (shape, dtype) pairs
    comm : mpi4py intra-communicator, default MPI.COMM_WORLD
    op : "avg" (default) or "sum" (any all-reduce op without compression)
    bucket_bytes, first_bucket_bytes : bucket caps in bytes
    compression : None, "fp16", "bf16", "topk", "topk:RATIO", HalfPrecision or TopK
    algorithm : iallreduce algorithm for uncompressed buckets ("auto")
    reproducible : bool, uncompressed buckets get the serial rank-ordered
        reduction (``mpicoll.allreduce(..., reproducible=True)``)
    """

    def __init__(self, grads, *, comm=None, op="avg", bucket_bytes=BUCKET_BYTES,
                 first_bucket_bytes=FIRST_BUCKET_BYTES, compression=None, algorithm="auto",
                 reproducible=False):
        grads = list(grads)
        for name, v in (("bucket_bytes", bucket_bytes), ("first_bucket_bytes", first_bucket_bytes)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"mpicoll: {name} must be a positive int, got {v!r}")
        self._op = _ops.resolve(op)
        self._comm = check_intracomm(comm)
        self._algorithm = algorithm
        self._compression = None if compression is None else _compression.resolve(compression)
        if not isinstance(reproducible, bool):
            raise TypeError(f"mpicoll: reproducible must be a bool, not {type(reproducible).__name__}")
        if reproducible and self._compression is not None:
            raise ValueError("mpicoll: compression is lossy; it cannot be combined with reproducible=True")
        self._reproducible = reproducible

        self._shapes, self._dtypes, self._arrays = [], [], []
        for i, g in enumerate(grads):
            if isinstance(g, np.ndarray):
                shape, dtype, arr = g.shape, g.dtype, g
            elif isinstance(g, (tuple, list)) and len(g) == 2:
                shape = (g[0],) if isinstance(g[0], (int, np.integer)) else tuple(g[0])
                dtype, arr = np.dtype(g[1]), None
            else:
                raise TypeError(f"mpicoll: gradient {i} must be a numpy array or a (shape, dtype) pair, "
                                f"not {type(g).__name__}")
            dt = _dtypes.resolve(dtype)
            self._op.check_dtype(dt)  # TypeError: e.g. avg on integers
            if self._compression is not None and dtype not in _compression.FLOAT_DTYPES:
                raise TypeError(f"mpicoll: compression applies to float32/float64 gradients; gradient {i} is {dtype}")
            self._shapes.append(tuple(int(s) for s in shape))
            self._dtypes.append(dtype)
            self._arrays.append(arr)
        if self._compression is not None and self._op.name not in ("sum", "avg"):
            raise ValueError(f"mpicoll: compression applies to the ops 'sum' and 'avg', not {self._op.name!r}")

        self._st = state(self._comm)  # collective on first use, like every mpicoll call
        layout = [(s, d.str) for s, d in zip(self._shapes, self._dtypes)]
        if len(set(map(repr, self._st.comm.allgather(layout)))) != 1:
            raise ValueError("mpicoll: the ranks registered different gradient shapes or dtypes")

        self._buckets, self._where = self._assign(int(bucket_bytes), int(first_bucket_bytes))
        self.views = [None] * len(grads)
        for b in self._buckets:
            offset = 0
            for i in b.grads:
                n = int(np.prod(self._shapes[i], dtype=np.int64))
                self.views[i] = b.buffer[offset:offset + n].reshape(self._shapes[i])
                offset += n
            if isinstance(self._compression, _compression.TopK):
                b.compressor = _compression.TopK(self._compression.ratio)
            else:
                b.compressor = self._compression
        self._ready = np.zeros(len(grads), bool)
        self._next = 0  # the next bucket to launch

    def _assign(self, cap, first_cap):
        """Buckets in the order their first gradient is produced (reverse registration order)."""
        open_ = {}     # dtype -> [indices, bytes, cap]
        closed = []    # (first position in reverse order, dtype, indices)
        firsts_done = set()
        order = list(range(len(self._shapes) - 1, -1, -1))
        for pos, i in enumerate(order):
            d = self._dtypes[i]
            cur = open_.get(d)
            if cur is None:
                cur = open_[d] = [pos, [], 0, cap if d in firsts_done else first_cap]
                firsts_done.add(d)
            cur[1].append(i)
            cur[2] += int(np.prod(self._shapes[i], dtype=np.int64)) * d.itemsize
            if cur[2] >= cur[3]:
                closed.append((cur[0], d, cur[1]))
                del open_[d]
        closed.extend((cur[0], d, cur[1]) for d, cur in open_.items())
        closed.sort(key=lambda c: c[0])
        buckets, where = [], {}
        for k, (_, d, idx) in enumerate(closed):
            n = sum(int(np.prod(self._shapes[i], dtype=np.int64)) for i in idx)
            buckets.append(_Bucket(k, idx, np.zeros(n, d)))
            for i in idx:
                where[i] = k
        return buckets, where

    # ---- introspection ----------------------------------------------------

    @property
    def buckets(self) -> list:
        """Gradient indices of each bucket, in launch order."""
        return [list(b.grads) for b in self._buckets]

    def bucket_nbytes(self) -> list:
        return [b.buffer.nbytes for b in self._buckets]

    # ---- one training step ------------------------------------------------

    def mark_ready(self, i: int, grad=None) -> None:
        """Gradient ``i`` is final for this step. ``grad`` (or the array
        registered for ``i``) is copied into the bucket unless it is the view."""
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.views):
            raise IndexError(f"mpicoll: gradient index {i!r} out of range for {len(self.views)} gradients")
        if self._ready[i]:
            raise RuntimeError(f"mpicoll: gradient {i} marked ready twice in one step")
        src = self._arrays[i] if grad is None else grad
        view = self.views[i]
        if src is not None and not _same_memory(src, view):
            src = np.asarray(src)
            if src.shape != view.shape:
                raise ValueError(f"mpicoll: gradient {i} has shape {src.shape}, registered {view.shape}")
            np.copyto(view, src, casting="same_kind")
        self._ready[i] = True
        b = self._buckets[self._where[i]]
        b.pending -= 1
        # Launch every complete bucket at the head of the queue, in order.
        while self._next < len(self._buckets) and self._buckets[self._next].pending == 0:
            self._launch(self._buckets[self._next])
            self._next += 1

    def _launch(self, b: _Bucket) -> None:
        if b.compressor is None:
            b.request = iallreduce(b.buffer, op=self._op.name, comm=self._comm, out=b.buffer,
                                   algorithm=self._algorithm, reproducible=self._reproducible)
        else:  # the compressed ring is a schedule too: nonblocking, so it overlaps the backward pass
            b.request = iallreduce(b.buffer, op=self._op.name, comm=self._comm, out=b.buffer,
                                   compression=b.compressor)

    def wait(self) -> list:
        """Wait for every bucket; returns the gradients (registered arrays or views)."""
        if not self._ready.all():
            missing = np.flatnonzero(~self._ready)
            raise RuntimeError(f"mpicoll: wait() before gradients {missing[:10].tolist()}"
                               f"{'...' if missing.size > 10 else ''} were marked ready")
        waitall([b.request for b in self._buckets if b.request is not None])
        out = []
        for i, view in enumerate(self.views):
            arr = self._arrays[i]
            if arr is not None and arr is not view:
                np.copyto(arr, view)
                out.append(arr)
            else:
                out.append(view)
        for b in self._buckets:
            b.request = None
            b.pending = len(b.grads)
        self._ready[:] = False
        self._next = 0
        return out

    def allreduce(self) -> list:
        """Mark every gradient ready (reverse order) and wait: one fused step
        for callers that have all gradients at once."""
        for i in range(len(self.views) - 1, -1, -1):
            self.mark_ready(i)
        return self.wait()


def _same_memory(a, b: np.ndarray) -> bool:
    """``a`` is ``b`` or another view of exactly the same memory (nothing to copy)."""
    return a is b or (isinstance(a, np.ndarray) and a.nbytes == b.nbytes and
                      a.__array_interface__["data"][0] == b.__array_interface__["data"][0])
