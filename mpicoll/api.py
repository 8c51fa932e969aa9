"""The public collectives: allreduce, reduce_scatter, allgather, bcast, reduce,
their nonblocking ``i*`` forms and their persistent ``*_init`` forms.

Each is a thin front door over ``mpicoll.plan``, which checks every
argument before any message is sent, finds the communicator's state,
decides the algorithm and builds the plan; the door then runs it: blocking,
as a nonblocking ``Request``, or as a persistent request.

Every rank gets bit-identical results from every algorithm: each element
of the result is computed once, on one rank, and copied to the others (or,
in recursive doubling, computed by both partners from the same operands in
the same order).

Small all-reduces are latency-bound (solvers' dot products and norms are
8-256 bytes), so ``allreduce`` keeps the plans of its most recent small
calls, keyed by the identity of the input and output arrays: a repeated
call on the same arrays re-checks only what could have changed (shape,
dtype, the environment) and runs the plan.
"""
from __future__ import annotations

import numpy as np

from . import _direct, _env, plan as _plan
from . import ops as _ops
from . import select
from .comm import check_intracomm

ENV_ALGORITHM = _plan.ENV_ALGORITHM

# ---- the small-message plan cache -----------------------------------------------

# Only messages up to this size are cached (their per-call overhead matters,
# and the cache keeps the arrays alive: at most CACHE_SIZE * 2 of them).
CACHE_MAX_BYTES = 64 << 10
CACHE_SIZE = 32
_cache = {}
# The environment variables a plan depends on, read raw on every hit
# (os.environ's own mapping, see _env): a changed value rebuilds the plan.
_DATA = getattr(_env, "_DATA", None)
if _DATA is not None:  # CPython on POSIX
    import os as _os

    _K1, _K2, _K3 = (_os.environ.encodekey(k) for k in (_plan.ENV_ALGORITHM, "MPICOLL_CHECK", _plan.ENV_TIMEOUT))

    def _env_raw():
        return _DATA.get(_K1), _DATA.get(_K2), _DATA.get(_K3)
else:  # pragma: no cover - elsewhere: a mapping that never matches, so no short path
    _DATA, _K1, _K2, _K3 = {}, 1, 2, 3

    def _env_raw():
        return object(), None, None


class _Cached:
    """A cached small all-reduce: the plan and what it was built from."""

    __slots__ = ("plan", "x", "out", "op", "comm", "algorithm", "shape", "dtype", "env", "fn", "args", "st",
                 "finish", "options")

    def __init__(self, plan, x, out, op, comm, algorithm, env, options):
        self.plan, self.x, self.out, self.op, self.comm, self.algorithm = plan, x, out, op, comm, algorithm
        self.options = options
        self.shape, self.dtype, self.env = x.shape, x.dtype, env
        self.st = plan.st
        self.finish = plan.finish
        self.fn = self.args = None
        nat = plan.native
        # The direct call skips the plan's stage/prologue: only for plans
        # that have none (an input staged through a private copy must be
        # refreshed at every call, see buffers.as_input).
        if nat is not None and plan.timeout is None and plan.stage is None and plan.prologue is None:
            direct = nat.direct() if nat.direct is not None else None
            if direct is not None:
                self.fn, self.args = direct
            else:
                self.fn, self.args = nat.blocking, ()


def short(c: _Cached, x, out, op, comm, algorithm):
    """Run cached plan ``c`` if this call is the one it was built for (the
    same arrays, op, communicator and algorithm, an unchanged environment);
    None otherwise. The drop-in ``Comm.Allreduce`` calls it too."""
    if c.out is not out or c.op is not op or c.comm is not comm or c.algorithm is not algorithm \
            or x.shape != c.shape or x.dtype is not c.dtype or c.st.freed:
        return None
    if out is not None and not out.flags.writeable:
        return None  # made read-only since: the full path raises the usual error
    env = c.env
    if _DATA.get(_K1) is not env[0] or _DATA.get(_K2) is not env[1] or _DATA.get(_K3) is not env[2]:
        return None  # (identity: the values os.environ holds; any change rebuilds the plan)
    fn = c.fn
    if fn is None:  # a point-to-point algorithm: the plan's schedule
        res = c.plan.run()
        return res.copy() if out is None else res
    st = c.st
    _plan.enter(st)
    try:
        st.next_seq()  # the call's number (under the state's lock)
        rc = fn(*c.args)
        if rc:  # MPI_Allreduce's own error code (mpi4py's call returns None and raises itself)
            _direct.check(rc)
        if c.finish is not None:
            c.finish()
    finally:
        st.busy.release()
    return out if out is not None else c.plan.result.copy()


def allreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", **options):
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
    timeout : float, optional
        Seconds; if the call has not completed by then, raise
        ``mpicoll.CollectiveTimeout`` naming the peers it was waiting for
        (default: env ``MPICOLL_TIMEOUT``, else no deadline).

    ``dtype``, ``compression``, ``reproducible``, ``check`` and ``timeout``
    are keyword-only and optional (``**options``: the short path below
    checks one empty dict instead of five defaults).

    Returns ``out`` (a new array of x's shape and dtype if ``out`` is None).
    """
    # The short path: the same arrays, op, communicator and algorithm as a
    # recent call, no options, and an unchanged environment run the cached
    # plan's native call directly (see _Cached).
    c = _cache.get(id(x))
    if c is not None and (options == c.options if options else not c.options):
        res = short(c, x, out, op, comm, algorithm)
        if res is not None:
            return res
    if options:
        bad = set(options) - _OPTIONS
        if bad:
            raise TypeError(f"mpicoll: allreduce() got an unexpected keyword argument {sorted(bad)[0]!r}")
    if type(op) is str and type(x) is np.ndarray and (out is None or type(out) is np.ndarray) \
            and _cacheable(options):
        plan = _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, **options)
        if plan.nbytes <= CACHE_MAX_BYTES and not plan.check_sig:
            if len(_cache) >= CACHE_SIZE:
                _cache.clear()
            _cache[id(x)] = _Cached(plan, x, out, op, comm, algorithm, _env_raw(), dict(options))
            res = plan.run()
            return res.copy() if out is None else res
        return plan.run()
    return _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, **options).run()


_OPTIONS = frozenset(("dtype", "compression", "reproducible", "check", "timeout"))


def _cacheable(options) -> bool:
    """Options a kept plan can serve again: not compression (top-k keeps a
    residual) and not check=True (its pre-flight runs once per call)."""
    for k, v in options.items():
        if k == "compression" and v is not None or k == "check" and v is not False and v is not None:
            return False
        if not isinstance(v, (str, bool, int, float, type(None))):
            return False
    return True


def reduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None,
                   check=None, timeout=None):
    """Reduce ``x`` across ranks and give rank i the i-th block of the result.

    ``x`` is taken flat. Blocks follow ``np.array_split(x.ravel(), p)``
    (the first ``n % p`` blocks one element longer) unless ``counts`` gives
    every rank's block length (they must add up to ``x.size``). Returns a
    1-D array with this rank's block (``out`` if given).
    """
    return _plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm, dtype=dtype,
                                check=check, timeout=timeout).run()


def allgather(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Gather every rank's ``x`` (same shape and dtype everywhere) to every rank.

    Returns an array of shape ``(p,) + x.shape``: row i is rank i's ``x``.
    Any fixed-size numpy dtype works, since nothing is reduced.
    """
    return _plan.allgather(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout).run()


def bcast(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None):
    """Copy root's ``x`` into every rank's ``x`` (in place; same shape and dtype everywhere).

    ``x`` must be a writable, C-contiguous buffer. Returns ``x``.
    """
    return _plan.bcast(x, root, comm=comm, algorithm=algorithm, check=check, timeout=timeout).run()


def reduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None, timeout=None):
    """Reduce ``x`` across ranks to ``root``.

    Returns the result (``out`` if given) on root and None elsewhere; ``out``
    is only looked at on root.
    """
    return _plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype, check=check,
                        timeout=timeout).run()


# ---- nonblocking ----------------------------------------------------------------

def iallreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
               reproducible=False, check=None, timeout=None):
    """Start an all-reduce; returns an ``mpicoll.Request`` (``wait()`` returns
    the result). Same arguments as ``allreduce``; every algorithm name works.
    Do not touch ``x`` or ``out`` before the request completes."""
    return _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, dtype=dtype, compression=compression,
                           reproducible=reproducible, check=check, timeout=timeout, nonblocking=True).start()


def ireduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None, check=None,
                    timeout=None):
    """Nonblocking ``reduce_scatter``; returns a Request."""
    return _plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm, dtype=dtype,
                                check=check, timeout=timeout, nonblocking=True).start()


def iallgather(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``allgather``; returns a Request."""
    return _plan.allgather(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                           nonblocking=True).start()


def ibcast(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``bcast``; returns a Request."""
    return _plan.bcast(x, root, comm=comm, algorithm=algorithm, check=check, timeout=timeout,
                       nonblocking=True).start()


def ireduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None, timeout=None):
    """Nonblocking ``reduce``; returns a Request (its result is None off root)."""
    return _plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype, check=check,
                        timeout=timeout, nonblocking=True).start()


# ---- persistent --------------------------------------------------------------------

def allreduce_init(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
                   reproducible=False, check=None, timeout=None) -> _plan.Persistent:
    """A persistent all-reduce (MPI-4 ``MPI_Allreduce_init``): validated and
    decided once, then ``req.start(); req.wait()`` (or ``req()``) as often
    as needed, in the same order on every rank. ``x`` and ``out`` are bound:
    write new input into ``x`` between runs. With ``algorithm="mpi"`` (or
    when "auto" picks it) the MPI library's own persistent collective is
    used where it has one. Creating it is collective (like MPI's)."""
    return _plan.Persistent(_plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, dtype=dtype,
                                            compression=compression, reproducible=reproducible, check=check,
                                            timeout=timeout, nonblocking=True))


def reduce_scatter_init(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None,
                        check=None, timeout=None) -> _plan.Persistent:
    """Persistent ``reduce_scatter`` (see allreduce_init)."""
    return _plan.Persistent(_plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm,
                                                 dtype=dtype, check=check, timeout=timeout, nonblocking=True))


def allgather_init(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None) -> _plan.Persistent:
    """Persistent ``allgather`` (see allreduce_init)."""
    return _plan.Persistent(_plan.allgather(x, comm=comm, out=out, algorithm=algorithm, check=check,
                                            timeout=timeout, nonblocking=True))


def bcast_init(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None) -> _plan.Persistent:
    """Persistent ``bcast`` (see allreduce_init)."""
    return _plan.Persistent(_plan.bcast(x, root, comm=comm, algorithm=algorithm, check=check, timeout=timeout,
                                        nonblocking=True))


def reduce_init(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None,
                timeout=None) -> _plan.Persistent:
    """Persistent ``reduce`` (see allreduce_init)."""
    return _plan.Persistent(_plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype,
                                         check=check, timeout=timeout, nonblocking=True))


# ---- explain -----------------------------------------------------------------------

def explain(nbytes: int, *, comm=None, op="sum", dtype="float32") -> select.Choice:
    """Which all-reduce algorithm "auto" picks for an ``nbytes`` message, and why
    (forced by the environment, a tuning profile's entry or model, or the
    fixed defaults: the reason says which). Collective on a communicator's
    first use (it settles the profile and layout every rank agrees on)."""
    from . import dtypes as _dtypes
    from .comm import state
    from .mpitypes import reduces_natively

    comm = check_intracomm(comm)
    dt = _dtypes.BY_NAME[dtype] if isinstance(dtype, str) and dtype in _dtypes.BY_NAME \
        else _dtypes.of_numpy(np.dtype(dtype))
    o = _ops.resolve(op)
    o.check_dtype(dt)
    forced, _, _ = _plan.env_settings()
    if forced and forced != "auto":
        from . import algorithms as _alg

        if _alg.has("allreduce", forced):
            return select.Choice(forced, f"forced by {ENV_ALGORITHM}")
    st = state(comm)
    c = select.allreduce(st.size, int(nbytes), o.name, dt.name, native_dtype=reduces_natively(dt, o),
                         profile=st.profile, ranks_per_node=st.ranks_per_node, nodes=st.nodes)
    if st.profile_note:
        c = c._replace(reason=f"{c.reason} ({st.profile_note})")
    return c


