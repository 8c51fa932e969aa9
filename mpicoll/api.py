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

Short collectives are latency-bound (solvers' dot products and norms are
8-256 bytes), so every collective's blocking and ``i*`` doors (allreduce,
reduce_scatter, allgather(v), bcast, reduce, scatter(v), gather(v),
alltoall(v)) file what a call decided in the communicator's plan cache under
the call's signature, counts vectors included (plancache.py): a repeated
call, on the same arrays or on new ones of the same shape, re-checks only
what the signature does not pin down and runs the kept decision on its own
arrays.
"""
from __future__ import annotations

import numpy as np

from mpi4py import MPI

import functools

from . import engine as _engine
from . import native as _native
from . import plan as _plan
from . import arguments as _args
from .persistent import Persistent
from . import ops as _ops
from . import select
from .commstate import _by_handle, check_intracomm
from .plancache import MISS as _MISS, counts_key

ENV_ALGORITHM = _args.ENV_ALGORITHM

# ---- kept plans ------------------------------------------------------------------
# Every communicator's state keeps the decisions of its calls by signature
# (plancache.py): a repeated call - on the same arrays or on new ones of the
# same shape - is served by the kept entry without building a plan.

_WORLD = MPI.COMM_WORLD
_WORLD_HANDLE = _WORLD.handle


def _kept(comm, key):
    """The kept entry of ``key`` on ``comm``, or None (no state yet, or no entry)."""
    if comm is None:
        st = _by_handle.get(_WORLD_HANDLE)
    elif isinstance(comm, MPI.Comm):
        st = _by_handle.get(comm.handle)
    else:
        return None  # the full path raises the usual TypeError
    return None if st is None else st.plans.get(key)


def _keep(plan, key, mode=0):
    """File ``plan``'s kept entry (if it has one) under ``key``."""
    k = plan.kept
    if k is not None and not plan.check_sig:
        if mode:
            k.mode = mode
        plan.st.plans.put(key, k)


def _door(key, comm, args, build, blocking: bool, mode=0):
    """One call of a kept signature's door: the kept entry serves it
    (blocking: the result; else a request), or the full path builds the
    plan (``build(nonblocking)``), files its kept entry and runs/starts it."""
    k = _kept(comm, key)
    if k is not None:
        fast = k.fast
        if fast is not None:  # the kept call whole in C (kept._gate: all-reduce's, bcast's); MISS: Python decides
            if blocking:
                res = fast(*args)
                if res is not _MISS:
                    return res
            else:
                got = fast.start_kept(*args)
                if got is not _MISS:
                    return got if type(got) is not tuple else started_long(got, args[0], k.st)
        res = k(*args) if blocking else k.start(*args)
        if res is not _MISS:
            return res
    plan = build(not blocking)
    _keep(plan, key, mode)
    return plan.run() if blocking else plan.start()


def started_long(got, x, st):
    """A gated call's start_kept returns the request it made in C, or for a
    long call (result, Req): handed to the engine here, which lists it for
    the progress thread (engine.start_native)."""
    return _engine.start_native(got[1], got[0], None, x.nbytes, st)


def _mode(x, out) -> int:
    return 0 if out is None else 1 if out is x else 2


def _plain_call(x, algorithm, *rest) -> bool:
    """A call the kept doors take: a numpy input, an algorithm name, and no
    option that changes per call (the other arguments, given as ``rest``,
    are None)."""
    if type(x) is not np.ndarray or type(algorithm) is not str:
        return False
    for r in rest:  # (a loop, not all() over a generator: this runs on every call)
        if r is not None:
            return False
    return True


