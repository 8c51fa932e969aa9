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
2. **the communicator's state** (``comm.state``: a collective Dup on first
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
"""
from __future__ import annotations

import math
import time

import numpy as np
from mpi4py import MPI

from . import _env, buffers, select
from . import algorithms as _alg
from . import check as _check
from . import engine
from . import ops as _ops
from . import schedule as _sched
from .algorithms import mpi as _mpi
from .algorithms.common import block_bounds, counts_to_bounds
from .comm import check_intracomm, state
from .kernels import Reduction
from .mpitypes import reduces_natively

ENV_ALGORITHM = "MPICOLL_ALGORITHM"
ENV_TIMEOUT = "MPICOLL_TIMEOUT"

# ---- local checks -------------------------------------------------------------

_reductions = {}


def reduction(op, dt) -> Reduction:
    """The validated Reduction for (op, dtype), cached: small all-reduces are
    latency-bound and building one costs about a microsecond."""
    key = (op, dt.code) if isinstance(op, str) else None
    red = _reductions.get(key) if key else None
    if red is None:
        red = Reduction(_ops.resolve(op), dt)  # raises if op is not defined for dt
        if key:
            _reductions[key] = red
    return red


_settings = {}


def env_settings():
    """(forced algorithm or None, check from env, timeout from env), validated;
    memoised on the raw values (read on every call)."""
    raw = (_env.get(ENV_ALGORITHM), _env.get(_check.ENV_CHECK), _env.get(ENV_TIMEOUT))
    got = _settings.get(raw)
    if got is None:
        forced, chk, tmo = raw
        forced = forced.strip() if forced else None
        if forced and forced != "auto" and not any(_alg.has(c, forced) for c in _alg.COLLECTIVES):
            raise ValueError(f"mpicoll: {ENV_ALGORITHM}={forced!r} is not a known algorithm; "
                             f"all-reduce algorithms: {', '.join(_alg.names('allreduce'))}")
        env_check = _check.enabled(None)  # raises on a bad MPICOLL_CHECK
        timeout = None
        if tmo is not None and tmo.strip().lower() not in ("", "0", "none", "off"):
            try:
                timeout = float(tmo)
            except ValueError:
                raise ValueError(f"mpicoll: {ENV_TIMEOUT}={tmo!r}; use a number of seconds (0 or unset: no "
                                 "timeout)") from None
            if not timeout > 0:
                raise ValueError(f"mpicoll: {ENV_TIMEOUT}={tmo!r}; use a positive number of seconds")
        got = _settings[raw] = (forced or None, env_check, timeout)
        if len(_settings) > 64:
            _settings.clear()
            _settings[raw] = got
    return got


def requested(collective: str, algorithm, forced) -> str:
    """The algorithm name asked for, validated (no MPI calls). The environment's
    forced name applies to every collective that has an algorithm of that name."""
    if not isinstance(algorithm, str):
        raise TypeError(f"mpicoll: algorithm must be a name, not {type(algorithm).__name__}")
    if forced and (forced == "auto" or _alg.has(collective, forced)):
        return forced
    if algorithm != "auto":
        _alg.get(collective, algorithm)  # ValueError if unknown
    return algorithm


def check_flag(check, env_check) -> bool:
    if check is None:
        return env_check
    if not isinstance(check, bool):
        raise TypeError(f"mpicoll: check must be True, False or None, not {type(check).__name__}")
    return check


def timeout_of(timeout, env_timeout):
    if timeout is None:
        return env_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)):
        raise TypeError(f"mpicoll: timeout must be a number of seconds or None, not {type(timeout).__name__}")
    timeout = float(timeout)
    if not timeout > 0:
        raise ValueError(f"mpicoll: timeout must be positive (seconds), not {timeout}")
    return timeout


def root_of(root, size: int) -> int:
    if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
        raise TypeError(f"mpicoll: root must be an int, not {type(root).__name__}")
    if not 0 <= root < size:
        raise ValueError(f"mpicoll: root {root} out of range for a communicator of size {size}")
    return int(root)


def knobs_of(entry, knobs) -> dict:
    if knobs:
        entry.check_knobs(knobs)
    return knobs or {}


# ---- the plan ---------------------------------------------------------------------

def enter(st) -> None:
    """Take ``st.busy`` for one thread's blocking run or start of a collective.

    MPI requires the collectives of one communicator to be called in the
    same order on every rank, which two threads of a rank calling at once
    cannot promise; mpicoll's blocking scratch and call sequence are per
    communicator too. So a second thread on the same communicator is an
    error, said at once rather than found later as a wrong sum (use one
    communicator per thread: ``comm.Dup()``). ``acquire(False)`` is atomic:
    the check cannot race.

    A request's done-callback may not start a collective either: it runs
    when the request completes, which is a different point of the program
    on each rank, so the ranks would not call their collectives in the same
    order (engine.py, the threading contract)."""
    if engine.in_callback():
        raise RuntimeError(
            f"mpicoll: a collective was started from a request's done-callback (rank {st.rank}); callbacks "
            "run whenever the request completes, at a different point on each rank, so collectives started "
            "there cannot be matched in order across ranks - start it from the program's own flow (after wait())")
    if not st.busy.acquire(False):
        raise RuntimeError(
            f"mpicoll: another thread is inside a collective on this communicator (rank {st.rank}); mpicoll "
            "collectives on one communicator must not be called from two threads at once - give each "
            "thread its own communicator (comm.Dup())")


class Plan:
    """One validated collective call, ready to run.

    ``schedule(ctx)`` makes the schedule generator; ``stage()`` runs first at
    every (re)start (it refreshes a private copy of an input that was not
    contiguous or aligned, see buffers.as_input), then ``prologue()`` (copy
    the input into a work buffer),
    ``finish()`` after it (avg's scaling, copies out); both may be None.
    """

    __slots__ = ("st", "collective", "algorithm", "nbytes", "result", "schedule", "prologue", "finish",
                 "timeout", "pool", "native", "check_sig", "entry", "stage", "kept")

    def __init__(self, st, collective, algorithm, nbytes, result, schedule, *, prologue=None, finish=None,
                 timeout=None, native=None, stage=None):
        self.st = st
        self.stage = stage
        self.collective = collective
        self.algorithm = algorithm
        self.nbytes = nbytes
        self.result = result
        self.schedule = schedule
        self.prologue = prologue
        self.finish = finish
        self.timeout = timeout
        self.pool = None  # scratch: st.pool when blocking, own dict when nonblocking/persistent
        self.native = native  # schedule.NativeCall for the MPI library's collective (fast paths)
        self.check_sig = False  # the pre-flight check ran when the plan was built (per call: not reusable)
        # A plancache.Kept that replays this call's decision on new buffers
        # (set by the builders whose call it can serve; the front door files
        # it under the call's signature), or None.
        self.kept = None

    def _context(self, pool):
        st = self.st
        seq, tag = st.next_seq()
        return _sched.Context(st, tag, pool, (self.collective, self.algorithm, self.nbytes, seq))

    def inputs(self) -> None:
        """What every (re)start does first: refresh a staged input, then the prologue."""
        if self.stage is not None:
            self.stage()
        if self.prologue is not None:
            self.prologue()

    def run(self):
        """Blocking."""
        st = self.st
        enter(st)
        try:
            self.inputs()
            if self.schedule is not None:
                if self.native is not None and self.timeout is None:
                    st.next_seq()  # the call's number, for the flight recorder
                    self.native.blocking()
                    if self.native.after is not None:
                        self.native.after()
                else:
                    deadline = None if self.timeout is None else time.monotonic() + self.timeout
                    _sched.run(self.schedule(self._context(self.pool if self.pool is not None else st.pool)),
                               deadline)
            if self.finish is not None:
                self.finish()
        finally:
            st.busy.release()
        return self.result

    def start(self, pool=None) -> engine.Request:
        """Nonblocking: the request runs the schedule under the progress engine."""
        enter(self.st)
        try:
            return self._start(pool)
        finally:
            self.st.busy.release()

    def _start(self, pool):
        self.inputs()
        if self.schedule is None:
            if self.finish is not None:
                self.finish()
            return engine.Request.completed(self.result)
        native = self.native
        if native is not None and self.timeout is None:
            # The MPI library's own collective: its MPI_I... request is the
            # whole request (no schedule, context or scratch), and wait()
            # can block in the library (engine.NativeRequest).
            self.st.next_seq()
            return engine.start_native(native.start(), self.result, _then(native.after, self.finish), self.nbytes,
                                       self.st)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        finish = self.finish
        if pool is None:
            # Scratch of completed nonblocking calls is reused (a fresh 16 MiB
            # temporary costs about as much in page faults as reducing it).
            idle = self.st.idle_pools
            pool = idle.pop() if idle else {}
            done = finish

            def finish():
                if done is not None:
                    done()
                if len(idle) < 4:
                    idle.append(pool)

        gen = self.schedule(self._context(pool))
        return engine.start(gen, self.result, finish, deadline, self.nbytes, self.st)


def _then(first, second):
    """Two optional finishing steps as one (None when both are None)."""
    if first is None or second is None:
        return first or second

    def both():
        first()
        second()
    return both


def _finish(st, red, flat):
    """avg's division after the sum, or nothing."""
    if red.op.average:
        size = st.size
        return lambda: red.finish(flat, size)
    return None


def _settle(st, collective, name, entry, knobs, buf, check_on, sig, timeout=None):
    """Stage 3 after the decision: pre-flight agreement, then collective set-up."""
    if check_on:
        _check.preflight(st, collective, True, algorithm=name, timeout=timeout, **sig)
    if entry is not None and entry.prepare is not None and st.size > 1:
        entry.prepare(st, buf, **knobs)


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
    select.simple, then _settle. Returns (name, entry)."""
    if st.size == 1:
        name = "mpi" if name == "auto" else name
        if check_on:
            _check.preflight(st, collective, True, algorithm=name, **sig)
        return name, entry
    if entry is None:
        name = select.simple(collective, st.size, buf.nbytes, native_dtype=native_dtype).name
        entry = _alg.get(collective, name)
    _settle(st, collective, name, entry, knobs, buf, check_on, sig, timeout)
    return name, entry


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
        c = select.allreduce(p, flat.nbytes, red.op.name, dt.name, native_dtype=native, profile=st.profile,
                             ranks_per_node=st.ranks_per_node, nodes=st.nodes)
        name = c.name
        entry = _alg.get("allreduce", name)
        knobs = {"segment_bytes": c.segment_bytes} if c.segment_bytes and "segment_bytes" in entry.knobs \
            else _NO_KNOBS
    _settle(st, "allreduce", name, entry, knobs, flat, check_on, dict(count=arr.size, dtype=dt.name, op=red.op.name),
            timeout)
    sched = entry.schedule
    plan = Plan(st, "allreduce", name, flat.nbytes, result,
                (lambda ctx: sched(ctx, flat, red, src, **knobs)) if knobs else (lambda ctx: sched(ctx, flat, red, src)),
                finish=_then(_finish(st, red, flat), unstage), timeout=timeout, stage=stage)
    if entry.native is not None:
        plan.native = entry.native(st.comm, flat, red, src)
    if timeout is None and stage is None and unstage is None and flat.dtype == arr.dtype:
        plan.kept = KeptAllreduce(st, name, entry, knobs, red, entry.native is not None)
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
    name, entry = _decide(st, "reduce_scatter", name, entry, knobs, work, check_on,
                          dict(count=n, dtype=dt.name, op=red.op.name, counts=counts),
                          reduces_natively(dt, red.op), timeout)

    def prologue():
        if work is not srcflat:
            work[...] = srcflat

    def finish():
        flat[...] = work[a:b]
        red.finish(flat, p)
        if unstage is not None:
            unstage()

    sched = None
    if p > 1:
        s = entry.schedule
        sched = lambda ctx: s(ctx, work, red, bounds, **knobs)  # noqa: E731
    plan = Plan(st, "reduce_scatter", name, srcflat.nbytes, result, sched, prologue=prologue, finish=finish,
                timeout=timeout, stage=stage)
    plan.pool = pool
    if p > 1 and name == "mpi":
        longest = max(hi - lo for lo, hi in bounds)
        plan.native = _mpi.reduce_scatter_call(st.comm, work, red, bounds,
                                               _sched.scratch(pool, "mpi_rs", longest, work.dtype))
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
    if np.may_share_memory(flat, mine) and mine.size:
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
    name, entry = _decide(st, "allgather", name, entry, knobs, flat, check_on, sig, timeout=timeout)

    def prologue():
        if not in_place:
            flat[a:b] = mine

    sched = None
    if p > 1 and flat.size:
        s = entry.schedule
        sched = lambda ctx: s(ctx, flat, bounds, **knobs)  # noqa: E731
    plan = Plan(st, "allgather", name, flat.nbytes, result, sched, prologue=prologue, timeout=timeout)
    if sched is not None and name == "mpi":
        plan.native = _mpi.allgather_call(st.comm, flat, bounds)
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
    name, entry = _decide(st, "bcast", name, entry, knobs, data, check_on, sig, timeout=timeout)
    sched = None
    if p > 1 and data.size:
        s = entry.schedule
        sched = lambda ctx: s(ctx, data, root, **knobs)  # noqa: E731
    plan = Plan(st, "bcast", name, data.nbytes, result, sched, timeout=timeout)
    if sched is not None and name == "mpi":
        plan.native = _mpi.bcast_call(st.comm, data, root)
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
    name, entry = _decide(st, "reduce", name, entry, knobs, work, check_on,
                          dict(count=arr.size, dtype=dt.name, op=red.op.name, root=root),
                          reduces_natively(dt, red.op), timeout)

    def prologue():
        if copy_in:
            work[...] = src

    sched = None
    if p > 1:
        s = entry.schedule
        sched = lambda ctx: s(ctx, work, red, root, **knobs)  # noqa: E731
    plan = Plan(st, "reduce", name, work.nbytes, result, sched, prologue=prologue,
                finish=_then(_finish(st, red, work), unstage) if is_root else None, timeout=timeout, stage=stage)
    plan.pool = pool
    if p > 1 and name == "mpi":
        plan.native = _mpi.reduce_call(st.comm, work, red, root)
    if timeout is None and stage is None and unstage is None and src.dtype == arr.dtype \
            and (p == 1 or plan.native is not None):
        datatype, mop = _mpi._typed(red)
        plan.kept = KeptReduce(st, datatype, mop, red, root)
    return plan


# ---- persistent requests ------------------------------------------------------------

class Persistent:
    """A persistent collective (MPI-4 ``MPI_Allreduce_init`` semantics).

    Built once by ``mpicoll.allreduce_init`` (and the other ``*_init``):
    arguments validated, algorithm decided, scratch and (for ``mpi``) the MPI
    library's own persistent request created, all once. Then, as often as
    needed and in the same order on every rank: ``start()``, and ``wait()``
    (returns the result) or ``test()``; calling the request does both. The
    buffers are bound at creation: write the new input into them between
    runs. ``Start``/``Wait``/``Test`` are mpi4py's spellings; ``free()``
    releases the MPI request.
    """

    def __init__(self, plan: Plan):
        self._plan = plan
        self._pool = {}
        self._req = None  # the active request (engine.Request, or NativeRequest over _mpi)
        self._mpi = None  # MPI.Prequest of the native persistent collective
        if plan.schedule is not None and plan.native is not None and plan.native.init is not None:
            self._mpi = plan.native.init()
        self._active = False
        self._seq = -1  # the number of the call in flight (timeout messages)
        self._finish = _then(plan.native.after, plan.finish) if self._mpi is not None else None

    @property
    def algorithm(self) -> str:
        return self._plan.algorithm

    @property
    def result(self):
        return self._plan.result

    def start(self) -> None:
        if self._active:
            raise RuntimeError("mpicoll: persistent request started again before it completed (wait() first)")
        plan = self._plan
        if self._mpi is not None:
            # The library's persistent request, started, is the whole request:
            # the same thin request as a native nonblocking call's (Plan._start).
            st = plan.st
            enter(st)
            try:
                plan.inputs()
                self._seq, _ = st.next_seq()
                self._mpi.Start()
            finally:
                st.busy.release()
            if plan.timeout is None:
                # Handed to the engine only if wait() finds other requests
                # in flight, or on test(): a start+wait pair with nothing
                # else outstanding is Start and MPI_Wait, as in plain mpi4py.
                self._req = None
            else:
                self._req = engine.start_native(self._mpi, plan.result, self._finish, plan.nbytes, st,
                                                time.monotonic() + plan.timeout, self._expired)
        else:
            self._req = plan.start(self._pool)
        self._active = True

    def wait(self):
        if not self._active:
            return self._plan.result  # MPI: waiting on an inactive persistent request returns at once
        try:
            if self._req is None:
                eng = engine._engine
                with eng.lock:
                    alone = not eng.active
                if alone:
                    self._mpi.Wait()
                    if self._finish is not None:
                        self._finish()
                    return self._plan.result
                self._listed()
            self._req.wait()
        finally:
            self._active = False
            self._req = None
        return self._plan.result

    def _listed(self) -> None:
        """The started library request, handed to the engine (see start)."""
        plan = self._plan
        self._req = engine.start_native(self._mpi, plan.result, self._finish, plan.nbytes, plan.st)

    def _expired(self) -> _sched.CollectiveTimeout:
        st, plan = self._plan.st, self._plan
        return _sched.CollectiveTimeout(
            f"mpicoll: {plan.collective} timed out on rank {st.rank}: algorithm {plan.algorithm} "
            f"(the MPI library's persistent collective), {plan.nbytes} B, call #{self._seq} on this "
            "communicator. A rank probably skipped this call, called another collective, or died.",
            collective=plan.collective, algorithm=plan.algorithm, step="-", peers=[], nbytes=plan.nbytes,
            seq=self._seq, rank=st.rank)

    def test(self) -> bool:
        if not self._active:
            return True
        if self._req is None:
            self._listed()
        try:
            if not self._req.test():
                return False
        except BaseException:
            self._active = False
            self._req = None
            raise
        self._active = False
        self._req = None
        return True

    def __call__(self):
        self.start()
        return self.wait()

    def free(self) -> None:
        if self._active:
            self.wait()
        if self._mpi is not None and not MPI.Is_finalized():
            self._mpi.Free()
        self._mpi = None

    Start = start

    def Wait(self, status=None):  # noqa: N802 (mpi4py's spelling)
        self.wait()
        return True

    def Test(self, status=None) -> bool:  # noqa: N802
        return self.test()

    def Free(self):  # noqa: N802
        self.free()

    def __repr__(self):
        return f"<mpicoll persistent {self._plan.collective}/{self._plan.algorithm} {'active' if self._active else 'inactive'}>"


# ---- scatter, gather, allgatherv, alltoall, alltoallv ----------------------------------
# Data movement on uint8 storage (any fixed-size dtype: nothing is reduced);
# the schedules' signatures are in mpicoll/algorithms/__init__.py.

def _family_args(collective, algorithm, check, timeout, knobs, comm):
    """Stage 1 shared by the five builders: (check_on, timeout, name, entry, knobs, comm)."""
    if knobs and algorithm == "auto":
        raise ValueError("mpicoll: knobs need a named algorithm, not 'auto'")
    name, entry, knobs, check_on, timeout = options(collective, algorithm, check, timeout, knobs)
    return check_on, timeout, name, entry, knobs, check_intracomm(comm)


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
    if not mine.size or not np.may_share_memory(mine, full):
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


def _dtype_of(x, out, what):
    if x is not None:
        return buffers.as_array(x)
    if out is None:
        raise TypeError(f"mpicoll: {what}")
    return None


def scatter(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None,
            knobs=None, nonblocking=False) -> Plan:
    check_on, timeout, name, entry, knobs, comm = _family_args("scatter", algorithm, check, timeout, knobs, comm)
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
            def copy():
                mine[...] = full[a:b]
        buf = full
    else:
        buf = mine
    sig = dict(count=cnts[0] if counts is None else -1, dtype=dtype.str, root=root,
               counts=None if counts is None else cnts)
    plan = _staged(family_plan(st, "scatter", name, entry, knobs, bounds[-1][1], result, (buf, bounds, root),
                               prologue=copy, timeout=timeout, check_on=check_on, sig=sig, nonblocking=nonblocking),
                   stage if is_root else None)
    if counts is None and plan.stage is None:
        plan.kept = _kept_rooted(KeptScatter, plan, root, bounds)
    return plan


def gather(x, root=0, *, comm=None, out=None, counts=None, algorithm="auto", check=None, timeout=None,
           knobs=None, nonblocking=False) -> Plan:
    check_on, timeout, name, entry, knobs, comm = _family_args("gather", algorithm, check, timeout, knobs, comm)
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
            def copy():
                buf[a:b] = mine
    else:
        buf = mine
    sig = dict(count=cnts[0] if counts is None else -1, dtype=arr.dtype.str, root=root,
               counts=None if counts is None else cnts)
    plan = _staged(family_plan(st, "gather", name, entry, knobs, bounds[-1][1], result, (buf, bounds, root),
                               prologue=copy, timeout=timeout, check_on=check_on, sig=sig, nonblocking=nonblocking),
                   stage)
    if counts is None and stage is None:
        plan.kept = _kept_rooted(KeptGather, plan, root, bounds)
    return plan


def allgatherv(x, counts, *, comm=None, out=None, algorithm="auto", check=None, timeout=None, knobs=None,
               nonblocking=False) -> Plan:
    check_on, timeout, name, entry, knobs, comm = _family_args("allgatherv", algorithm, check, timeout, knobs,
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
        def copy():
            flat[a:b] = mine
    st = state(comm, timeout, "allgatherv")
    return _staged(family_plan(st, "allgatherv", name, entry, knobs, flat.nbytes, result, (flat, bounds),
                               prologue=copy, timeout=timeout, check_on=check_on,
                               sig=dict(count=-1, dtype=arr.dtype.str, counts=cnts), nonblocking=nonblocking,
                               empty=flat.nbytes == 0), stage)


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
    check_on, timeout, name, entry, knobs, comm = _family_args("alltoall", algorithm, check, timeout, knobs, comm)
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
    check_on, timeout, name, entry, knobs, comm = _family_args("alltoallv", algorithm, check, timeout, knobs,
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
    return _staged(_alltoall_plan("alltoallv", comm, arr.reshape(-1), result, sc, rc, name, entry, knobs, check_on,
                                  timeout, dict(count=-1, dtype=arr.dtype.str), nonblocking, -1), stage)


# ---- kept plans: a call's decision replayed on new buffers (plancache.py) ----------
# Each serves the calls of one signature (the key the front door files it
# under pins down collective, shape, dtype, op, root, algorithm and whether
# out is absent, x itself or another array) whose decision was the MPI
# library's own collective, or a copy on one rank. A call it cannot serve
# exactly as the full path would (a non-contiguous or misaligned array, an
# overlap, a changed environment) is a MISS and takes the full path, which
# also raises the usual errors.
#
# Every kept class has one shape: ``_bufs(x, out)`` checks the call and
# returns (x, out, result) or MISS; ``_blocking``/``_nonblocking`` make the
# MPI library's call in its two forms (the same collective as the full
# path's, so ranks that hit and ranks that miss still match); ``_finish``
# runs after it (avg's division). ``call`` is False when there is nothing
# to exchange (one rank, no bytes).

from .plancache import MISS as _MISS, Kept as _Kept, env_unchanged as _env_unchanged  # noqa: E402


_IN_PLACE = MPI.IN_PLACE


def _plain(a) -> bool:
    """A numpy array the MPI library can take as it is."""
    fl = a.flags
    return fl.c_contiguous and fl.aligned


def _free_out(out, shape, dtype, x) -> bool:
    """``out`` can receive a ``shape``/``dtype`` result without staging and
    does not overlap ``x``."""
    if type(out) is not np.ndarray or out.shape != shape:
        return False
    od = out.dtype
    if od is not dtype and od != dtype:  # (identity first: the usual case, and cheaper)
        return False
    fl = out.flags
    return fl.c_contiguous and fl.aligned and fl.writeable and not np.may_share_memory(x, out)


class _KeptCall(_Kept):
    __slots__ = ("call", "mode")

    def __init__(self, st, call):
        super().__init__(st)
        self.call, self.mode = call, 0

    def _usable(self, x) -> bool:
        return not self.st.freed and _plain(x) and _env_unchanged(self)

    def _finish(self, out):
        pass

    def __call__(self, x, out=None):
        """Blocking: the result, or MISS."""
        b = self._bufs(x, out)
        if b is _MISS:
            return b
        x, out, result = b
        if self.call:
            st = self.st
            enter(st)
            try:
                st.next_seq()
                self._blocking(x, out)
                self._finish(out)
            finally:
                st.busy.release()
        return result

    def start(self, x, out=None):
        """Nonblocking: an engine request over the library's I-call, or MISS."""
        b = self._bufs(x, out)
        if b is _MISS:
            return b
        x, out, result = b
        if not self.call:
            return engine.Request.completed(result)
        st = self.st
        enter(st)
        try:
            st.next_seq()
            req = self._nonblocking(x, out)
        finally:
            st.busy.release()
        return engine.start_native(req, result, None if out is None else self._after(out), x.nbytes, st)

    def _after(self, out):
        return None


class KeptAllreduce(_Kept):
    """allreduce: the decision (algorithm, knobs, Reduction) replayed on the
    call's arrays. The MPI library's algorithm is called straight away
    (``datatype``/``op`` set), one rank copies, any other algorithm gets a
    plan bound to the call's arrays (``bind``: its schedule over them).
    ``mode``: 0 no out, 1 out is x, 2 another out (set by the front door)."""

    __slots__ = ("name", "entry", "knobs", "red", "datatype", "op", "mode", "avg")

    def __init__(self, st, name, entry, knobs, red, native):
        super().__init__(st)
        self.name, self.entry, self.knobs, self.red, self.mode = name, entry, knobs, red, 0
        self.avg = red.op.average
        self.datatype, self.op = _mpi._typed(red) if native else (None, None)

    def _out(self, x, out):
        """The result array for this call, or MISS."""
        if self.st.freed or not _plain(x) or not _env_unchanged(self):
            return _MISS
        mode = self.mode
        if mode == 0:
            return np.empty(x.shape, x.dtype)
        if mode == 1:
            return x if x.flags.writeable else _MISS
        return out if _free_out(out, x.shape, x.dtype, x) else _MISS

    def __call__(self, x, out):
        # The hot path of every short all-reduce: the checks of _out and
        # enter() written out (each Python call costs ~0.1 us here).
        st = self.st
        fl = x.flags
        if st.freed or not (fl.c_contiguous and fl.aligned) or not _env_unchanged(self):
            return _MISS
        mode = self.mode
        if mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif mode == 1:
            if not fl.writeable:
                return _MISS
        elif not _free_out(out, x.shape, x.dtype, x):
            return _MISS
        if st.size == 1:
            if mode != 1:
                out[...] = x
            return out
        dt = self.datatype
        if dt is None:
            return self._plan(x, out, st.pool).run()
        busy = st.busy
        if engine._running_callbacks or not busy.acquire(False):
            enter(st)  # raises the error that applies
        try:
            st.next_seq()
            st.comm.Allreduce(_IN_PLACE if mode == 1 else [x, dt], [out, dt], self.op)
            if self.avg:
                self.red.finish(out.reshape(-1), st.size)
        finally:
            busy.release()
        return out

    def start(self, x, out):
        """Nonblocking: a request of this decision over the call's arrays, or MISS."""
        out = self._out(x, out)
        if out is _MISS:
            return out
        st = self.st
        if self.datatype is None or st.size == 1:
            return self._plan(x, out, None).start()
        enter(st)
        try:
            st.next_seq()
            dt = self.datatype
            req = st.comm.Iallreduce(MPI.IN_PLACE if out is x else [x, dt], [out, dt], self.op)
        finally:
            st.busy.release()
        red, size = self.red, st.size
        finish = (lambda: red.finish(out.reshape(-1), size)) if red.op.average else None
        return engine.start_native(req, out, finish, x.nbytes, st)

    def _plan(self, x, out, pool):
        st, red = self.st, self.red
        flat = out.reshape(-1)
        src = None if out is x else x.reshape(-1)
        if st.size == 1:
            def copy():
                if src is not None:
                    flat[...] = src
            return Plan(st, "allreduce", self.name, flat.nbytes, out, None, prologue=copy)
        entry, knobs = self.entry, self.knobs
        if entry.prepare is not None:  # as the full path does at every call (window sizes)
            entry.prepare(st, flat, **knobs)
        sched = entry.schedule
        plan = Plan(st, "allreduce", self.name, flat.nbytes, out,
                    (lambda ctx: sched(ctx, flat, red, src, **knobs)) if knobs else
                    (lambda ctx: sched(ctx, flat, red, src)), finish=_finish(st, red, flat))
        if entry.native is not None:
            plan.native = entry.native(st.comm, flat, red, src)
        plan.pool = pool
        return plan


class KeptBcast(_KeptCall):
    """bcast: MPI_Bcast of the call's array as bytes (in place)."""

    __slots__ = ("root",)

    def __init__(self, st, root, call):
        super().__init__(st, call)
        self.root = root

    def _bufs(self, x, out):
        fl = x.flags
        if self.st.freed or not (fl.c_contiguous and fl.writeable) or not _env_unchanged(self):
            return _MISS
        return x, x, x

    def _blocking(self, x, out):
        self.st.comm.Bcast([x, MPI.BYTE], self.root)

    def _nonblocking(self, x, out):
        return self.st.comm.Ibcast([x, MPI.BYTE], self.root)


class KeptReduce(_KeptCall):
    """reduce: MPI_Reduce from the call's array into root's result (one rank
    copies). ``mode`` as KeptAllreduce's, on the root; None off root."""

    __slots__ = ("datatype", "op", "red", "root")

    def __init__(self, st, datatype, op, red, root):
        super().__init__(st, st.size > 1)
        self.datatype, self.op, self.red, self.root = datatype, op, red, root

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        if self.st.rank != self.root:
            return x, None, None
        if self.mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif self.mode == 1:
            if not x.flags.writeable:
                return _MISS
        elif not _free_out(out, x.shape, x.dtype, x):
            return _MISS
        if self.st.size == 1 and out is not x:
            out[...] = x
        return x, out, out

    def _args(self, x, out):
        dt = self.datatype
        if out is None:
            return [x, dt], None, self.op, self.root
        return MPI.IN_PLACE if out is x else [x, dt], [out, dt], self.op, self.root

    def _blocking(self, x, out):
        self.st.comm.Reduce(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Ireduce(*self._args(x, out))

    def _finish(self, out):
        if out is not None and self.red.op.average:
            self.red.finish(out.reshape(-1), self.st.size)

    def _after(self, out):
        return (lambda: self._finish(out)) if self.red.op.average else None


class KeptAllgather(_KeptCall):
    """allgather: x placed in row ``rank`` of the result, then the MPI
    library's in-place MPI_Allgatherv over equal byte blocks (the full
    path's call)."""

    __slots__ = ("spec",)

    def __init__(self, st, block, call):
        super().__init__(st, call)
        p = st.size
        self.spec = ([block] * p, [block * i for i in range(p)])

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        shape = (self.st.size,) + x.shape
        if self.mode == 0:
            out = np.empty(shape, x.dtype)
        elif not _free_out(out, shape, x.dtype, x):
            return _MISS
        out[self.st.rank] = x
        return x, out, out

    def _blocking(self, x, out):
        self.st.comm.Allgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])

    def _nonblocking(self, x, out):
        return self.st.comm.Iallgatherv(MPI.IN_PLACE, [out, self.spec, MPI.BYTE])


