"""``mpicoll.Comm``: an mpi4py intra-communicator whose buffer collectives run on mpicoll.

An existing mpi4py program switches by changing one line::

    comm = mpicoll.Comm(MPI.COMM_WORLD)     # was: comm = MPI.COMM_WORLD

``Comm`` is a subclass of ``MPI.Intracomm`` over the same MPI handle (the
shape of mpi4py's own ``demo/reductions``), so ``isinstance`` checks, ranks,
``Barrier``, point-to-point calls and the lowercase pickle methods are plain
mpi4py, and ``Dup``/``Split``/``Create``... return ``Comm`` objects again.

Overridden: ``Allreduce``, ``Iallreduce``, ``Reduce``, ``Reduce_scatter_block``,
``Reduce_scatter``, ``Allgather`` and ``Bcast``. They take exactly mpi4py's
arguments, plus an optional ``algorithm=`` keyword:

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

import numpy as np
from mpi4py import MPI

from . import dtypes as _dtypes
from . import ops as _ops
from . import plan as _plan
from . import api as _api
from .comm import state
# Buffer-spec parsing (specs.py) and the MPI type tables (typemap.py) live
# in their own modules; this one holds the Comm class and its fast path.
from .specs import _check_pair, _format_type, _in_place, _in_place_arg, _index, parse
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