# ---- scatter, gather, allgatherv, alltoall, alltoallv ----------------------------------
# Data movement: any fixed-size numpy dtype. Equal blocks by default; the
# v-forms take counts (in elements) on every rank.

def scatter(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Send block i of root's ``x`` to rank i.

    Without ``counts``: root's ``x`` has shape ``(p,) + s`` and every rank
    gets row ``rank`` (shape ``s``). With ``counts`` (the same on every
    rank): root's ``x`` is taken flat, rank i gets ``counts[i]`` elements.
    Other ranks pass an ``x`` of the same dtype (its shape gives ``s``; its
    contents are not read) or ``x=None`` and ``out``. On root, ``out`` may be
    row ``root`` of ``x`` itself (in place). Returns this rank's block.
    """
    return _plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                         timeout=timeout).run()


def gather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Collect every rank's ``x`` on root: shape ``(p,) + x.shape`` (row i from
    rank i), or with ``counts`` the flat concatenation. ``x`` may be root's
    own row/block of ``out`` (in place). Returns the result on root, None elsewhere.
    """
    return _plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                        timeout=timeout).run()


def allgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Every rank's ``x`` (``counts[rank]`` elements) concatenated in rank order,
    on every rank (1-D, ``sum(counts)`` elements). ``x`` may be this rank's
    block of ``out`` (in place)."""
    return _plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, check=check,
                            timeout=timeout).run()


def alltoall(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Row j of ``x`` (shape ``(p,) + s``) goes to rank j; row i of the result
    came from rank i. ``out=x`` works in place."""
    return _plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout).run()


def alltoallv(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """``x`` taken flat: the next ``sendcounts[j]`` elements go to rank j; the
    result (1-D, ``sum(recvcounts)``) holds ``recvcounts[i]`` elements from
    rank i, in rank order. ``out=x`` works in place (equal totals)."""
    return _plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm, check=check,
                           timeout=timeout).run()


def iscatter(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``scatter``; returns a Request."""
    return _plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                         timeout=timeout, nonblocking=True).start()


def igather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``gather``; returns a Request (its result is None off root)."""
    return _plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                        timeout=timeout, nonblocking=True).start()


def iallgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``allgatherv``; returns a Request."""
    return _plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                            nonblocking=True).start()


def ialltoall(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``alltoall``; returns a Request."""
    return _plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                          nonblocking=True).start()


def ialltoallv(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``alltoallv``; returns a Request."""
    return _plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm, check=check,
                           timeout=timeout, nonblocking=True).start()


def scatter_init(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None,
                 timeout=None) -> _plan.Persistent:
    """Persistent ``scatter`` (see allreduce_init)."""
    return _plan.Persistent(_plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                          check=check, timeout=timeout, nonblocking=True))


def gather_init(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None,
                timeout=None) -> _plan.Persistent:
    """Persistent ``gather`` (see allreduce_init)."""
    return _plan.Persistent(_plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                         check=check, timeout=timeout, nonblocking=True))


def allgatherv_init(x, counts, *, comm=None, out=None, algorithm="auto", check=None,
                    timeout=None) -> _plan.Persistent:
    """Persistent ``allgatherv`` (see allreduce_init)."""
    return _plan.Persistent(_plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, check=check,
                                             timeout=timeout, nonblocking=True))


def alltoall_init(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None) -> _plan.Persistent:
    """Persistent ``alltoall`` (see allreduce_init)."""
    return _plan.Persistent(_plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, check=check,
                                           timeout=timeout, nonblocking=True))


def alltoallv_init(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None,
                   timeout=None) -> _plan.Persistent:
    """Persistent ``alltoallv`` (see allreduce_init)."""
    return _plan.Persistent(_plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm,
                                            check=check, timeout=timeout, nonblocking=True))
