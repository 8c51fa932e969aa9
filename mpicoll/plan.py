"""The plan layer: one path from a call's arguments to a validated plan.

Every front door - the functions (``mpicoll.allreduce``...), the
nonblocking ``i*`` forms, the persistent ``*_init`` forms, ``mpicoll.Comm``,
compression and the bucketer - builds its call through the functions here,
so all of them accept and reject exactly the same things, with the same
messages. A plan is built in three stages, always in this order:

1. **local checks** (no message sent): the arguments, the environment
   (``MPICOLL_ALGORITHM``, ``MPICOLL_CHECK``, ``MPICOLL_TIMEOUT``), the
   ``check`` flag, the output buffer, op and dtype, the algorithm's name
   and knobs. A mistake raises TypeError/ValueError on the rank that made
   it, before anything collective happens, so the others are not left
   waiting inside a collective that one rank never entered;
2. **the communicator's state** (``commstate.state``: a collective Dup on first
   use, which also settles the tuning profile and node layout every rank
   agrees on);
3. **the decision** ("auto" resolved by ``select`` from facts identical on
   every rank), the optional pre-flight agreement check (``check=True``),
   and the algorithm's collective set-up (``prepare``: a shared-memory
   window).

The plan then runs under one of the drivers (``mpicoll.schedule``): blocking
(``Plan.run``), nonblocking (``Plan.start`` -> ``engine.Request``), or as a
persistent request (``Persistent``: validation, decision and scratch
settled once, ``start()``/``wait()`` many times).

This module holds the builders, one per collective, and the decision
(stage 3). The other jobs have their own modules: the local checks
(stage 1) in mpicoll/arguments.py, the ``Plan`` object in
mpicoll/runtime.py, the kept plans a builder files in the plan cache in
mpicoll/kept.py, persistent requests in mpicoll/persistent.py.
"""
from __future__ import annotations

import math
import time

import numpy as np

from . import buffers, select
from . import algorithms as _alg
from . import check as _check
from . import schedule as _sched
from .algorithms import mpi as _mpi
from .algorithms.common import block_bounds, counts_to_bounds
from .arguments import check_flag, env_settings, knobs_of, reduction, requested, root_of, timeout_of
from .buffers import Copy, may_share_memory as _share
from .commstate import check_intracomm, state, wait_until
from .kept import (KeptAllgather, KeptAllgatherv, KeptAllreduce, KeptAlltoall, KeptAlltoallv, KeptBcast, KeptGather,
                   KeptReduce, KeptReduceScatter, KeptScatter, _kept_rooted)
from .mpitypes import reduces_natively
from .runtime import Plan, _finish, _then

def _settle(st, collective, name, entry, knobs, buf, check_on, sig, timeout=None, red=None):
    """Stage 3 after the decision: pre-flight agreement, then collective
    set-up. Returns the knobs the schedule runs with: the call's, and any
    the algorithm's ``prepare`` decided (hierarchical's cross algorithm)."""
    if check_on:
        _check.preflight(st, collective, True, algorithm=name, timeout=timeout, **sig)
    if entry is not None and entry.prepare is not None and st.size > 1:
        _meet_before_setup(st, collective, name, timeout)
        decided = entry.prepare(st, buf, red, **knobs)
        if decided:
            knobs = {**knobs, **decided}
    return knobs


def _meet_before_setup(st, collective, name, timeout):
    """The first time an algorithm's ``prepare`` runs on a communicator it
    sets up collectively - node and cross communicators, the shared
    window, hetero_ring's link times - through MPI calls with no deadline
    of their own. So that a rank missing from that first call gives the
    others CollectiveTimeout at ``timeout`` rather than a hang, every rank
    first meets the others in an Ibarrier under the call's deadline (none
    without one). Once per collective, algorithm and communicator; the
    same on every rank whatever its timeout, since the calls match."""
    met = st.extra.setdefault("met-before-setup", set())
    if (collective, name) in met:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    wait_until(st.comm.Ibarrier(), deadline, st.rank, collective, f"{name}'s first set-up on this communicator",
               st.seq)
    met.add((collective, name))


