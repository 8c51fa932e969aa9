"""``mpicoll.Comm``: an mpi4py intra-communicator whose buffer collectives run on mpicoll.

An existing mpi4py program switches by changing one line::

    comm = mpicoll.Comm(MPI.COMM_WORLD)     # was: comm = MPI.COMM_WORLD

``Comm`` is a subclass of ``MPI.Intracomm`` over the same MPI handle (the
shape of mpi4py's own ``demo/reductions``), so ``isinstance`` checks, ranks,
``Barrier``, point-to-point calls and the lowercase pickle methods are plain
mpi4py, and ``Dup``/``Split``/``Create``... return ``Comm`` objects again.

Overridden: ``Allreduce``, ``Iallreduce``, ``Reduce``, ``Reduce_scatter_block``,
``Reduce_scatter``, ``Allgather``, ``Bcast``, and ``Scatter``, ``Scatterv``,
``Gather``, ``Gatherv``, ``Allgatherv``, ``Alltoall``, ``Alltoallv`` (each with
its ``I...`` and ``..._init`` forms; the v-forms take mpi4py's
``[buf, (counts, displs), datatype]``, and packed displacements only: others
go to mpi4py). They take exactly mpi4py's arguments, plus an optional
``algorithm=`` keyword:

* buffer specs as mpi4py parses them (``message_simple`` in mpi4py's
  msgbuffer.pxi): a bare buffer, ``[buf, datatype]``, ``[buf, count]``,
  ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]``,
  ``[buf, count, displ, datatype]``, the datatype given as ``MPI.Datatype``
  or typecode string, the count inferred from the buffer when not given
  (split into ``size`` blocks where mpi4py does that), ``MPI.IN_PLACE``, a
  send buffer that *is* the receive buffer treated as in place, ``None``
  for the receive buffer of a non-root ``Reduce`` and for ``recvcounts``;
* buffers: anything ``MPI.buffer`` accepts on the host (numpy, array.array,
  bytearray, memoryview, any buffer-protocol object, DLPack producers).
  mpi4py's own ``MPI.buffer`` acquires them, so an unsupported, read-only or
  non-contiguous buffer fails with mpi4py's own exception.

Falling back: a call mpicoll cannot serve goes to ``MPI.Intracomm``'s own
method, so it behaves exactly as in plain mpi4py. The tests for that depend
only on what every rank of a correct program agrees on (datatype, op, root,
counts), never on rank-local facts, so all ranks take the same path:

* an op that is not a predefined ``MPI.Op`` with an mpicoll kernel for the
  datatype (user-defined ops, MAXLOC, REPLACE, LAND on floats...);
* a derived datatype, or a predefined one without a kernel (complex, long
  double, bool, ...; data-movement collectives accept every predefined
  type), MPI.BYTE with an arithmetic op;
* a root out of range (MPI's own error), a ``None``/``BOTTOM`` buffer with
  a count, device (CUDA array interface / non-CPU DLPack) buffers.

``Iallreduce`` returns an ``mpicoll.Request`` (``Wait()``/``Test()`` as in
mpi4py, plus ``wait()``/``test()``), not an ``MPI.Request``: wait for several
with ``mpicoll.waitall(requests)`` (which also takes MPI requests), not with
``MPI.Request.Waitall``, which cannot advance mpicoll's state machines.

Errors: argument mistakes raise what mpi4py raises for them, with its
messages (``ValueError("message: ...")``, ``KeyError`` for an unknown
typecode, ``TypeError`` for a non-``MPI.Op``...), before any message is
sent. One deliberate difference: an explicit count larger than the buffer,
which mpi4py passes on to MPI unchecked, is a ValueError here.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from . import dtypes as _dtypes
from . import ops as _ops
from . import plan as _plan
from . import api as _api
from .comm import state, wait_until
# Buffer-spec parsing (specs.py) and the MPI type tables (typemap.py) live
# in their own modules; this one holds the Comm class and its fast path.
from .specs import _check_pair, _format_type, _in_place, _in_place_arg, _index, _is_datatype, parse
from .typemap import Native as _Native, kernel_dtype as _kernel_dtype, type_info as _type_info

__all__ = ["Comm"]


def _check_algorithm(collective: str, algorithm) -> None:
    _plan.requested(collective, algorithm, _plan.env_settings()[0])


def _go(mode: str, build, *args, **kw):
    """Run a plan builder in one of the three modes: "run" (blocking; the
    drop-in returns None like mpi4py), "start" (a Request) or "init" (a
    persistent request)."""
    if mode == "run":
        build(*args, **kw).run()
        return None
    p = build(*args, nonblocking=True, **kw)
    return p.start() if mode == "start" else _plan.Persistent(p)


# ---- the fast path: plain C-contiguous numpy arrays ------------------------------

def _fast_tables():
    """numpy dtype -> mpicoll DType, for the dtypes whose buffer format mpi4py
    maps to a datatype with a kernel (uint8 is MPI.BYTE there: not included),
    and MPI.Op handle -> op name for the ops with kernels."""
    dtypes_ = {}
    for d in _dtypes.ALL:
        if d.name in ("uint8", "bfloat16"):
            continue
        npd = np.dtype(d.name)
        try:
            mpit = _format_type(None, memoryview(np.empty(1, npd)).format)
            if _type_info(mpit)[1] is d:
                dtypes_[npd] = d
        except (KeyError, BufferError, _Native):
            pass
    ops_ = {o.mpi.py2f(): o for o in _ops.ALL if not o.average}
    return dtypes_, ops_


_FAST = None


def _fast_allreduce(sendbuf, recvbuf, op):
    """(input, output, op name) when both buffers are C-contiguous numpy
    arrays (or the send buffer is IN_PLACE/None) of one dtype with a kernel
    and matching sizes, and the op is predefined with a kernel for it; None
    sends the call down the general path (which also reports errors)."""
    global _FAST
    if type(recvbuf) is not np.ndarray or type(op) is not MPI.Op:
        return None
    if _FAST is None:
        _FAST = _fast_tables()
    dt = _FAST[0].get(recvbuf.dtype)
    flags = recvbuf.flags
    if dt is None or not (flags.c_contiguous and flags.writeable):
        return None
    o = _FAST[1].get(op.py2f())
    if o is None or dt.kind not in o.kinds:
        return None
    out = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if sendbuf is None or sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return out, out, o.name
    if type(sendbuf) is not np.ndarray or sendbuf.dtype != recvbuf.dtype or sendbuf.size != recvbuf.size \
            or not sendbuf.flags.c_contiguous:
        return None
    # A different array over the same memory is in place too: mpicoll.allreduce
    # recognises that itself (and refuses a partial overlap).
    return (sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)), out, o.name


# id(recvbuf) -> (sendbuf, op, recvbuf, x, out, op name) of recent short
# Allreduce calls: the flat views handed to mpicoll.allreduce are kept, so a
# repeated call finds that call's cached plan (keyed by the views' identity).
_recent = {}


class Comm(MPI.Intracomm):
    """An mpi4py ``Intracomm`` (same MPI handle) whose buffer collectives
    run on mpicoll. See the module docstring for what is accepted."""

    def __new__(cls, comm=None):
        if comm is not None:
            if not isinstance(comm, MPI.Comm):
                raise TypeError(f"mpicoll.Comm wraps an mpi4py communicator, not {type(comm).__name__}")
            if isinstance(comm, MPI.Intercomm) or (comm != MPI.COMM_NULL and comm.Is_inter()):
                raise TypeError("mpicoll.Comm needs an intra-communicator")
        return super().__new__(cls, comm)

    # -- constructors keep the class (mpi4py's Dup/Clone already do) --
    def Split(self, color=0, key=0):  # noqa: N802 (mpi4py's names)
        return type(self)(super().Split(color, key))

    def Split_type(self, split_type, key=0, info=MPI.INFO_NULL):  # noqa: N802
        return type(self)(super().Split_type(split_type, key, info))

    def Create(self, group):  # noqa: N802
        return type(self)(super().Create(group))

    def Create_group(self, group, tag=0):  # noqa: N802
        return type(self)(super().Create_group(group, tag))

    # -- reductions --
    # Each collective is one method _x(..., mode) that parses mpi4py's
    # arguments and builds the plan; Allreduce/Iallreduce/Allreduce_init are
    # that method in the modes "run", "start" and "init". What mpicoll cannot
    # serve goes to mpi4py's method of the same mode.

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto"):  # noqa: N802 (mpi4py's names)
        # The short path: the same buffers and op as a recent call reuse the
        # arrays that call handed to mpicoll.allreduce, whose cached plan then
        # runs without parsing anything (see api.short).
        e = _recent.get(id(recvbuf))
        if e is not None and e[0] is sendbuf and e[1] is op and e[2] is recvbuf:
            c = _api._cache.get(id(e[3]))
            if c is not None and _api.short(c, e[3], e[4], e[5], self, algorithm) is not None:
                return None
        return self._allreduce(sendbuf, recvbuf, op, algorithm, "run")

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto"):  # noqa: N802
        """Returns an ``mpicoll.Request`` (``Wait``/``Test``/``wait``/``test``;
        ``mpicoll.waitall`` for several); a native fallback returns mpi4py's
        ``MPI.Request``."""
        return self._allreduce(sendbuf, recvbuf, op, algorithm, "start")

    def Allreduce_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        """A persistent all-reduce (``Start``/``Wait``/``Test``), an
        ``mpicoll.Persistent``; a native fallback returns mpi4py's ``MPI.Prequest``."""
        return self._allreduce(sendbuf, recvbuf, op, algorithm, "init", info)

    def _allreduce(self, sendbuf, recvbuf, op, algorithm, mode, info=MPI.INFO_NULL):
        fast = _fast_allreduce(sendbuf, recvbuf, op)
        if fast is not None:  # plain numpy arrays: the common case, without the general parsing
            x, out, name = fast
            if mode == "run":
                _api.allreduce(x, name, comm=self, out=out, algorithm=algorithm)
                if x.nbytes <= _api.CACHE_MAX_BYTES:
                    if len(_recent) >= _api.CACHE_SIZE:
                        _recent.clear()
                    _recent[id(recvbuf)] = (sendbuf, op, recvbuf, x, out, name)
                return None
            return _go(mode, _plan.allreduce, x, name, comm=self, out=out, algorithm=algorithm)
        try:
            plan = self._allreduce_plan(sendbuf, recvbuf, op)
        except _Native:
            if mode == "run":
                return super().Allreduce(sendbuf, recvbuf, op)
            if mode == "start":
                return super().Iallreduce(sendbuf, recvbuf, op)
            return super().Allreduce_init(sendbuf, recvbuf, op, info)
        flat, src, dt, o = plan
        return _go(mode, _plan.allreduce, flat if src is None else src, o, comm=self, out=flat, algorithm=algorithm,
                   dtype=dt.name)

    def _allreduce_plan(self, sendbuf, recvbuf, op):
        if not isinstance(op, MPI.Op):
            raise _Native
        r = parse(recvbuf, writable=True)
        dt, o = _kernel_dtype(r.datatype, op)
        src = None
        if not _in_place_arg(sendbuf):
            s = parse(sendbuf, writable=False)
            _check_pair(s, r)
            if not _in_place(s, r):
                src = s.data()
        r.dtype = dt
        if src is not None:
            src = src.view(dt.storage)
        return r.data(), src, dt, o

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, *, algorithm="auto"):  # noqa: N802
        return self._reduce(sendbuf, recvbuf, op, root, algorithm, "run")

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, *, algorithm="auto"):  # noqa: N802
        return self._reduce(sendbuf, recvbuf, op, root, algorithm, "start")

    def Reduce_init(self, sendbuf, recvbuf, op=MPI.SUM, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._reduce(sendbuf, recvbuf, op, root, algorithm, "init", info)

    def _reduce(self, sendbuf, recvbuf, op, root, algorithm, mode, info=MPI.INFO_NULL):
        try:
            if not isinstance(op, MPI.Op) or not isinstance(root, (int, np.integer)) or isinstance(root, bool):
                raise _Native  # mpi4py's TypeError
            if not 0 <= root < self.Get_size():
                raise _Native  # MPI's own invalid-root error
            is_root = self.Get_rank() == root
            if is_root:
                r = parse(recvbuf, writable=True)
                dt, o = _kernel_dtype(r.datatype, op)
                r.dtype = dt
                out = r.data()
                x = out
                if not _in_place_arg(sendbuf):
                    s = parse(sendbuf, writable=False)
                    _check_pair(s, r)
                    if not _in_place(s, r):
                        x = s.raw[:s.nbytes].view(dt.storage)
            else:  # mpi4py ignores a non-root recvbuf entirely
                s = parse(sendbuf, writable=False)
                dt, o = _kernel_dtype(s.datatype, op)
                x, out = s.raw[:s.nbytes].view(dt.storage), None
        except _Native:
            if mode == "run":
                return super().Reduce(sendbuf, recvbuf, op, root)
            if mode == "start":
                return super().Ireduce(sendbuf, recvbuf, op, root)
            return super().Reduce_init(sendbuf, recvbuf, op, root, info)
        return _go(mode, _plan.reduce, x, o, root, comm=self, out=out, algorithm=algorithm, dtype=dt.name)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto"):  # noqa: N802
        return self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, "run")

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto"):  # noqa: N802
        return self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, "start")

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=MPI.SUM, info=MPI.INFO_NULL, *,  # noqa: N802
                                  algorithm="auto"):
        return self._reduce_scatter_block(sendbuf, recvbuf, op, algorithm, "init", info)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, algorithm, mode, info=MPI.INFO_NULL):
        try:
            if not isinstance(op, MPI.Op):
                raise _Native
            p = self.Get_size()
            if _in_place_arg(sendbuf):
                r = parse(recvbuf, writable=True, blocks=p)
                dt, o = _kernel_dtype(r.datatype, op)
                r.dtype = dt
                x = r.raw[:r.nbytes * p].view(dt.storage)
                out = x[:r.count]
            else:
                r = parse(recvbuf, writable=True)
                s = parse(sendbuf, writable=False, blocks=p)
                _check_pair(s, r)
                dt, o = _kernel_dtype(r.datatype, op)
                r.dtype = dt
                out = r.data()
                x = s.raw[:s.nbytes * p].view(dt.storage)
                if out.nbytes and np.may_share_memory(x, out):
                    # mpi4py's "same address is in place" rule: the whole send
                    # buffer starting at the receive buffer.
                    if s.address != r.address:
                        raise ValueError("mpicoll: send and receive buffers partially overlap")
                    out = x[:r.count]
        except _Native:
            if mode == "run":
                return super().Reduce_scatter_block(sendbuf, recvbuf, op)
            if mode == "start":
                return super().Ireduce_scatter_block(sendbuf, recvbuf, op)
            return super().Reduce_scatter_block_init(sendbuf, recvbuf, op, info)
        return _go(mode, _plan.reduce_scatter, x, o, comm=self, counts=[r.count] * p, out=out, algorithm=algorithm,
                   dtype=dt.name)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM, *, algorithm="auto"):  # noqa: N802
        try:
            if not isinstance(op, MPI.Op):
                raise _Native
            p, rank = self.Get_size(), self.Get_rank()
            r = parse(recvbuf, writable=True)
            in_place = _in_place_arg(sendbuf)
            s = None if in_place else parse(sendbuf, writable=False)
            if s is not None and s.nbytes and r.nbytes and s.address == r.address:
                in_place = True
            dt, o = _kernel_dtype(r.datatype, op)
            if s is not None and not in_place and s.datatype != r.datatype:
                raise ValueError("mismatch in send and receive MPI datatypes")
            if recvcounts is None and not in_place:
                # Every local check that needs no counts comes first: the
                # allgather below is collective, and a rank that raised
                # after it would leave the others in the reduce-scatter.
                _check_algorithm("reduce_scatter", algorithm)
                counts = state(self).comm.allgather(r.count)  # as mpi4py does, on our private duplicate
            else:
                if recvcounts is None:
                    raise TypeError("object of type 'NoneType' has no len()")
                counts = [_index(c) for c in recvcounts] if not isinstance(recvcounts, (str, bytes)) else None
                if counts is None:
                    raise TypeError(f"'{type(recvcounts).__name__}' object cannot be interpreted as an integer")
                if len(counts) != p:
                    raise ValueError(f"expecting {p} items, got {len(counts)}")
            total = sum(counts)
            if not in_place:
                if s.count != total:
                    raise ValueError(f"mismatch in send count {s.count} and sum(counts) {total}")
                if r.count != counts[rank]:
                    raise ValueError(f"mismatch in receive count {r.count} and counts[{rank}] {counts[rank]}")
            elif r.count != total:
                raise ValueError(f"mismatch in receive count {r.count} and sum(counts) {total}")
            if any(c < 0 for c in counts):
                raise _Native  # MPI's error
            r.dtype = dt
            if in_place:
                x = r.data()
                out = x[:counts[rank]]
            else:
                x = s.raw[:s.nbytes].view(dt.storage)
                out = r.data()
                if out.nbytes and x.nbytes and np.may_share_memory(x, out):
                    raise ValueError("mpicoll: send and receive buffers partially overlap")
        except _Native:
            return super().Reduce_scatter(sendbuf, recvbuf, recvcounts, op)
        _check_algorithm("reduce_scatter", algorithm)
        _plan.reduce_scatter(x, o, comm=self, counts=counts, out=out, algorithm=algorithm, dtype=dt.name).run()

    # -- data movement (any predefined datatype: nothing is reduced) --
    def Bcast(self, buf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._bcast(buf, root, algorithm, "run")

    def Ibcast(self, buf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._bcast(buf, root, algorithm, "start")

    def Bcast_init(self, buf, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._bcast(buf, root, algorithm, "init", info)

    def _bcast(self, buf, root, algorithm, mode, info=MPI.INFO_NULL):
        try:
            if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
                raise _Native
            if not 0 <= root < self.Get_size():
                raise _Native
            is_root = self.Get_rank() == root
            m = parse(buf, writable=not is_root)
            data = m.raw[:m.nbytes]
            if is_root and not data.flags.writeable:
                data = data.copy()  # root only sends, but mpicoll.bcast wants a writable buffer
        except _Native:
            if mode == "run":
                return super().Bcast(buf, root)
            if mode == "start":
                return super().Ibcast(buf, root)
            return super().Bcast_init(buf, root, info)
        return _go(mode, _plan.bcast, data, root, comm=self, algorithm=algorithm)

    def Allgather(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._allgather(sendbuf, recvbuf, algorithm, "run")

    def Iallgather(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._allgather(sendbuf, recvbuf, algorithm, "start")

    def Allgather_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._allgather(sendbuf, recvbuf, algorithm, "init", info)

    def _allgather(self, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        try:
            p, rank = self.Get_size(), self.Get_rank()
            r = parse(recvbuf, writable=True, blocks=p)
            block = r.nbytes
            flat = r.raw[:block * p]
            mine, in_place = None, True
            if not _in_place_arg(sendbuf):
                s = parse(sendbuf, writable=False)
                if s.nbytes != block:
                    raise _Native  # a type-signature mismatch: MPI's error to report
                mine = s.raw[:s.nbytes]
                if block and np.may_share_memory(mine, flat):
                    if mine.ctypes.data != flat[rank * block:].ctypes.data:
                        raise ValueError("mpicoll: send buffer overlaps the receive buffer")
                else:
                    in_place = False
        except _Native:
            if mode == "run":
                return super().Allgather(sendbuf, recvbuf)
            if mode == "start":
                return super().Iallgather(sendbuf, recvbuf)
            return super().Allgather_init(sendbuf, recvbuf, info)
        name, entry, knobs, check_on, timeout = _plan.options("allgather", algorithm, None, None, None)
        plan = _plan.allgather_bytes(self, flat, mine, rank, p, name, entry, knobs, check_on, timeout, None,
                                     dict(count=block, dtype="bytes"), mode != "run", in_place=in_place)
        if mode == "run":
            plan.run()
            return None
        return plan.start() if mode == "start" else _plan.Persistent(plan)


# ---- scatter, gather, allgatherv, alltoall, alltoallv ----------------------------
# Added to Comm below (one method per collective and mode, like the others).

def _parse_v(msg, writable: bool, p: int):
    """mpi4py's vector spec (``message_vector``): buf, [buf, datatype],
    [buf, counts], [buf, (counts, displs)], [buf, counts, datatype],
    [buf, (counts, displs), datatype], [buf, counts, displs, datatype].
    Returns (uint8 bytes from the first entry, counts in bytes); _Native
    for displacements that are not the packed prefix sums (MPI can follow
    those, mpicoll's plans move packed blocks)."""
    o_buf, o_counts, o_displs, o_type = msg, None, None, None
    if isinstance(msg, (list, tuple)):
        n = len(msg)
        if n == 2:
            o_buf, o_counts = msg
            if _is_datatype(o_counts):
                o_counts, o_type = None, o_counts
        elif n == 3:
            o_buf, o_counts, o_type = msg
        elif n == 4:
            o_buf, o_counts, o_displs, o_type = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
        if isinstance(o_counts, tuple) and len(o_counts) == 2 and not isinstance(o_counts[0], (int, np.integer)):
            o_counts, o_displs = o_counts
    m = parse(o_buf if o_type is None else [o_buf, o_type], writable)
    size = m.itemsize
    entries = m.raw.size // size if size else 0
    if o_counts is None:
        if p and entries % p:
            raise ValueError(f"message: cannot infer count, number of entries {entries} is not a multiple of "
                             f"required number of blocks {p}")
        counts = [entries // p] * p
    elif isinstance(o_counts, (int, np.integer)):
        counts = [_index(o_counts)] * p
    else:
        counts = [_index(c) for c in o_counts]
        if len(counts) != p:
            raise ValueError(f"expecting {p} items, got {len(counts)}")
    if any(c < 0 for c in counts):
        raise _Native
    if o_displs is not None:
        displs = [_index(d) for d in (o_displs if not isinstance(o_displs, (int, np.integer)) else
                                      [_index(o_displs) * i for i in range(p)])]
        packed = [sum(counts[:i]) for i in range(p)]
        if displs != packed:
            raise _Native
    total = sum(counts) * size
    if total > m.raw.size:
        raise ValueError(f"message: counts need {total} bytes, the buffer has {m.raw.size}")
    return m.raw[:total], [c * size for c in counts], m


def _family_name(collective: str, algorithm) -> str:
    return _plan.requested(collective, algorithm, _plan.env_settings()[0])


class _FamilyMethods:
    """Scatter(v), Gather(v), Allgatherv, Alltoall(v) for Comm: mpi4py's
    arguments, each in the three modes; what mpicoll cannot serve goes to
    mpi4py's own method of the same mode."""

    def _family_native(self, name, mode, args, info):
        base = super(Comm, self)
        if mode == "run":
            return getattr(base, name)(*args)
        if mode == "start":
            return getattr(base, "I" + name.lower())(*args)
        return getattr(base, name + "_init")(*args, info)

    # -- scatter / scatterv --
    def Scatter(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatter", sendbuf, recvbuf, root, algorithm, "run")

    def Iscatter(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatter", sendbuf, recvbuf, root, algorithm, "start")

    def Scatter_init(self, sendbuf, recvbuf, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatter", sendbuf, recvbuf, root, algorithm, "init", info)

    def Scatterv(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatterv", sendbuf, recvbuf, root, algorithm, "run")

    def Iscatterv(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatterv", sendbuf, recvbuf, root, algorithm, "start")

    def Scatterv_init(self, sendbuf, recvbuf, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._scatter("Scatterv", sendbuf, recvbuf, root, algorithm, "init", info)

    def _rooted(self, coll, v, algorithm, root, counts, is_root):
        """(algorithm name, counts in bytes on every rank). The v-forms'
        non-roots know only their own count: "auto" is then the native call
        (a size rule would need every count), and the binomial tree, which
        needs them all, gets them from the root first."""
        name = _family_name(coll, algorithm)
        if v and name == "auto":
            name = "mpi"
        if v and name == "binomial":
            # A collective step before the plan's: under the deadline too.
            timeout = _plan.env_settings()[2]
            st = state(self, timeout, coll)
            n = np.array(counts if is_root else [0] * st.size, np.int64)
            if timeout is None:
                st.comm.Bcast(n, root)
            else:
                wait_until(st.comm.Ibcast(n, root), time.monotonic() + timeout, st.rank, coll,
                           "broadcast of the root's counts", st.seq, buffers=(n,))
            counts = n.tolist()
        return name, counts

    def _scatter(self, which, sendbuf, recvbuf, root, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Scatterv"
        try:
            if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self.Get_size():
                raise _Native
            p, rank = self.Get_size(), self.Get_rank()
            is_root = rank == root
            r = None if is_root and _in_place_arg(recvbuf) else parse(recvbuf, writable=True)
            if is_root:
                if v:
                    full, counts, s = _parse_v(sendbuf, False, p)
                else:
                    s = parse(sendbuf, writable=False, blocks=p)
                    full, counts = s.raw[:s.nbytes * p], [s.nbytes] * p
                if r is not None and r.nbytes != counts[rank]:
                    raise _Native  # a type-signature mismatch: MPI's error
                a = sum(counts[:rank])
                out = full[a:a + counts[rank]] if r is None else r.raw[:r.nbytes]
            else:
                full, out = None, r.raw[:r.nbytes]
                counts = [0] * p
                counts[rank] = r.nbytes
                if not v:
                    counts = [r.nbytes] * p
        except _Native:
            args = (sendbuf, recvbuf, root)
            return self._family_native(which, mode, args, info)
        name, counts = self._rooted("scatter", v, algorithm, root, counts, is_root)
        return _go(mode, _plan.scatter, full, root, comm=self, out=out, counts=counts, algorithm=name)

    # -- gather / gatherv --
    def Gather(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gather", sendbuf, recvbuf, root, algorithm, "run")

    def Igather(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gather", sendbuf, recvbuf, root, algorithm, "start")

    def Gather_init(self, sendbuf, recvbuf, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gather", sendbuf, recvbuf, root, algorithm, "init", info)

    def Gatherv(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gatherv", sendbuf, recvbuf, root, algorithm, "run")

    def Igatherv(self, sendbuf, recvbuf, root=0, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gatherv", sendbuf, recvbuf, root, algorithm, "start")

    def Gatherv_init(self, sendbuf, recvbuf, root=0, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._gather("Gatherv", sendbuf, recvbuf, root, algorithm, "init", info)

    def _gather(self, which, sendbuf, recvbuf, root, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Gatherv"
        try:
            if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self.Get_size():
                raise _Native
            p, rank = self.Get_size(), self.Get_rank()
            is_root = rank == root
            s = None if is_root and _in_place_arg(sendbuf) else parse(sendbuf, writable=False)
            if is_root:
                if v:
                    full, counts, r = _parse_v(recvbuf, True, p)
                else:
                    r = parse(recvbuf, writable=True, blocks=p)
                    full, counts = r.raw[:r.nbytes * p], [r.nbytes] * p
                if s is not None and s.nbytes != counts[rank]:
                    raise _Native
                a = sum(counts[:rank])
                x = full[a:a + counts[rank]] if s is None else s.raw[:s.nbytes]
            else:
                full, x = None, s.raw[:s.nbytes]
                counts = [0] * p
                counts[rank] = s.nbytes
                if not v:
                    counts = [s.nbytes] * p
        except _Native:
            return self._family_native(which, mode, (sendbuf, recvbuf, root), info)
        name, counts = self._rooted("gather", v, algorithm, root, counts, is_root)
        return _go(mode, _plan.gather, x, root, comm=self, out=full, counts=counts, algorithm=name)

    # -- allgatherv --
    def Allgatherv(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._allgatherv(sendbuf, recvbuf, algorithm, "run")

    def Iallgatherv(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._allgatherv(sendbuf, recvbuf, algorithm, "start")

    def Allgatherv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._allgatherv(sendbuf, recvbuf, algorithm, "init", info)

    def _allgatherv(self, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        try:
            p, rank = self.Get_size(), self.Get_rank()
            full, counts, r = _parse_v(recvbuf, True, p)
            a = sum(counts[:rank])
            if _in_place_arg(sendbuf):
                x = full[a:a + counts[rank]]
            else:
                s = parse(sendbuf, writable=False)
                if s.nbytes != counts[rank]:
                    raise _Native
                x = s.raw[:s.nbytes]
        except _Native:
            return self._family_native("Allgatherv", mode, (sendbuf, recvbuf), info)
        return _go(mode, _plan.allgatherv, x, counts, comm=self, out=full, algorithm=algorithm)

    # -- alltoall / alltoallv --
    def Alltoall(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoall", sendbuf, recvbuf, algorithm, "run")

    def Ialltoall(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoall", sendbuf, recvbuf, algorithm, "start")

    def Alltoall_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoall", sendbuf, recvbuf, algorithm, "init", info)

    def Alltoallv(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoallv", sendbuf, recvbuf, algorithm, "run")

    def Ialltoallv(self, sendbuf, recvbuf, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoallv", sendbuf, recvbuf, algorithm, "start")

    def Alltoallv_init(self, sendbuf, recvbuf, info=MPI.INFO_NULL, *, algorithm="auto"):  # noqa: N802
        return self._alltoall("Alltoallv", sendbuf, recvbuf, algorithm, "init", info)

    def _alltoall(self, which, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Alltoallv"
        try:
            p = self.Get_size()
            if v:
                out, rc, r = _parse_v(recvbuf, True, p)
                if _in_place_arg(sendbuf):
                    x, sc = out, rc
                else:
                    x, sc, s = _parse_v(sendbuf, False, p)
                    if s.datatype != r.datatype:
                        raise _Native
            else:
                r = parse(recvbuf, writable=True, blocks=p)
                out = r.raw[:r.nbytes * p]
                if _in_place_arg(sendbuf):
                    x = out
                else:
                    s = parse(sendbuf, writable=False, blocks=p)
                    if s.nbytes != r.nbytes:
                        raise _Native
                    x = s.raw[:s.nbytes * p]
        except _Native:
            return self._family_native(which, mode, (sendbuf, recvbuf), info)
        if v:
            return _go(mode, _plan.alltoallv, x, sc, rc, comm=self, out=out, algorithm=algorithm)
        block = out.size // p
        return _go(mode, _plan.alltoall, x.reshape(p, block), comm=self, out=out.reshape(p, block),
                   algorithm=algorithm)


for _name, _fn in list(vars(_FamilyMethods).items()):
    if callable(_fn) and not _name.startswith("__"):
        setattr(Comm, _name, _fn)
del _name, _fn
