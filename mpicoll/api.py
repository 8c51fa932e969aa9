"""The public collectives: allreduce, reduce_scatter, allgather, bcast, reduce.

Each call does the same four things, in this order:

1. checks every argument and raises TypeError/ValueError on a bad one
   (before any message is sent);
2. finds the communicator's cached state (the first call duplicates it);
3. picks the algorithm: the ``algorithm`` argument, else the
   ``MPICOLL_ALGORITHM`` environment variable, else ``select.py``;
4. runs it on a flat storage view of the output buffer.

Every rank gets bit-identical results from every algorithm: each element
of the result is computed once, on one rank, and copied to the others (or,
in recursive doubling, computed by both partners from the same operands in
the same order).
"""
from __future__ import annotations

import functools

import numpy as np

from . import algorithms as _alg
from . import _env, buffers, select
from . import check as _check
from . import profile as _profile
from . import ops as _ops
from .algorithms.common import block_bounds, counts_to_bounds
from .comm import check_intracomm, state
from .kernels import Reduction
from .node import node_info

ENV_ALGORITHM = "MPICOLL_ALGORITHM"

# Small all-reduces are latency-bound, so the per-call path avoids anything
# that costs a microsecond: the validated Reduction for an (op name, dtype)
# is cached, and so is auto's decision (select is a pure function).
_reductions = {}


def _reduction(op, dt) -> Reduction:
    key = (op, dt.code) if isinstance(op, str) else None
    red = _reductions.get(key) if key else None
    if red is None:
        red = Reduction(_ops.resolve(op), dt)  # raises if op is not defined for dt
        if key:
            _reductions[key] = red
    return red


_NO_KNOBS = {}


@functools.lru_cache(maxsize=4096)
def _choose_allreduce(p, nbytes, op, dtype, native_dtype, profile, ranks_per_node=1, nodes=1):
    """(name, keyword knobs) for "auto"; ``profile`` is the loaded tuning
    profile or None (hashed by identity), which may set the ring's segment size."""
    c = select.allreduce(p, nbytes, op, dtype, native_dtype=native_dtype, profile=profile,
                         ranks_per_node=ranks_per_node, nodes=nodes)
    return c.name, ({"segment_bytes": c.segment_bytes} if c.segment_bytes else _NO_KNOBS)

def _forced_algorithm():
    return _env.get(ENV_ALGORITHM)


def _requested(collective: str, algorithm) -> str:
    """The algorithm name asked for, validated (no MPI calls)."""
    if not isinstance(algorithm, str):
        raise TypeError(f"mpicoll: algorithm must be a name, not {type(algorithm).__name__}")
    forced = _forced_algorithm()
    if forced:
        # Forces every collective that has an algorithm of that name; the
        # others keep what the call asked for.
        if forced != "auto" and not any(_alg.has(c, forced) for c in _alg.COLLECTIVES):
            raise ValueError(f"mpicoll: {ENV_ALGORITHM}={forced!r} is not a known algorithm; "
                             f"all-reduce algorithms: {', '.join(_alg.names('allreduce'))}")
        if forced == "auto" or _alg.has(collective, forced):
            return forced
    if algorithm != "auto":
        _alg.get(collective, algorithm)  # ValueError if unknown
    return algorithm