def _kept_rooted(cls, plan, root, bounds):
    """The kept scatter/gather of ``plan``: the MPI library's call (or
    nothing to send: one rank, empty blocks), without a deadline."""
    if plan.timeout is not None or not (plan.native is not None or plan.schedule is None):
        return None
    return cls(plan.st, root, [b - a for a, b in bounds], [a for a, _ in bounds], plan.schedule is not None)


class _KeptRooted(_KeptCall):
    """scatter/gather's kept call: byte counts and displacements of the
    equal blocks."""

    __slots__ = ("root", "spec")

    def __init__(self, st, root, counts, displs, call):
        super().__init__(st, call)
        self.root, self.spec = root, (counts, displs)


class KeptScatter(_KeptRooted):
    """scatter (equal blocks): root places its own row, then MPI_Scatterv as
    the full path calls it. Root's x is ``(p,) + s``; another rank's x may be
    None (then ``out`` gives the shape) and is not read."""

    def _bufs(self, x, out):
        st = self.st
        if st.freed or not _env_unchanged(self) or x is not None and not _plain(x):
            return _MISS
        if out is None:
            if x is None:
                return _MISS
            out = np.empty(x.shape[1:], x.dtype)
        elif x is not None:
            if not _free_out(out, x.shape[1:], x.dtype, x):
                return _MISS
        else:
            fl = out.flags
            if type(out) is not np.ndarray or not (fl.c_contiguous and fl.aligned and fl.writeable):
                return _MISS
        if st.rank == self.root:
            out[...] = x[self.root]
        return (out if x is None else x), out, out

    def _args(self, x, out):
        if self.st.rank == self.root:
            return [x, self.spec, MPI.BYTE], MPI.IN_PLACE, self.root
        return None, [out, MPI.BYTE], self.root

    def _blocking(self, x, out):
        self.st.comm.Scatterv(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Iscatterv(*self._args(x, out))


class KeptGather(_KeptRooted):
    """gather (equal blocks): root places its own row, then MPI_Gatherv as the
    full path calls it; None off root."""

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        st = self.st
        if st.rank != self.root:
            return x, None, None
        shape = (st.size,) + x.shape
        if out is None:
            out = np.empty(shape, x.dtype)
        elif not _free_out(out, shape, x.dtype, x):
            return _MISS
        out[self.root] = x
        return x, out, out

    def _args(self, x, out):
        if out is not None:
            return MPI.IN_PLACE, [out, self.spec, MPI.BYTE], self.root
        return [x, MPI.BYTE], None, self.root

    def _blocking(self, x, out):
        self.st.comm.Gatherv(*self._args(x, out))

    def _nonblocking(self, x, out):
        return self.st.comm.Igatherv(*self._args(x, out))


class KeptAlltoall(_KeptCall):
    """alltoall: MPI_Alltoall of equal byte blocks between the call's arrays
    (out apart from x; one rank copies)."""

    __slots__ = ("block",)

    def __init__(self, st, block, call):
        super().__init__(st, call and st.size > 1)
        self.block = block

    def _bufs(self, x, out):
        if not self._usable(x):
            return _MISS
        if self.mode == 0:
            out = np.empty(x.shape, x.dtype)
        elif not _free_out(out, x.shape, x.dtype, x):
            return _MISS
        if self.st.size == 1:
            out[...] = x
        return x, out, out

    def _blocking(self, x, out):
        bs = self.block
        self.st.comm.Alltoall([x, bs, MPI.BYTE], [out, bs, MPI.BYTE])

    def _nonblocking(self, x, out):
        bs = self.block
        return self.st.comm.Ialltoall([x, bs, MPI.BYTE], [out, bs, MPI.BYTE])