def options(collective, algorithm, check, timeout, knobs):
    """The local checks every collective shares: (algorithm name asked for,
    its registry entry or None for "auto", knobs, check on?, timeout)."""
    forced, env_check, env_timeout = env_settings()
    check_on = check_flag(check, env_check)
    timeout = timeout_of(timeout, env_timeout)
    name = requested(collective, algorithm, forced)
    entry = None if name == "auto" else _alg.get(collective, name)
    knobs = knobs_of(entry, knobs) if entry is not None else {}
    return name, entry, knobs, check_on, timeout


def _decide(st, collective, name, entry, knobs, buf, check_on, sig, native_dtype=True, timeout=None):
    """Stage 3 for the collectives other than allreduce: "auto" resolved by
    select.native_first, then _settle. Returns (name, entry, knobs): the
    knobs the schedule runs with, any that ``prepare`` decided included."""
    if st.size == 1:
        name = "mpi" if name == "auto" else name
        if check_on:
            _check.preflight(st, collective, True, algorithm=name, **sig)
        return name, entry, knobs
    if entry is None:
        name = select.native_first(collective, st.size, buf.nbytes, native_dtype=native_dtype).name
        entry = _alg.get(collective, name)
    knobs = _settle(st, collective, name, entry, knobs, buf, check_on, sig, timeout)
    return name, entry, knobs


def _blocking_pool(plan, nonblocking):
    if not nonblocking:
        plan.pool = plan.st.pool
    return plan


# ---- allreduce --------------------------------------------------------------------

_NO_KNOBS = {}


def allreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None, compression=None,
              reproducible=False, check=None, timeout=None, knobs=None, nonblocking=False) -> Plan:
    """The plan of an all-reduce (see mpicoll.allreduce for the arguments)."""
    forced, env_check, env_timeout = env_settings()
    check_on = check_flag(check, env_check)
    plan = _allreduce(x, op, comm, out, algorithm, dtype, compression, reproducible, check_on, timeout, knobs,
                      nonblocking, forced, env_timeout)
    plan.check_sig = check_on
    return plan