def _opkey(op):
    """A hashable stand-in for ``op`` in a key (mpi4py's Op objects are not
    hashable; mpicoll's own, which mpicoll.Comm passes, stand for their name),
    or None for anything the full path must look at."""
    if type(op) is str:
        return op
    if type(op) is MPI.Op:
        return op.py2f()
    if type(op) is _ops.Op:
        return op.name
    return None


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
    # The short path: a call of a kept signature runs the kept decision on
    # this call's arrays (kept.KeptAllreduce; MISS sends it down the full
    # path). Written out rather than through _door: this is the most
    # latency-bound call there is (a solver's dot product).
    if type(x) is np.ndarray and type(algorithm) is str:
        o = op if type(op) is str else _opkey(op)
        if options:
            extra = _signature_options(options)
            if extra is None:
                o = None  # an option that changes per call, or a wrong one: the full path
        else:
            extra = _NO_EXTRA
        if o is not None:
            mode = 0 if out is None else 1 if out is x else 2
            key = ("allreduce", x.shape, x.dtype, o, algorithm, mode)
            if extra:
                key += extra
            if comm is None:
                st = _by_handle.get(_WORLD_HANDLE)
            else:
                st = _by_handle.get(comm.handle) if isinstance(comm, MPI.Comm) else None
            if st is not None:
                k = st.plans._d.get(key)
                if k is not None:
                    st.plans.touch(key)
                    # (the kept call's whole C path where it has one, else
                    # its Python path, which also handles what C missed)
                    fast = k.fast
                    res = k(x, out) if fast is None or (res := fast(x, out)) is _MISS else res
                    if res is not _MISS:
                        return res
            plan = _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, **options)
            _keep(plan, key, mode)
            return plan.run()
    if options:
        bad = set(options) - _OPTIONS
        if bad:
            raise TypeError(f"mpicoll: allreduce() got an unexpected keyword argument {sorted(bad)[0]!r}")
    return _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, **options).run()


_OPTIONS = frozenset(("dtype", "compression", "reproducible", "check", "timeout"))
_NO_EXTRA = ()


def _signature_options(options):
    """allreduce's keyword options as part of a kept signature: ``()`` when
    they are all at their defaults (the same signature as a call without
    them), ``(dtype, check)`` when only a dtype name or ``check=False`` is
    given (``dtype="bfloat16"`` over uint16 storage is a signature of its
    own, and so is ``check=False``, which overrides MPICOLL_CHECK), or None:
    an option the kept path cannot serve (compression, reproducible, a
    deadline, pre-flight checks) or an unknown keyword, left to the full
    path, which applies or rejects it."""
    if not _OPTIONS.issuperset(options):
        return None
    if options.get("compression") is not None or options.get("reproducible", False) is not False \
            or options.get("timeout") is not None:
        return None
    return _dtype_check_key(options.get("dtype"), options.get("check"))


def _dtype_check_key(dtype, check):
    """The part of an all-reduce's kept signature that ``dtype`` and
    ``check`` make (both doors, allreduce and iallreduce): ``()`` at their
    defaults, ``(dtype, check)`` for a dtype name and/or ``check=False``, or
    None (a dtype object, check=True: the full path)."""
    if (dtype is not None and type(dtype) is not str) or (check is not None and check is not False):
        return None
    return _NO_EXTRA if dtype is None and check is None else (dtype, check)


def reduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None,
                   check=None, timeout=None):
    """Reduce ``x`` across ranks and give rank i the i-th block of the result.

    ``x`` is taken flat. Blocks follow ``np.array_split(x.ravel(), p)``
    (the first ``n % p`` blocks one element longer) unless ``counts`` gives
    every rank's block length (they must add up to ``x.size``). Returns a
    1-D array with this rank's block (``out`` if given).
    """
    return _reduce_scatter(x, op, comm, counts, out, algorithm, dtype, check, timeout, True)