def _root(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
        raise TypeError(f"mpicoll: root must be an int, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValueError(f"mpicoll: root {root} out of range for a communicator of size {size}")
    return int(root)


def allreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
              reproducible=False, check=None):
    """Reduce ``x`` element-wise across all ranks of ``comm``; every rank gets the result.

    Parameters
    ----------
    x : numpy array (any shape) or buffer-protocol object
        This rank's contribution; not modified unless ``out`` is ``x``.
    op : str or MPI.Op
        "sum", "prod", "min", "max", "avg" (floats), "band", "bor", "bxor",
        "land", "lor", "lxor" (integers), or the matching ``MPI.Op``.
    comm : mpi4py intra-communicator, default ``MPI.COMM_WORLD``
    out : array, optional
        Where to write the result: same shape and dtype as ``x``,
        C-contiguous, writable. ``out=x`` reduces in place.
    algorithm : str
        "auto" or one of ``mpicoll.algorithms("allreduce")``.
    dtype : optional
        Declares the element type when the buffer cannot carry it:
        ``dtype="bfloat16"`` over uint16 storage.
    compression : optional
        "fp16", "bf16", "topk", or a ``mpicoll.HalfPrecision``/``mpicoll.TopK``:
        lossy wire compression for float32/float64 sums and averages (see
        mpicoll/compression.py).
    reproducible : bool
        If True, the result is bit-identical to the serial rank-ordered
        reduction ((x0 op x1) op x2) ... whatever the process count, node
        layout or ``algorithm`` (see algorithms/reproducible.py for the cost).
    check : bool, optional
        Pre-flight agreement: every rank raises the same ``MismatchError``
        if the ranks' calls differ (default: env ``MPICOLL_CHECK``; see
        ``mpicoll.check``). Must be the same on every rank.

    Returns ``out`` (a new array of x's shape and dtype if ``out`` is None).
    """
    if not isinstance(reproducible, bool):
        raise TypeError(f"mpicoll: reproducible must be a bool, not {type(reproducible).__name__}")
    if compression is not None:
        if reproducible:
            raise ValueError("mpicoll: compression is lossy; it cannot be combined with reproducible=True")
        from . import compression as _compression
        return _compression.allreduce(x, op, comm=comm, out=out, compression=compression,
                                      algorithm=algorithm, dtype=dtype)
    arr, dt = buffers.as_reducible(x, dtype)
    red = _reduction(op, dt)
    name = _requested("allreduce", algorithm)
    comm = check_intracomm(comm)
    if out is None:
        result = np.empty(arr.shape, arr.dtype)
        src = buffers.storage(arr, dt)
    else:
        result = buffers.output(out, arr.shape, arr.dtype)
        src = None if buffers.same_memory(result, arr) else buffers.storage(arr, dt)
    flat = buffers.storage(result, dt)
    st = state(comm)
    _check.preflight(st, "allreduce", check, count=arr.size, dtype=dt.name, op=red.op.name, algorithm=name)
    if st.size > 1 and reproducible:
        from .algorithms import reproducible as _rep
        _rep.allreduce(st, flat, red, src=src)
    elif st.size > 1:
        knobs = _NO_KNOBS
        if name == "auto":
            name, knobs = _choose_allreduce(st.size, flat.nbytes, red.op.name, dt.name, dt.mpi is not None,
                                            _profile.current(), *_layout(st))
        _alg.get("allreduce", name)(st, flat, red, src=src, **knobs)
    elif src is not None:
        flat[...] = src
    if red.op.average:
        red.finish(flat, st.size)
    return result


def _layout(st) -> tuple:
    """(ranks_per_node, nodes) for select.allreduce (collective on a communicator's first call)."""
    info = node_info(st)
    return info.ranks_per_node, info.nodes


def reduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None,
                   check=None):
    """Reduce ``x`` across ranks and give rank i the i-th block of the result.

    ``x`` is taken flat. Blocks follow ``np.array_split(x.ravel(), p)``
    (the first ``n % p`` blocks one element longer) unless ``counts`` gives
    every rank's block length (they must add up to ``x.size``). Returns a
    1-D array with this rank's block (``out`` if given).
    """
    arr, dt = buffers.as_reducible(x, dtype)
    red = _reduction(op, dt)
    name = _requested("reduce_scatter", algorithm)
    comm = check_intracomm(comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    n = arr.size
    if counts is None:
        bounds = block_bounds(n, p)
    else:
        counts = [int(c) for c in counts]
        if len(counts) != p or any(c < 0 for c in counts) or sum(counts) != n:
            raise ValueError(f"mpicoll: counts must be {p} non-negative block lengths adding up to {n}, got {counts}")
        bounds = counts_to_bounds(counts)
    a, b = bounds[rank]
    result = buffers.output(out, (b - a,), arr.dtype)
    st = state(comm)
    _check.preflight(st, "reduce_scatter", check, count=n, dtype=dt.name, op=red.op.name, algorithm=name,
                     counts=counts)
    work = buffers.storage(arr, dt)
    if st.size > 1:
        # The algorithms reduce in place; never in the caller's input.
        tmp = st.scratch("reduce_scatter", work.nbytes).view(work.dtype)
        tmp[...] = work
        work = tmp
        if name == "auto":
            name = select.simple("reduce_scatter", p, work.nbytes, native_dtype=dt.mpi is not None).name
        _alg.get("reduce_scatter", name)(st, work, red, bounds)
    flat = buffers.storage(result, dt)
    flat[...] = work[a:b]
    red.finish(flat, st.size)
    return result


def allgather(x, *, comm=None, out=None, algorithm="auto", check=None):
    """Gather every rank's ``x`` (same shape and dtype everywhere) to every rank.

    Returns an array of shape ``(p,) + x.shape``: row i is rank i's ``x``.
    Any fixed-size numpy dtype works, since nothing is reduced.
    """
    arr = buffers.as_array(x)
    name = _requested("allgather", algorithm)
    comm = check_intracomm(comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    result = buffers.output(out, (p,) + arr.shape, arr.dtype)
    flat = buffers.as_bytes(result)
    bounds = block_bounds(flat.size, p)
    a, b = bounds[rank]
    flat[a:b] = buffers.as_bytes(arr)
    st = state(comm)
    _check.preflight(st, "allgather", check, count=arr.size, dtype=(arr.dtype.str, arr.shape), algorithm=name)
    if st.size > 1:
        if name == "auto":
            name = select.simple("allgather", p, flat.nbytes).name
        _alg.get("allgather", name)(st, flat, bounds)
    return result


def bcast(x, root=0, *, comm=None, algorithm="auto", check=None):
    """Copy root's ``x`` into every rank's ``x`` (in place; same shape and dtype everywhere).

    ``x`` must be a writable, C-contiguous buffer. Returns ``x``.
    """
    if isinstance(x, np.ndarray) and not x.flags.c_contiguous:
        raise ValueError("mpicoll: bcast writes in place, so x must be C-contiguous")
    arr = buffers.as_array(x)
    if not arr.flags.writeable:
        raise ValueError("mpicoll: bcast writes in place, so x must be writable")
    name = _requested("bcast", algorithm)
    comm = check_intracomm(comm)
    root = _root(root, comm.Get_size())
    st = state(comm)
    _check.preflight(st, "bcast", check, count=arr.size, dtype=arr.dtype.str, algorithm=name, root=root)
    if st.size > 1:
        if name == "auto":
            name = select.simple("bcast", st.size, arr.nbytes).name
        _alg.get("bcast", name)(st, buffers.as_bytes(arr), root)
    return x


def reduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None):
    """Reduce ``x`` across ranks to ``root``.

    Returns the result (``out`` if given) on root and None elsewhere; ``out``
    is only looked at on root.
    """
    arr, dt = buffers.as_reducible(x, dtype)
    red = _reduction(op, dt)
    name = _requested("reduce", algorithm)
    comm = check_intracomm(comm)
    root = _root(root, comm.Get_size())
    is_root = comm.Get_rank() == root
    result = buffers.output(out, arr.shape, arr.dtype) if is_root else None
    st = state(comm)
    _check.preflight(st, "reduce", check, count=arr.size, dtype=dt.name, op=red.op.name, algorithm=name,
                     root=root)
    src = buffers.storage(arr, dt)
    if is_root:
        work = buffers.storage(result, dt)
        if not buffers.same_memory(result, arr):
            work[...] = src
    else:  # the algorithms overwrite their buffer: never the caller's input
        work = st.scratch("reduce", src.nbytes).view(src.dtype)
        work[...] = src
    if st.size > 1:
        if name == "auto":
            name = select.simple("reduce", st.size, work.nbytes, native_dtype=dt.mpi is not None).name
        _alg.get("reduce", name)(st, work, red, root)
    if is_root:
        red.finish(work, st.size)
    return result


def explain(nbytes: int, *, comm=None, op="sum", dtype="float32") -> select.Choice:
    """Which all-reduce algorithm "auto" picks for an ``nbytes`` message, and why
    (forced by the environment, a tuning profile's entry or model, or the
    fixed defaults: the reason says which)."""
    from . import dtypes as _dtypes

    comm = check_intracomm(comm)
    dt = _dtypes.BY_NAME[dtype] if isinstance(dtype, str) and dtype in _dtypes.BY_NAME \
        else _dtypes.of_numpy(np.dtype(dtype))
    o = _ops.resolve(op)
    o.check_dtype(dt)
    forced = _forced_algorithm()
    if forced and forced != "auto" and _alg.has("allreduce", forced):
        return select.Choice(forced, f"forced by {ENV_ALGORITHM}")
    # The node layout is known once the communicator has been used (finding
    # it is collective, and explain is not); before that, one rank per node.
    from . import comm as _comm
    st = comm.Get_attr(_comm._keyval) if _comm._keyval is not None else None
    rpn, nodes = _layout(st) if st is not None and "node" in st.extra else (1, 1)
    return select.allreduce(comm.Get_size(), int(nbytes), o.name, dt.name, native_dtype=dt.mpi is not None,
                            profile=_profile.current(), ranks_per_node=rpn, nodes=nodes)