def _allreduce(x, op, comm, out, algorithm, dtype, compression, reproducible, check_on, timeout, knobs,
               nonblocking, forced, env_timeout) -> Plan:
    timeout = timeout_of(timeout, env_timeout)
    if not isinstance(reproducible, bool):
        raise TypeError(f"mpicoll: reproducible must be a bool, not {type(reproducible).__name__}")
    if compression is not None:
        return _compressed(x, op, comm, out, algorithm, dtype, compression, reproducible, check_on, timeout,
                           forced, nonblocking)
    arr, dt, stage = buffers.as_reducible(x, dtype)
    red = reduction(op, dt)
    name = requested("allreduce", algorithm, forced)
    entry = None if name == "auto" else _alg.get("allreduce", name)
    knobs = knobs_of(entry, knobs) if entry is not None else (knobs or {})
    if knobs and entry is None:
        raise ValueError("mpicoll: knobs need a named algorithm, not 'auto'")
    comm = check_intracomm(comm)
    if out is None:
        result = np.empty(arr.shape, arr.dtype)
        src = buffers.storage(arr, dt)
    else:
        result = buffers.output(out, arr.shape, arr.dtype)
        src = None if buffers.same_memory(result, arr) else buffers.storage(arr, dt)
    work, unstage = buffers.aligned_output(result)  # a misaligned out: arr is then a staged copy, src not None
    flat = buffers.storage(work, dt)
    # -- stage 2 --
    st = state(comm, timeout, "allreduce")
    p = st.size
    native = reduces_natively(dt, red.op)
    # -- stage 3 --
    if p == 1:
        name = "mpi" if name == "auto" else name
        if check_on:
            _check.preflight(st, "allreduce", True, count=arr.size, dtype=dt.name, op=red.op.name, algorithm=name)

        def copy():
            if src is not None:
                flat[...] = src

        plan = Plan(st, "allreduce", name, flat.nbytes, result, None, prologue=copy,
                    finish=_then(_finish(st, red, flat), unstage), timeout=timeout, stage=stage)
        if stage is None and unstage is None and flat.dtype == arr.dtype:
            plan.kept = KeptAllreduce(st, name, None, _NO_KNOBS, red, False)
        return plan
    if reproducible:
        from .algorithms import reproducible as _rep

        name = "reproducible"
        _settle(st, "allreduce", name, None, {}, flat, check_on,
                dict(count=arr.size, dtype=dt.name, op=red.op.name), timeout)
        _rep.prepare(st, flat)
        plan = Plan(st, "allreduce", name, flat.nbytes, result, lambda ctx: _rep.allreduce(ctx, flat, red, src),
                    finish=_then(_finish(st, red, flat), unstage), timeout=timeout, stage=stage)
        return _blocking_pool(plan, nonblocking)
    if entry is None:
        # (hetero_ring's measured link weights, once a call measured them:
        # the same on every rank, from one allgather)
        c = select.allreduce(p, flat.nbytes, red.op.name, dt.name, native_dtype=native, profile=st.profile,
                             ranks_per_node=st.ranks_per_node, nodes=st.nodes,
                             link_weights=st.extra.get("hetero_ring"), nonblocking=nonblocking,
                             deadline=timeout is not None)
        name = c.name
        entry = _alg.get("allreduce", name)
        knobs = {"segment_bytes": c.segment_bytes} if c.segment_bytes and "segment_bytes" in entry.knobs \
            else _NO_KNOBS
        if c.knobs:  # what the choice depends on (hetero_ring's weights)
            knobs = {**knobs, **{k: v for k, v in c.knobs if k in entry.knobs}}
    knobs = _settle(st, "allreduce", name, entry, knobs, flat, check_on,
                    dict(count=arr.size, dtype=dt.name, op=red.op.name), timeout, red)
    sched = entry.schedule
    plan = Plan(st, "allreduce", name, flat.nbytes, result,
                (lambda ctx: sched(ctx, flat, red, src, **knobs)) if knobs else (lambda ctx: sched(ctx, flat, red, src)),
                finish=_then(_finish(st, red, flat), unstage), timeout=timeout, stage=stage)
    if entry.native is not None:
        plan.native = entry.native(st.comm, flat, red, src)
    if timeout is None and stage is None and unstage is None and flat.dtype == arr.dtype:
        plan.kept = KeptAllreduce(st, name, entry, knobs, red, entry.native is not None)
    if (entry.compilable or entry.program is not None) and timeout is None:
        plan.recordable = (entry, flat, red, src, knobs)
    return _blocking_pool(plan, nonblocking)


def _compressed(x, op, comm, out, algorithm, dtype, compression, reproducible, check_on, timeout, forced,
                nonblocking) -> Plan:
    from . import compression as _compression

    if reproducible:
        raise ValueError("mpicoll: compression is lossy; it cannot be combined with reproducible=True")
    arr, stage = buffers.as_input(x, aligned=True)
    if dtype is not None and np.dtype(dtype) != arr.dtype:
        raise TypeError(f"mpicoll: compression applies to float32 and float64 data, not dtype={dtype!r}")
    o, c = _compression.check_args(arr, op, compression)
    if not isinstance(algorithm, str):
        raise TypeError(f"mpicoll: algorithm must be a name, not {type(algorithm).__name__}")
    if algorithm != "auto":
        raise ValueError(f"mpicoll: compression {c.name!r} chooses its own algorithm; algorithm must be 'auto'")
    comm = check_intracomm(comm)
    result = buffers.output(out, arr.shape, arr.dtype)
    buffers.same_memory(result, arr)  # ValueError on a partial overlap; in place is fine
    st = state(comm, timeout, "allreduce")
    name = f"compressed-{c.name}"
    if check_on:
        _check.preflight(st, "allreduce", True, count=arr.size, dtype=arr.dtype.str, op=o.name, algorithm=name,
                         timeout=timeout)
    src, dst = arr.reshape(-1), result.reshape(-1)
    plan = Plan(st, "allreduce", name, dst.nbytes, result,
                lambda ctx: _compression.schedule(ctx, src, dst, o.average, c), timeout=timeout, stage=stage)
    return _blocking_pool(plan, nonblocking)


# ---- reduce_scatter -----------------------------------------------------------------