def allgather(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Gather every rank's ``x`` (same shape and dtype everywhere) to every rank.

    Returns an array of shape ``(p,) + x.shape``: row i is rank i's ``x``.
    Any fixed-size numpy dtype works, since nothing is reduced.
    """
    return _allgather(x, comm, out, algorithm, check, timeout, True)


def bcast(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None):
    """Copy root's ``x`` into every rank's ``x`` (in place; same shape and dtype everywhere).

    ``x`` must be a writable, C-contiguous buffer. Returns ``x``.
    """
    # The short path, written out as allreduce's: a kept signature whose
    # call runs whole in C (kept._gate) is called first, without _door's
    # frames (~0.2 us each on a ~1.5 us call); MISS, or no such entry,
    # goes the usual way, which decides and raises.
    if type(x) is np.ndarray and type(root) is int and type(algorithm) is str and check is None \
            and timeout is None:
        if comm is None:
            st = _by_handle.get(_WORLD_HANDLE)
        else:
            st = _by_handle.get(comm.handle) if isinstance(comm, MPI.Comm) else None
        if st is not None:
            key = ("bcast", x.shape, x.dtype, root, algorithm)
            k = st.plans._d.get(key)
            if k is not None:
                fast = k.fast
                if fast is not None and fast(x) is not _MISS:
                    st.plans.touch(key)
                    return x
    return _bcast(x, root, comm, algorithm, check, timeout, True)


def reduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None, timeout=None):
    """Reduce ``x`` across ranks to ``root``.

    Returns the result (``out`` if given) on root and None elsewhere; ``out``
    is only looked at on root.
    """
    return _reduce(x, op, root, comm, out, algorithm, dtype, check, timeout, True)


# ---- nonblocking ----------------------------------------------------------------

def iallreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
               reproducible=False, check=None, timeout=None):
    """Start an all-reduce; returns an ``mpicoll.Request`` (``wait()`` returns
    the result). Same arguments as ``allreduce``; every algorithm name works.
    Do not touch ``x`` or ``out`` before the request completes."""
    # (the checks of _plain_call, _opkey, _dtype_check_key and _mode written
    # out for the usual call: each function call costs ~0.1 us here)
    o = op if type(op) is str else _opkey(op)
    extra = _NO_EXTRA if dtype is None and check is None else _dtype_check_key(dtype, check)
    if o is not None and extra is not None and type(x) is np.ndarray and type(algorithm) is str \
            and compression is None and timeout is None and reproducible is False:
        # allreduce's signature, kept apart from the blocking form's: "auto"
        # may decide otherwise for a nonblocking call (select: shm's C path
        # is blocking only)
        mode = 0 if out is None else 1 if out is x else 2
        key = ("iallreduce", x.shape, x.dtype, o, algorithm, mode) + extra
        return _door(key, comm, (x, out), lambda nb: _plan.allreduce(
            x, op, comm=comm, out=out, algorithm=algorithm, dtype=dtype, check=check, nonblocking=nb), False, mode)
    return _plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, dtype=dtype, compression=compression,
                           reproducible=reproducible, check=check, timeout=timeout, nonblocking=True).start()


def ireduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None, check=None,
                    timeout=None):
    """Nonblocking ``reduce_scatter``; returns a Request."""
    return _reduce_scatter(x, op, comm, counts, out, algorithm, dtype, check, timeout, False)


def iallgather(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``allgather``; returns a Request."""
    return _allgather(x, comm, out, algorithm, check, timeout, False)


def ibcast(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``bcast``; returns a Request."""
    return _bcast(x, root, comm, algorithm, check, timeout, False)


def ireduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None, timeout=None):
    """Nonblocking ``reduce``; returns a Request (its result is None off root)."""
    return _reduce(x, op, root, comm, out, algorithm, dtype, check, timeout, False)


# ---- persistent --------------------------------------------------------------------

def allreduce_init(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
                   reproducible=False, check=None, timeout=None) -> Persistent:
    """A persistent all-reduce (MPI-4 ``MPI_Allreduce_init``): validated and
    decided once, then ``req.start(); req.wait()`` (or ``req()``) as often
    as needed, in the same order on every rank. ``x`` and ``out`` are bound:
    write new input into ``x`` between runs. With ``algorithm="mpi"`` (or
    when "auto" picks it) the MPI library's own persistent collective is
    used where it has one. Creating it is collective (like MPI's)."""
    return Persistent(_plan.allreduce(x, op, comm=comm, out=out, algorithm=algorithm, dtype=dtype,
                                            compression=compression, reproducible=reproducible, check=check,
                                            timeout=timeout, nonblocking=True))


def reduce_scatter_init(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None,
                        check=None, timeout=None) -> Persistent:
    """Persistent ``reduce_scatter`` (see allreduce_init)."""
    return Persistent(_plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm,
                                                 dtype=dtype, check=check, timeout=timeout, nonblocking=True))


def allgather_init(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None) -> Persistent:
    """Persistent ``allgather`` (see allreduce_init)."""
    return Persistent(_plan.allgather(x, comm=comm, out=out, algorithm=algorithm, check=check,
                                            timeout=timeout, nonblocking=True))


def bcast_init(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None) -> Persistent:
    """Persistent ``bcast`` (see allreduce_init)."""
    return Persistent(_plan.bcast(x, root, comm=comm, algorithm=algorithm, check=check, timeout=timeout,
                                        nonblocking=True))


def reduce_init(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None,
                timeout=None) -> Persistent:
    """Persistent ``reduce`` (see allreduce_init)."""
    return Persistent(_plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype,
                                         check=check, timeout=timeout, nonblocking=True))


# ---- explain -----------------------------------------------------------------------

def explain(nbytes: int, *, comm=None, op="sum", dtype="float32", nonblocking=False) -> select.Choice:
    """Which all-reduce algorithm "auto" picks for an ``nbytes`` message, and why
    (forced by the environment, a tuning profile's entry or model, or the
    fixed defaults: the reason says which); ``nonblocking=True``: for
    ``iallreduce`` and ``allreduce_init`` (shm's C path is blocking only).
    Collective on a communicator's first use (it settles the profile and
    layout every rank agrees on)."""
    from . import dtypes as _dtypes
    from .commstate import state
    from .mpitypes import reduces_natively

    comm = check_intracomm(comm)
    dt = _dtypes.BY_NAME[dtype] if isinstance(dtype, str) and dtype in _dtypes.BY_NAME \
        else _dtypes.of_numpy(np.dtype(dtype))
    o = _ops.resolve(op)
    o.check_dtype(dt)
    forced, _, _ = _args.env_settings()
    st = state(comm)
    if forced and forced != "auto":
        from . import algorithms as _alg

        if _alg.has("allreduce", forced):
            return _hand_off(select.Choice(forced, f"forced by {ENV_ALGORITHM}"), st, int(nbytes), dt, o)
    c = select.allreduce(st.size, int(nbytes), o.name, dt.name, native_dtype=reduces_natively(dt, o),
                         profile=st.profile, ranks_per_node=st.ranks_per_node, nodes=st.nodes,
                         link_weights=st.extra.get("hetero_ring"), nonblocking=bool(nonblocking))
    if st.profile_note:
        c = c._replace(reason=f"{c.reason} ({st.profile_note})")
    return _hand_off(c, st, int(nbytes), dt, o)


def _hand_off(c: select.Choice, st, nbytes: int, dt, o) -> select.Choice:
    """Say so where the algorithm runs as the other one: shm's windows only
    reach one node, so on several it runs hierarchical (shm within each
    node, then across); hierarchical on one node has nothing to cross and
    is shm. Across nodes, also the algorithm the nodes' slices are
    all-reduced with (hierarchical's ``cross``, as its prepare decides it;
    collective on the communicator's first use: the cross communicator)."""
    nodes = st.nodes
    if c.name == "hierarchical" and nodes == 1:
        return c._replace(reason=f"{c.reason}; on one node hierarchical runs as shm")
    if c.name in ("shm", "hierarchical") and nodes > 1:
        from .algorithms import hierarchical as _hier

        itemsize = dt.storage.itemsize
        x = _hier.cross_choice(st, nbytes // itemsize, itemsize, dt, o)
        shm_note = f"; on {nodes} nodes shm runs as hierarchical" if c.name == "shm" else ""
        return c._replace(reason=f"{c.reason}{shm_note}; across nodes: {x.name} ({x.reason})")
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
    return _scatter(x, root, comm, out, counts, algorithm, check, timeout, True)


def gather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Collect every rank's ``x`` on root: shape ``(p,) + x.shape`` (row i from
    rank i), or with ``counts`` the flat concatenation. ``x`` may be root's
    own row/block of ``out`` (in place). Returns the result on root, None elsewhere.
    """
    return _gather(x, root, comm, out, counts, algorithm, check, timeout, True)


def allgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Every rank's ``x`` (``counts[rank]`` elements) concatenated in rank order,
    on every rank (1-D, ``sum(counts)`` elements). ``x`` may be this rank's
    block of ``out`` (in place)."""
    return _allgatherv(x, counts, comm, out, algorithm, check, timeout, True)


def alltoall(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Row j of ``x`` (shape ``(p,) + s``) goes to rank j; row i of the result
    came from rank i. ``out=x`` works in place."""
    return _alltoall(x, comm, out, algorithm, check, timeout, True)


def alltoallv(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """``x`` taken flat: the next ``sendcounts[j]`` elements go to rank j; the
    result (1-D, ``sum(recvcounts)``) holds ``recvcounts[i]`` elements from
    rank i, in rank order. ``out=x`` works in place (equal totals)."""
    return _alltoallv(x, sendcounts, recvcounts, comm, out, algorithm, check, timeout, True)


def iscatter(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``scatter``; returns a Request."""
    return _scatter(x, root, comm, out, counts, algorithm, check, timeout, False)


def igather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``gather``; returns a Request (its result is None off root)."""
    return _gather(x, root, comm, out, counts, algorithm, check, timeout, False)


def iallgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``allgatherv``; returns a Request."""
    return _allgatherv(x, counts, comm, out, algorithm, check, timeout, False)


def ialltoall(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``alltoall``; returns a Request."""
    return _alltoall(x, comm, out, algorithm, check, timeout, False)


def ialltoallv(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None):
    """Nonblocking ``alltoallv``; returns a Request."""
    return _alltoallv(x, sendcounts, recvcounts, comm, out, algorithm, check, timeout, False)


def scatter_init(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None,
                 timeout=None) -> Persistent:
    """Persistent ``scatter`` (see allreduce_init)."""
    return Persistent(_plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                          check=check, timeout=timeout, nonblocking=True))


def gather_init(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None,
                timeout=None) -> Persistent:
    """Persistent ``gather`` (see allreduce_init)."""
    return Persistent(_plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                         check=check, timeout=timeout, nonblocking=True))


def allgatherv_init(x, counts, *, comm=None, out=None, algorithm="auto", check=None,
                    timeout=None) -> Persistent:
    """Persistent ``allgatherv`` (see allreduce_init)."""
    return Persistent(_plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, check=check,
                                             timeout=timeout, nonblocking=True))


def alltoall_init(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None) -> Persistent:
    """Persistent ``alltoall`` (see allreduce_init)."""
    return Persistent(_plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, check=check,
                                           timeout=timeout, nonblocking=True))


def alltoallv_init(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None,
                   timeout=None) -> Persistent:
    """Persistent ``alltoallv`` (see allreduce_init)."""
    return Persistent(_plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm,
                                            check=check, timeout=timeout, nonblocking=True))


# ---- the doors with kept plans: one body per collective, blocking or not ----------
# A call the kept doors take (plain numpy input, no per-call option) goes
# through _door; anything else through the full plan path.

def _go(plan, blocking: bool):
    return plan.run() if blocking else plan.start()


def _bcast(x, root, comm, algorithm, check, timeout, blocking):
    if _plain_call(x, algorithm, check, timeout) and type(root) is int:
        return _door(("bcast", x.shape, x.dtype, root, algorithm), comm, (x,),
                     lambda nb: _plan.bcast(x, root, comm=comm, algorithm=algorithm, nonblocking=nb), blocking)
    return _go(_plan.bcast(x, root, comm=comm, algorithm=algorithm, check=check, timeout=timeout,
                           nonblocking=not blocking), blocking)


def _reduce(x, op, root, comm, out, algorithm, dtype, check, timeout, blocking):
    o = _opkey(op)
    if _plain_call(x, algorithm, check, timeout) and o is not None and type(root) is int \
            and (dtype is None or type(dtype) is str):
        return _door(("reduce", x.shape, x.dtype, o, dtype, root, algorithm, _mode(x, out)), comm, (x, out),
                     lambda nb: _plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype,
                                             nonblocking=nb),
                     blocking, _mode(x, out))
    return _go(_plan.reduce(x, op, root, comm=comm, out=out, algorithm=algorithm, dtype=dtype, check=check,
                            timeout=timeout, nonblocking=not blocking), blocking)


def _allgather(x, comm, out, algorithm, check, timeout, blocking):
    if _plain_call(x, algorithm, check, timeout):
        return _door(("allgather", x.shape, x.dtype, algorithm, out is not None), comm, (x, out),
                     lambda nb: _plan.allgather(x, comm=comm, out=out, algorithm=algorithm, nonblocking=nb),
                     blocking, out is not None)
    return _go(_plan.allgather(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                               nonblocking=not blocking), blocking)


def _scatter(x, root, comm, out, counts, algorithm, check, timeout, blocking):
    a = x if x is not None else out
    c = counts_key(counts)
    if _plain_call(a, algorithm, check, timeout) and type(root) is int and c is not False:
        return _door(("scatter", None if x is None else x.shape, a.dtype, None if out is None else out.shape, c,
                      root, algorithm), comm, (x, out),
                     lambda nb: _plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                              nonblocking=nb),
                     blocking)
    return _go(_plan.scatter(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                             timeout=timeout, nonblocking=not blocking), blocking)


def _gather(x, root, comm, out, counts, algorithm, check, timeout, blocking):
    c = counts_key(counts)
    if _plain_call(x, algorithm, check, timeout) and type(root) is int and c is not False:
        return _door(("gather", x.shape, x.dtype, c, root, algorithm, out is not None), comm, (x, out),
                     lambda nb: _plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm,
                                             nonblocking=nb),
                     blocking)
    return _go(_plan.gather(x, root, comm=comm, out=out, counts=counts, algorithm=algorithm, check=check,
                            timeout=timeout, nonblocking=not blocking), blocking)


def _alltoall(x, comm, out, algorithm, check, timeout, blocking):
    if _plain_call(x, algorithm, check, timeout):
        return _door(("alltoall", x.shape, x.dtype, algorithm, _mode(x, out)), comm, (x, out),
                     lambda nb: _plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, nonblocking=nb),
                     blocking, _mode(x, out))
    return _go(_plan.alltoall(x, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                              nonblocking=not blocking), blocking)


def _reduce_scatter(x, op, comm, counts, out, algorithm, dtype, check, timeout, blocking):
    o = _opkey(op)
    c = counts_key(counts)
    if _plain_call(x, algorithm, check, timeout) and o is not None and c is not False \
            and (dtype is None or type(dtype) is str):
        mode = 0 if out is None else 2
        return _door(("reduce_scatter", x.shape, x.dtype, o, dtype, c, algorithm, mode), comm, (x, out),
                     lambda nb: _plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm,
                                                     dtype=dtype, nonblocking=nb),
                     blocking, mode)
    return _go(_plan.reduce_scatter(x, op, comm=comm, counts=counts, out=out, algorithm=algorithm, dtype=dtype,
                                    check=check, timeout=timeout, nonblocking=not blocking), blocking)


def _allgatherv(x, counts, comm, out, algorithm, check, timeout, blocking):
    c = counts_key(counts)
    if _plain_call(x, algorithm, check, timeout) and c:
        mode = 0 if out is None else 2
        return _door(("allgatherv", x.shape, x.dtype, c, algorithm, mode), comm, (x, out),
                     lambda nb: _plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, nonblocking=nb),
                     blocking, mode)
    return _go(_plan.allgatherv(x, counts, comm=comm, out=out, algorithm=algorithm, check=check, timeout=timeout,
                                nonblocking=not blocking), blocking)


def _alltoallv(x, sendcounts, recvcounts, comm, out, algorithm, check, timeout, blocking):
    sc, rc = counts_key(sendcounts), counts_key(recvcounts)
    if _plain_call(x, algorithm, check, timeout) and sc and rc:
        mode = 0 if out is None else 2
        return _door(("alltoallv", x.shape, x.dtype, sc, rc, algorithm, mode), comm, (x, out),
                     lambda nb: _plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm,
                                                nonblocking=nb),
                     blocking, mode)
    return _go(_plan.alltoallv(x, sendcounts, recvcounts, comm=comm, out=out, algorithm=algorithm, check=check,
                               timeout=timeout, nonblocking=not blocking), blocking)


# ---- the gated doors' short path in C -------------------------------------------------
# Where csrc/native.c is built (and MPICOLL_NATIVE is not 0), the doors whose
# kept calls are gated in C (allreduce, bcast, reduce, reduce_scatter,
# allgather, allgatherv, alltoall, alltoallv, scatter, gather, and their
# I-forms) are native.Door objects over the functions above: a repeated
# call with the usual arguments (a numpy array, a string op, a list or tuple
# of counts, comm, out, algorithm, root) builds
# the same key those functions build, finds the kept entry and runs its
# gated call without a Python frame (~0.8 us of a 3 us all-reduce, p = 2,
# 8 B); any other call goes to the function itself, which decides and
# raises as before. ``door.__wrapped__`` is the function.

def _c_doors() -> None:
    mod = _native.module()
    if mod is None:
        return
    g = globals()
    for name in ("allreduce", "iallreduce", "bcast", "ibcast", "alltoall", "ialltoall", "gather", "igather", "reduce",
                 "ireduce", "allgather", "iallgather", "reduce_scatter", "ireduce_scatter", "scatter", "iscatter",
                 "allgatherv", "iallgatherv", "alltoallv", "ialltoallv"):
        fn = g[name]
        # (the kept signature's name: an I-form shares its blocking form's, but for iallreduce)
        key = name if name == "iallreduce" or not name.startswith("i") else name[1:]
        door = mod.Door(getattr(mod, "D_" + name.upper()), fn, _by_handle, _WORLD_HANDLE, MPI.Comm, key,
                        started_long, _MISS)
        g[name] = functools.update_wrapper(door, fn)


_c_doors()