def reduce_scatter(x, op="sum", *, comm=None, counts=None, out=None, algorithm="auto", dtype=None, check=None,
                   timeout=None, knobs=None, nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout = options("reduce_scatter", algorithm, check, timeout, knobs)
    arr, dt, stage = buffers.as_reducible(x, dtype)
    red = reduction(op, dt)
    comm = check_intracomm(comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    n = arr.size
    if counts is None:
        bounds = block_bounds(n, p)
    else:
        try:
            counts = [int(c) for c in counts]
        except (TypeError, ValueError):
            raise TypeError(f"mpicoll: counts must be a sequence of ints, not {counts!r}") from None
        if len(counts) != p or any(c < 0 for c in counts) or sum(counts) != n:
            raise ValueError(f"mpicoll: counts must be {p} non-negative block lengths adding up to {n}, got {counts}")
        bounds = counts_to_bounds(counts)
    a, b = bounds[rank]
    result = buffers.output(out, (b - a,), arr.dtype)
    work_out, unstage = buffers.aligned_output(result)
    flat = buffers.storage(work_out, dt)
    srcflat = buffers.storage(arr, dt)
    st = state(comm, timeout, "reduce_scatter")
    pool = {} if nonblocking else st.pool
    # The algorithms reduce in place: never in the caller's input.
    work = _sched.scratch(pool, "reduce_scatter", srcflat.size, srcflat.dtype) if p > 1 else srcflat
    name, entry, knobs = _decide(st, "reduce_scatter", name, entry, knobs, work, check_on,
                          dict(count=n, dtype=dt.name, op=red.op.name, counts=counts),
                          reduces_natively(dt, red.op), timeout)

    prologue = Copy(work, srcflat) if work is not srcflat else None

    finish = _then(Copy(flat, work[a:b]), _then(_finish(st, red, flat), unstage))

    sched = None
    if p > 1:
        s = entry.schedule
        sched = lambda ctx: s(ctx, work, red, bounds, **knobs)  # noqa: E731
    plan = Plan(st, "reduce_scatter", name, srcflat.nbytes, result, sched, prologue=prologue, finish=finish,
                timeout=timeout, stage=stage)
    plan.pool = pool
    if p > 1 and entry.native is not None:  # the registry marks the MPI library's own collective
        plan.native = entry.native(st.comm, work, red, bounds, pool)
    if timeout is None and stage is None and unstage is None and srcflat.dtype == arr.dtype \
            and (p == 1 or plan.native is not None):
        plan.kept = KeptReduceScatter(st, red, bounds)
    return plan


# ---- allgather ----------------------------------------------------------------------

def allgather(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None, knobs=None,
              nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout = options("allgather", algorithm, check, timeout, knobs)
    arr, stage = buffers.as_input(x)
    comm = check_intracomm(comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    result = buffers.output(out, (p,) + arr.shape, arr.dtype)
    flat = buffers.as_bytes(result)
    mine = buffers.as_bytes(arr)
    if _share(flat, mine) and mine.size:
        raise ValueError("mpicoll: x overlaps out (allgather places x in row rank of out itself)")
    plan = allgather_bytes(comm, flat, mine, rank, p, name, entry, knobs, check_on, timeout, result,
                           dict(count=arr.size, dtype=(arr.dtype.str, arr.shape)), nonblocking)
    plan.stage = stage
    if timeout is None and stage is None and (plan.schedule is None or plan.native is not None):
        plan.kept = KeptAllgather(plan.st, flat.nbytes // p if p else 0, plan.schedule is not None)
    return plan


def allgather_bytes(comm, flat, mine, rank, p, name, entry, knobs, check_on, timeout, result, sig, nonblocking,
                    in_place=False) -> Plan:
    """Allgather of equal byte blocks of ``flat``; ``mine`` is copied into
    block ``rank`` first unless ``in_place`` (the drop-in's MPI.IN_PLACE)."""
    block = flat.size // p if p else 0
    bounds = [(i * block, (i + 1) * block) for i in range(p)] if p * block == flat.size \
        else block_bounds(flat.size, p)
    a, b = bounds[rank]
    st = state(comm, timeout, "allgather")
    name, entry, knobs = _decide(st, "allgather", name, entry, knobs, flat, check_on, sig, timeout=timeout)

    prologue = None if in_place else Copy(flat[a:b], mine)
    sched = None
    if p > 1 and flat.size:
        s = entry.schedule
        sched = lambda ctx: s(ctx, flat, bounds, **knobs)  # noqa: E731
    plan = Plan(st, "allgather", name, flat.nbytes, result, sched, prologue=prologue, timeout=timeout)
    if sched is not None and entry.native is not None:
        plan.native = entry.native(st.comm, flat, bounds)
    return _blocking_pool(plan, nonblocking)


# ---- bcast ----------------------------------------------------------------------------

def bcast(x, root=0, *, comm=None, algorithm="auto", check=None, timeout=None, knobs=None,
          nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout = options("bcast", algorithm, check, timeout, knobs)
    arr = buffers.view(x)
    if not arr.flags.c_contiguous:  # a copy would receive the data, not x
        raise ValueError("mpicoll: bcast writes in place, so x must be C-contiguous")
    if not arr.flags.writeable:
        raise ValueError("mpicoll: bcast writes in place, so x must be writable")
    comm = check_intracomm(comm)
    root = root_of(root, comm.Get_size())
    return bcast_bytes(comm, buffers.as_bytes(arr), root, name, entry, knobs, check_on, timeout, x,
                       dict(count=arr.size, dtype=arr.dtype.str, root=root), nonblocking)


def bcast_bytes(comm, data, root, name, entry, knobs, check_on, timeout, result, sig, nonblocking) -> Plan:
    st = state(comm, timeout, "bcast")
    p = st.size
    name, entry, knobs = _decide(st, "bcast", name, entry, knobs, data, check_on, sig, timeout=timeout)
    sched = None
    if p > 1 and data.size:
        s = entry.schedule
        sched = lambda ctx: s(ctx, data, root, **knobs)  # noqa: E731
    plan = Plan(st, "bcast", name, data.nbytes, result, sched, timeout=timeout)
    if sched is not None and entry.native is not None:
        plan.native = entry.native(st.comm, data, root)
    if timeout is None and (sched is None or plan.native is not None):
        plan.kept = KeptBcast(st, root, sched is not None)
    return _blocking_pool(plan, nonblocking)


# ---- reduce ---------------------------------------------------------------------------

def reduce(x, op="sum", root=0, *, comm=None, out=None, algorithm="auto", dtype=None, check=None, timeout=None,
           knobs=None, nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout = options("reduce", algorithm, check, timeout, knobs)
    arr, dt, stage = buffers.as_reducible(x, dtype)
    red = reduction(op, dt)
    comm = check_intracomm(comm)
    root = root_of(root, comm.Get_size())
    is_root = comm.Get_rank() == root
    result = buffers.output(out, arr.shape, arr.dtype) if is_root else None
    src = buffers.storage(arr, dt)
    st = state(comm, timeout, "reduce")
    p = st.size
    pool = {} if nonblocking else st.pool
    unstage = None
    if is_root:
        aligned, unstage = buffers.aligned_output(result)
        work = buffers.storage(aligned, dt)
        copy_in = unstage is not None or not buffers.same_memory(result, arr)
    else:  # the algorithms overwrite their buffer: never the caller's input
        work = _sched.scratch(pool, "reduce", src.size, src.dtype)
        copy_in = True
    name, entry, knobs = _decide(st, "reduce", name, entry, knobs, work, check_on,
                          dict(count=arr.size, dtype=dt.name, op=red.op.name, root=root),
                          reduces_natively(dt, red.op), timeout)

    prologue = Copy(work, src) if copy_in else None
    sched = None
    if p > 1:
        s = entry.schedule
        sched = lambda ctx: s(ctx, work, red, root, **knobs)  # noqa: E731
    plan = Plan(st, "reduce", name, work.nbytes, result, sched, prologue=prologue,
                finish=_then(_finish(st, red, work), unstage) if is_root else None, timeout=timeout, stage=stage)
    plan.pool = pool
    if p > 1 and entry.native is not None:
        plan.native = entry.native(st.comm, work, red, root)
    if timeout is None and stage is None and unstage is None and src.dtype == arr.dtype \
            and (p == 1 or plan.native is not None):
        datatype, mop = _mpi._typed(red)
        plan.kept = KeptReduce(st, datatype, mop, red, root)
    return plan


# ---- scatter, gather, allgatherv, alltoall, alltoallv ----------------------------------
# Data movement on uint8 storage (any fixed-size dtype: nothing is reduced);
# the schedules' signatures are in mpicoll/registry.py.

def _family_args(collective, algorithm, check, timeout, knobs, comm):
    """Stage 1 shared by the five builders: options()'s tuple, in its order, and the communicator:
    (name, entry, knobs, check_on, timeout, comm)."""
    if knobs and algorithm == "auto":
        raise ValueError("mpicoll: knobs need a named algorithm, not 'auto'")
    return options(collective, algorithm, check, timeout, knobs) + (check_intracomm(comm),)


def counts_of(counts, p: int, what: str = "counts") -> list:
    """``p`` non-negative ints, or TypeError/ValueError."""
    if isinstance(counts, (str, bytes)):
        raise TypeError(f"mpicoll: {what} must be a sequence of ints, not {counts!r}")
    try:
        out = [int(c) if isinstance(c, (int, np.integer)) and not isinstance(c, bool) else None for c in counts]
    except TypeError:
        raise TypeError(f"mpicoll: {what} must be a sequence of ints, not {counts!r}") from None
    if any(c is None for c in out):
        raise TypeError(f"mpicoll: {what} must be a sequence of ints, not {counts!r}")
    if len(out) != p or any(c < 0 for c in out):
        raise ValueError(f"mpicoll: {what} must be {p} non-negative block lengths, got {out}")
    return out


def _byte_bounds(counts, itemsize):
    return counts_to_bounds([c * itemsize for c in counts])


def _placed(mine, full, a, what):
    """True if ``mine`` already is block [a, ...) of ``full`` (MPI_IN_PLACE);
    ValueError for any other overlap."""
    if not mine.size or not _share(mine, full):
        return False
    if full.size > a and mine.ctypes.data == full[a:].ctypes.data:
        return True
    raise ValueError(f"mpicoll: {what} overlaps the other buffer other than as this rank's block (in place)")


def family_plan(st, collective, name, entry, knobs, nbytes, result, args, *, prologue=None, timeout=None,
                check_on=False, sig=None, nonblocking=False, empty=False) -> Plan:
    """Stage 3 of the five builders: decide, check, and build the plan whose
    schedule is ``entry.schedule(ctx, *args, **knobs)``. ``nbytes`` and
    ``empty`` must be the same on every rank: the decision depends on the
    one, and skipping the call (no tag, no native call) on the other."""
    p = st.size
    if p == 1:
        name = "mpi" if name == "auto" else name
    elif entry is None:
        name = select.family(collective, p, nbytes).name
        entry = _alg.get(collective, name)
    if p > 1:
        _settle(st, collective, name, entry, knobs, None, check_on, sig, timeout)
    elif check_on:
        _check.preflight(st, collective, True, algorithm=name, timeout=timeout, **sig)
    sched = None
    if p > 1 and not empty:
        s = entry.schedule
        sched = (lambda ctx: s(ctx, *args, **knobs)) if knobs else (lambda ctx: s(ctx, *args))
    plan = Plan(st, collective, name, nbytes, result, sched, prologue=prologue, timeout=timeout)
    if sched is not None and entry.native is not None:
        plan.native = entry.native(st.comm, *args)
    return _blocking_pool(plan, nonblocking)


def _staged(plan: Plan, stage) -> Plan:
    """``plan`` refreshing its private copy of a non-contiguous input at
    every run (buffers.as_input)."""
    plan.stage = stage
    return plan


def scatter(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None,
            knobs=None, nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout, comm = _family_args("scatter", algorithm, check, timeout, knobs, comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    root = root_of(root, p)
    is_root = rank == root
    if x is None and (is_root or out is None):
        raise TypeError("mpicoll: scatter needs x on the root, and x or out on the other ranks")
    arr, stage = buffers.as_input(x) if x is not None else (None, None)
    if counts is None:
        if arr is not None:
            if arr.ndim == 0 or arr.shape[0] != p:
                raise ValueError(f"mpicoll: scatter's x must have shape (p, ...) = ({p}, ...), not {arr.shape}")
            shape = arr.shape[1:]
        else:
            shape = np.shape(out)
        cnts = [math.prod(shape)] * p
    else:
        cnts = counts_of(counts, p)
        if is_root and arr.size != sum(cnts):
            raise ValueError(f"mpicoll: counts add up to {sum(cnts)}, but x has {arr.size} elements")
        shape = (cnts[rank],)
    dtype = arr.dtype if arr is not None else buffers.as_array(out).dtype
    result = buffers.output(out, shape, dtype)
    mine = buffers.as_bytes(result)
    bounds = _byte_bounds(cnts, dtype.itemsize)
    a, b = bounds[rank]
    st = state(comm, timeout, "scatter")
    copy = None
    if is_root:
        full = buffers.as_bytes(arr)
        if not _placed(mine, full, a, "out"):
            copy = Copy(mine, full[a:b])
        buf = full
    else:
        buf = mine
    sig = dict(count=cnts[0] if counts is None else -1, dtype=dtype.str, root=root,
               counts=None if counts is None else cnts)
    plan = _staged(family_plan(st, "scatter", name, entry, knobs, bounds[-1][1], result, (buf, bounds, root),
                               prologue=copy, timeout=timeout, check_on=check_on, sig=sig, nonblocking=nonblocking),
                   stage if is_root else None)
    if plan.stage is None:
        plan.kept = _kept_rooted(KeptScatter, plan, root, bounds, shape, dtype.itemsize)
    return plan


def gather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None,
           knobs=None, nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout, comm = _family_args("gather", algorithm, check, timeout, knobs, comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    root = root_of(root, p)
    is_root = rank == root
    arr, stage = buffers.as_input(x)
    if counts is None:
        cnts = [arr.size] * p
        shape = (p,) + arr.shape
    else:
        cnts = counts_of(counts, p)
        if arr.size != cnts[rank]:
            raise ValueError(f"mpicoll: x has {arr.size} elements, counts[{rank}] is {cnts[rank]}")
        shape = (sum(cnts),)
    bounds = _byte_bounds(cnts, arr.dtype.itemsize)
    a, b = bounds[rank]
    mine = buffers.as_bytes(arr)
    st = state(comm, timeout, "gather")
    copy = None
    result = None
    if is_root:
        result = buffers.output(out, shape, arr.dtype)
        buf = buffers.as_bytes(result)
        if not _placed(mine, buf, a, "x"):
            copy = Copy(buf[a:b], mine)
    else:
        buf = mine
    sig = dict(count=cnts[0] if counts is None else -1, dtype=arr.dtype.str, root=root,
               counts=None if counts is None else cnts)
    plan = _staged(family_plan(st, "gather", name, entry, knobs, bounds[-1][1], result, (buf, bounds, root),
                               prologue=copy, timeout=timeout, check_on=check_on, sig=sig, nonblocking=nonblocking),
                   stage)
    if stage is None:
        plan.kept = _kept_rooted(KeptGather, plan, root, bounds, shape, arr.dtype.itemsize)
    return plan


def allgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None, knobs=None,
               nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout, comm = _family_args("allgatherv", algorithm, check, timeout, knobs,
                                                               comm)
    p, rank = comm.Get_size(), comm.Get_rank()
    arr, stage = buffers.as_input(x)
    cnts = counts_of(counts, p)
    if arr.size != cnts[rank]:
        raise ValueError(f"mpicoll: x has {arr.size} elements, counts[{rank}] is {cnts[rank]}")
    result = buffers.output(out, (sum(cnts),), arr.dtype)
    flat = buffers.as_bytes(result)
    mine = buffers.as_bytes(arr)
    bounds = _byte_bounds(cnts, arr.dtype.itemsize)
    a, b = bounds[rank]
    copy = None
    if not _placed(mine, flat, a, "x"):
        copy = Copy(flat[a:b], mine)
    st = state(comm, timeout, "allgatherv")
    plan = _staged(family_plan(st, "allgatherv", name, entry, knobs, flat.nbytes, result, (flat, bounds),
                               prologue=copy, timeout=timeout, check_on=check_on,
                               sig=dict(count=-1, dtype=arr.dtype.str, counts=cnts), nonblocking=nonblocking,
                               empty=flat.nbytes == 0), stage)
    if stage is None and plan.timeout is None and (plan.native is not None or plan.schedule is None):
        plan.kept = KeptAllgatherv(st, bounds, arr.dtype.itemsize, plan.schedule is not None)
    return plan


def _alltoall_plan(collective, comm, arr, result, scounts, rcounts, name, entry, knobs, check_on, timeout, sig,
                   nonblocking, nbytes) -> Plan:
    src = buffers.as_bytes(arr)
    dst = buffers.as_bytes(result)
    st = state(comm, timeout, collective)
    sb = _byte_bounds(scounts, arr.dtype.itemsize)
    rb = _byte_bounds(rcounts, arr.dtype.itemsize)
    prologue = None
    if buffers.same_memory(dst, src):  # in place: the schedules need the input apart from the output
        pool = {} if nonblocking else st.pool
        work = _sched.scratch(pool, collective + "-in", src.size, np.uint8)

        def prologue(src=src):
            work[...] = src

        src = work
    elif st.size == 1:
        def prologue():
            dst[...] = src
    # alltoallv's totals are rank-local: only alltoall may skip an empty call.
    return family_plan(st, collective, name, entry, knobs, nbytes, result, (src, dst, sb, rb), prologue=prologue,
                       timeout=timeout, check_on=check_on, sig=sig, nonblocking=nonblocking,
                       empty=collective == "alltoall" and src.size == 0)


def alltoall(x, *, comm=None, out=None, algorithm="auto", check=None, timeout=None, knobs=None,
             nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout, comm = _family_args("alltoall", algorithm, check, timeout, knobs, comm)
    p = comm.Get_size()
    arr, stage = buffers.as_input(x)
    if arr.ndim == 0 or arr.shape[0] != p:
        raise ValueError(f"mpicoll: alltoall's x must have shape (p, ...) = ({p}, ...), not {arr.shape}")
    result = buffers.output(out, arr.shape, arr.dtype)
    block = arr.size // p
    plan = _staged(_alltoall_plan("alltoall", comm, arr, result, [block] * p, [block] * p, name, entry, knobs,
                                  check_on, timeout, dict(count=block, dtype=arr.dtype.str), nonblocking, arr.nbytes),
                   stage)
    st = plan.st
    if stage is None and plan.timeout is None and (plan.native is not None or plan.schedule is None):
        plan.kept = KeptAlltoall(st, block * arr.dtype.itemsize, plan.schedule is not None)
    return plan


def alltoallv(x, sendcounts, recvcounts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None,
              knobs=None, nonblocking=False) -> Plan:
    name, entry, knobs, check_on, timeout, comm = _family_args("alltoallv", algorithm, check, timeout, knobs,
                                                               comm)
    p = comm.Get_size()
    arr, stage = buffers.as_input(x)
    sc = counts_of(sendcounts, p, "sendcounts")
    rc = counts_of(recvcounts, p, "recvcounts")
    if arr.size != sum(sc):
        raise ValueError(f"mpicoll: sendcounts add up to {sum(sc)}, but x has {arr.size} elements")
    result = buffers.output(out, (sum(rc),), arr.dtype)
    # Only the ranks' own counts are known here, so the decision must not
    # depend on them: nbytes -1 (select.family's size-free rule).
    plan = _staged(_alltoall_plan("alltoallv", comm, arr.reshape(-1), result, sc, rc, name, entry, knobs, check_on,
                                  timeout, dict(count=-1, dtype=arr.dtype.str), nonblocking, -1), stage)
    if stage is None and plan.timeout is None and (plan.native is not None or plan.schedule is None):
        size = arr.dtype.itemsize
        plan.kept = KeptAlltoallv(plan.st, _byte_bounds(sc, size), _byte_bounds(rc, size), size,
                                  plan.schedule is not None)
    return plan
