"""``mpicoll.Comm``: an mpi4py intra-communicator whose buffer collectives run on mpicoll.

An existing mpi4py program switches by changing one line::

    comm = mpicoll.Comm(MPI.COMM_WORLD)     # was: comm = MPI.COMM_WORLD

``Comm`` is a subclass of ``MPI.Intracomm`` over the same MPI handle (the
shape of mpi4py's own ``demo/reductions``), so ``isinstance`` checks, ranks,
``Barrier``, point-to-point calls and the lowercase pickle methods are plain
mpi4py, and ``Dup``/``Split``/``Create``... return ``Comm`` objects again.

Overridden: ``Allreduce``, ``Reduce``, ``Reduce_scatter_block``,
``Reduce_scatter``, ``Allgather``, ``Bcast``, ``Scatter``, ``Scatterv``,
``Gather``, ``Gatherv``, ``Allgatherv``, ``Alltoall``, ``Alltoallv``, each with
its ``I...`` and ``..._init`` form. They take exactly mpi4py's arguments,
plus an optional ``algorithm=`` keyword:

* buffer specs as mpi4py parses them (``message_simple`` in mpi4py's
  msgbuffer.pxi): a bare buffer, ``[buf, datatype]``, ``[buf, count]``,
  ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]``,
  ``[buf, count, displ, datatype]``, the datatype given as ``MPI.Datatype``
  or typecode string, the count inferred from the buffer when not given
  (split into ``size`` blocks where mpi4py does that), ``MPI.IN_PLACE``, a
  send buffer that *is* the receive buffer treated as in place, ``None``
  for the receive buffer of a non-root ``Reduce`` and for ``recvcounts``;
* the v-forms' specs as mpi4py's ``message_vector`` parses them: counts and
  displacements each a list or one int (``[buf, count]``; ``[buf, (count,
  stride), datatype]`` puts block i at ``stride * i``), counts inferred from
  a bare buffer as mpi4py spreads them;
* any layout of one rank's own (displacements with gaps, a derived
  datatype whose type signature is one predefined type repeated,
  ``MPI.BOTTOM``): packed into a contiguous scratch on that rank
  (specs.py), so the call still runs on mpicoll on every rank;
* buffers: anything ``MPI.buffer`` accepts on the host (numpy, array.array,
  bytearray, memoryview, any buffer-protocol object, DLPack producers, also
  of dtypes numpy lacks: the format is read from the DLPack capsule).
  mpi4py's own ``MPI.buffer`` acquires them, so an unsupported, read-only or
  non-contiguous buffer fails with mpi4py's own exception.

Kept plans: a blocking or ``I...`` call whose buffers need no packing
(plain C-contiguous numpy arrays, ``[array, counts]``, ``MPI.IN_PLACE``;
specs.py parses these without its general path) goes through the
``mpicoll`` function of the same collective, whose per-communicator plan
cache serves a repeated signature - counts vectors included - without
building a plan (plancache.py); the ``..._init`` forms and packed layouts
build theirs.

Falling back: a call mpicoll cannot serve goes to ``MPI.Intracomm``'s own
method, so it behaves exactly as in plain mpi4py. The tests for that depend
only on what every rank of a correct program agrees on (the type
signature's predefined type, op, root), never on rank-local facts, so all
ranks take the same path:

* an op that is not a predefined ``MPI.Op`` with an mpicoll kernel for the
  datatype (user-defined ops, MAXLOC, REPLACE, LAND on floats...);
* a type signature of several predefined types, or a predefined type
  without a kernel (complex, long double, bool, ...; data-movement
  collectives accept every predefined type), MPI.BYTE with an arithmetic op;
* a root out of range (MPI's own error), device (CUDA array interface /
  non-CPU DLPack) buffers: the one rank-local fact, so device memory on
  some ranks and host memory on others in one call is not supported.

``count_calls()`` counts the calls served and handed on, with the reason.

``Iallreduce`` returns an ``mpicoll.Request`` (``Wait()``/``Test()`` as in
mpi4py, plus ``wait()``/``test()``), not an ``MPI.Request``: wait for several
with ``mpicoll.waitall(requests)`` (which also takes MPI requests), not with
``MPI.Request.Waitall``, which cannot advance mpicoll's state machines.

Errors: argument mistakes raise what mpi4py raises for them, with its
messages (``ValueError("message: ...")``, ``KeyError`` for an unknown
typecode, ``TypeError`` for a non-``MPI.Op``...), before any message is
sent. One deliberate difference: an explicit count (or a v-form block, or
a derived type's extent) reaching past the buffer, which mpi4py passes on to
MPI unchecked, is a ValueError here.
"""
from __future__ import annotations

import collections
import functools
import time

import numpy as np
from mpi4py import MPI

from . import dtypes as _dtypes
from . import ops as _ops
from . import plan as _plan
from . import _env
from . import native as _native
from . import arguments as _args
from .buffers import may_share_memory as _share
from .persistent import Persistent
from . import api as _api
from .commstate import _by_handle, state, wait_until
# Buffer-spec parsing (specs.py) and the MPI type tables (mpitypes.py) live
# in their own modules; this one holds the Comm class and its fast path.
from .specs import (PLAIN_KINDS, _check_pair, _format_type, _in_place, _in_place_arg, _index, apart, parse, parse_v,
                    plain, plain_rooted, plain_v)
from .plancache import MISS as _MISS, counts_key
from .mpitypes import Native as _Native, kernel_dtype as _kernel_dtype, type_info as _type_info

__all__ = ["Comm", "count_calls"]


def _check_algorithm(collective: str, algorithm) -> None:
    _args.requested(collective, algorithm, _args.env_settings()[0])


# ---- which calls mpicoll served (counting is off unless asked for) ------------------

_calls = None


def count_calls(enable: bool = True):
    """Count, per mpi4py method name, the calls ``mpicoll.Comm`` served
    (key ``(name, "mpicoll")``) and those it handed to mpi4py
    (``(name, "mpi4py")``, and ``(name, "mpi4py", reason)`` per reason).
    ``count_calls()`` starts a fresh count and
    returns its ``collections.Counter``, which fills as calls are made;
    ``count_calls(False)`` stops counting and returns the last one."""
    global _calls
    if enable:
        _calls = collections.Counter()
        return _calls
    last, _calls = _calls, None
    return last


def _method(base: str, mode: str) -> str:
    """mpi4py's name of collective ``base`` in a mode: Scatterv, Iscatterv, Scatterv_init."""
    if mode == "run":
        return base
    if mode == "start":
        return "I" + base[0].lower() + base[1:]
    return base + "_init"


def _served(base: str, mode: str) -> None:
    if _calls is not None:
        _calls[_method(base, mode), "mpicoll"] += 1


def _attach(plan, pre, post) -> None:
    """Run the local packing of the user's layouts (``pre``, a list of
    specs._Msg.pack) before the plan's own prologue at every start, and the
    unpacking (``post``) after its finish at every completion (blocking,
    nonblocking and persistent)."""
    if pre:
        before = plan.prologue

        def prologue():
            for f in pre:
                f()
            if before is not None:
                before()

        plan.prologue = prologue
    if post:
        after = plan.finish

        def finish():
            if after is not None:
                after()
            for f in post:
                f()

        plan.finish = finish


def _go(base: str, mode: str, coll, *args, pre=(), post=(), **kw):
    """Run collective ``base`` in one of the three modes: "run" (blocking;
    the drop-in returns None like mpi4py), "start" (a Request) or "init" (a
    persistent request). ``coll`` names the collective's plan builder and
    front door (``"allgatherv"``: plan.allgatherv, api.allgatherv and
    api.iallgatherv, which take the same arguments), or is a builder of its
    own. A blocking or nonblocking call whose buffers need no packing (every
    plain array, ``[array, counts]``...) goes through the api door, whose
    kept plan serves a repeated signature without building one
    (plancache.py); a packed layout or a persistent request builds its plan."""
    if pre:
        pre = [f for f in pre if f is not None]
    if post:
        post = [f for f in post if f is not None]
    if mode != "init" and not pre and not post and type(coll) is str:
        return _door(base, mode, coll, *args, **kw)
    _served(base, mode)
    build = getattr(_plan, coll) if type(coll) is str else coll
    plan = build(*args, **kw) if mode == "run" else build(*args, nonblocking=True, **kw)
    _attach(plan, pre, post)
    if mode == "run":
        plan.run()
        return None
    return plan.start() if mode == "start" else Persistent(plan)


def _door(base: str, mode: str, coll: str, *args, **kw):
    """A blocking ("run") or nonblocking ("start") call whose buffers need
    no packing, through mpicoll's function of the same collective (``coll``,
    or ``"i" + coll``), whose kept plan serves a repeated signature without
    building one (plancache.py). Returns None when blocking, as mpi4py does,
    else the request. Every method's fast path ends here."""
    if _calls is not None:
        _served(base, mode)
    if mode == "run":
        _RUN[coll](*args, **kw)
        return None
    return _START[coll](*args, **kw)


# The api doors by collective, looked up once (a getattr per call was a
# measurable share of a short call).
_DOOR_NAMES = ("allreduce", "reduce", "reduce_scatter", "bcast", "allgather", "scatter", "gather", "allgatherv",
               "alltoall", "alltoallv")
_RUN = {c: getattr(_api, c) for c in _DOOR_NAMES}
_START = {c: getattr(_api, "i" + c) for c in _DOOR_NAMES}


def _sending(s, r, in_place: bool):
    """The packing a call's input needs: the receive buffer's in place."""
    return (r.pack if in_place else s.pack,)


def _mismatch(what: str, got: int, want: int):
    return ValueError(f"mismatch in {what}: {got} bytes, the receive side expects {want}")


def _root_arg(root, size: int) -> bool:
    """A root mpicoll can take; else mpi4py's TypeError or MPI's own
    invalid-root error, which every rank raises alike."""
    return isinstance(root, (int, np.integer)) and not isinstance(root, bool) and 0 <= root < size


# ---- the fast path: plain C-contiguous numpy arrays ------------------------------

def _fast_dtypes():
    """numpy dtype -> mpicoll DType, for the dtypes whose buffer format mpi4py
    maps to a datatype with a kernel (uint8 is MPI.BYTE there: not included)."""
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
    return dtypes_


_FAST = None
# (numpy dtype, MPI.Op handle) -> the kernel op name or None: what
# _fast_op decides for a pair, once (predefined ops keep their handles, and
# a user-defined op's handle is never a predefined one's, so None stays
# right for it). Bounded: a program freeing and creating ops for ever
# stops adding pairs.
_FAST_OPS = {}


def _fast_op(a, op, writable: bool):
    """The kernel op name when ``a`` is a C-contiguous numpy array (writable
    if asked) of a dtype with a kernel and ``op`` a predefined MPI.Op with a
    kernel for it; else None."""
    if type(a) is not np.ndarray or type(op) is not MPI.Op:
        return None
    flags = a.flags
    if not flags.c_contiguous or writable and not flags.writeable:
        return None
    key = (a.dtype, op.handle)
    name = _FAST_OPS.get(key, _FAST_OPS)
    if name is _FAST_OPS:
        name = _fast_op_name(a.dtype, op)
        if len(_FAST_OPS) < 1024:
            _FAST_OPS[key] = name
    return name


def _fast_op_name(dtype, op):
    global _FAST
    if _FAST is None:
        _FAST = _fast_dtypes()
    dt = _FAST.get(dtype)
    o = None if dt is None else _ops.of_mpi(op)
    if o is None or dt.kind not in o.kinds:
        return None
    return o.name


def _fast_allreduce(sendbuf, recvbuf, op):
    """(input, output, op name) when both buffers are C-contiguous numpy
    arrays (or the send buffer is IN_PLACE/None) of one dtype with a kernel
    and matching sizes, and the op is predefined with a kernel for it; None
    sends the call down the general path (which also reports errors)."""
    name = _fast_op(recvbuf, op, True)
    if name is None:
        return None
    out = recvbuf if recvbuf.ndim == 1 else recvbuf.reshape(-1)
    if sendbuf is None or sendbuf is MPI.IN_PLACE or sendbuf is recvbuf:
        return out, out, name
    if type(sendbuf) is not np.ndarray or sendbuf.dtype != recvbuf.dtype or sendbuf.size != recvbuf.size \
            or not sendbuf.flags.c_contiguous:
        return None
    # A different array over the same memory is in place too: mpicoll.allreduce
    # recognises that itself (and refuses a partial overlap).
    return (sendbuf if sendbuf.ndim == 1 else sendbuf.reshape(-1)), out, name


def _reduction_args(sendbuf, recvbuf, op):
    """(receive message, send message or None, in place?, DType, Op) of a
    reduction whose result lands in ``recvbuf`` (Allreduce, Reduce's root):
    both specs parsed, checked against each other, and the kernel found."""
    r = parse(recvbuf, writable=True)
    dt, o = _kernel_dtype(r.datatype, op)
    s, in_place = None, True
    if not _in_place_arg(sendbuf):
        s = parse(sendbuf, writable=False)
        _check_pair(s, r)
        in_place = _in_place(s, r)
    return r, s, in_place, dt, o


def _allgather_plan(comm, flat, mine, rank, p, algorithm, in_place, block, nonblocking=False):
    name, entry, knobs, check_on, timeout = _plan.options("allgather", algorithm, None, None, None)
    return _plan.allgather_bytes(comm, flat, mine, rank, p, name, entry, knobs, check_on, timeout, None,
                                 dict(count=block, dtype="bytes"), nonblocking, in_place=in_place)


# ---- scatter, gather, allgatherv, alltoall, alltoallv: helpers of their methods (plain arrays: specs.plain_rooted) ----

def _family_name(collective: str, algorithm) -> str:
    if algorithm == "auto" and _env.get(_args.ENV_ALGORITHM) is None:
        return "auto"  # the usual call: one look at the environment, not three (the door checks the rest)
    return _args.requested(collective, algorithm, _args.env_settings()[0])


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

    def _native(self, why, base: str, mode: str, args: tuple, info):
        """mpi4py's own method of the same collective and mode (``why``: the
        _Native raised, whose text says what mpicoll cannot serve)."""
        name = _method(base, mode)
        if _calls is not None:
            _calls[name, "mpi4py"] += 1
            _calls[name, "mpi4py", str(why) or "unspecified"] += 1
        fn = getattr(super(), name)
        return fn(*args, info) if mode == "init" else fn(*args)

    # -- reductions --
    # Each collective is one method _x(..., mode) that parses mpi4py's
    # arguments and builds the plan; the public methods (Allreduce,
    # Iallreduce, Allreduce_init...) are that method in the modes "run",
    # "start" and "init", written from the table _METHODS below the class.
    # What mpicoll cannot serve goes to mpi4py's method of the same mode.

    def _allreduce(self, sendbuf, recvbuf, op, algorithm, mode, info=MPI.INFO_NULL):
        fast = _fast_allreduce(sendbuf, recvbuf, op)
        if fast is not None:  # plain numpy arrays: the common case, without the general parsing
            # mpicoll.(i)allreduce keeps the decision under the call's
            # signature: a repeated call (same or new arrays) is served by
            # the kept plan without parsing (plancache.py).
            x, out, name = fast
            if mode != "init":
                return _door("Allreduce", mode, "allreduce", x, name, comm=self, out=out, algorithm=algorithm)
            return _go("Allreduce", mode, "allreduce", x, name, comm=self, out=out, algorithm=algorithm)
        try:
            if not isinstance(op, MPI.Op):
                raise _Native("op is not an MPI.Op")
            r, s, in_place, dt, o = _reduction_args(sendbuf, recvbuf, op)
        except _Native as why:
            return self._native(why, "Allreduce", mode, (sendbuf, recvbuf, op), info)
        r.dtype = dt
        flat = r.data()
        src = None if in_place else s.raw[:s.nbytes].view(dt.storage)
        return _go("Allreduce", mode, "allreduce", flat if src is None else src, o, comm=self, out=flat,
                   algorithm=algorithm, dtype=dt.name, pre=_sending(s, r, in_place), post=(r.unpack,))

    def _reduce(self, sendbuf, recvbuf, op, root, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init" and type(root) is int and 0 <= root < self.Get_size():
            if self.Get_rank() == root:
                fast = _fast_allreduce(sendbuf, recvbuf, op)
                if fast is not None and fast[0] is not fast[1] and not apart(fast[0], fast[1]):
                    fast = None  # the same memory as another array: the general path decides
            else:  # mpi4py ignores a non-root recvbuf entirely
                name = _fast_op(sendbuf, op, False)
                fast = None if name is None else (sendbuf.reshape(-1), None, name)
            if fast is not None:  # plain arrays: mpicoll.(i)reduce's own door (kept plans)
                x, out, name = fast
                return _door("Reduce", mode, "reduce", x, name, root, comm=self, out=out, algorithm=algorithm)
        try:
            if not isinstance(op, MPI.Op) or not _root_arg(root, self.Get_size()):
                raise _Native("op or root mpi4py or MPI refuses")
            if self.Get_rank() == root:
                r, s, in_place, dt, o = _reduction_args(sendbuf, recvbuf, op)
                pre, post = _sending(s, r, in_place), (r.unpack,)
                r.dtype = dt
                out = r.data()
                x = out if in_place else s.raw[:s.nbytes].view(dt.storage)
            else:  # mpi4py ignores a non-root recvbuf entirely
                s = parse(sendbuf, writable=False)
                dt, o = _kernel_dtype(s.datatype, op)
                x, out, pre, post = s.raw[:s.nbytes].view(dt.storage), None, (s.pack,), ()
        except _Native as why:
            return self._native(why, "Reduce", mode, (sendbuf, recvbuf, op, root), info)
        return _go("Reduce", mode, "reduce", x, o, root, comm=self, out=out, algorithm=algorithm, dtype=dt.name,
                   pre=pre, post=post)

    def _reduce_scatter_block(self, sendbuf, recvbuf, op, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init":
            name = _fast_op(recvbuf, op, True)
            if name is not None and type(sendbuf) is np.ndarray and sendbuf.dtype == recvbuf.dtype \
                    and sendbuf.flags.c_contiguous and sendbuf.size == self.Get_size() * recvbuf.size \
                    and apart(sendbuf, recvbuf):
                # plain arrays: mpicoll.(i)reduce_scatter's own door (kept plans)
                return self._fast_reduce_scatter("Reduce_scatter_block", mode, sendbuf, recvbuf, name, None,
                                                 algorithm)
        try:
            if not isinstance(op, MPI.Op):
                raise _Native("op is not an MPI.Op")
            p = self.Get_size()
            if _in_place_arg(sendbuf):
                r = parse(recvbuf, writable=True, blocks=p)
                dt, o = _kernel_dtype(r.datatype, op)
                r.dtype = dt
                x = r.raw[:r.nbytes * p].view(dt.storage)
                out = x[:r.count]
                pre = (r.pack,)
            else:
                r = parse(recvbuf, writable=True)
                s = parse(sendbuf, writable=False, blocks=p)
                _check_pair(s, r)
                dt, o = _kernel_dtype(r.datatype, op)
                r.dtype = dt
                out = r.data()
                x = s.raw[:s.nbytes * p].view(dt.storage)
                pre = (s.pack,)
                if out.nbytes and _share(x, out):
                    # mpi4py's "same address is in place" rule: the whole send
                    # buffer starting at the receive buffer.
                    if s.address != r.address:
                        raise ValueError("mpicoll: send and receive buffers partially overlap")
                    out = x[:r.count]
        except _Native as why:
            return self._native(why, "Reduce_scatter_block", mode, (sendbuf, recvbuf, op), info)
        return _go("Reduce_scatter_block", mode, "reduce_scatter", x, o, comm=self, counts=[r.count] * p, out=out,
                   algorithm=algorithm, dtype=dt.name, pre=pre, post=(r.unpack,))

    def _fast_reduce_scatter(self, which, mode, sendbuf, recvbuf, name, counts, algorithm):
        return _door(which, mode, "reduce_scatter", sendbuf.reshape(-1), name, comm=self, counts=counts,
                     out=recvbuf.reshape(-1), algorithm=algorithm)

    def _reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init":
            name = _fast_op(recvbuf, op, True)
            c = counts_key(recvcounts)
            if name is not None and c and type(sendbuf) is np.ndarray and sendbuf.dtype == recvbuf.dtype \
                    and sendbuf.flags.c_contiguous and len(c) == self.Get_size() and min(c) >= 0 \
                    and sendbuf.size == sum(c) and recvbuf.size == c[self.Get_rank()] and apart(sendbuf, recvbuf):
                # plain arrays and counts: mpicoll.(i)reduce_scatter's own door (kept plans)
                return self._fast_reduce_scatter("Reduce_scatter", mode, sendbuf, recvbuf, name, c, algorithm)
        try:
            if not isinstance(op, MPI.Op):
                raise _Native("op is not an MPI.Op")
            p, rank = self.Get_size(), self.Get_rank()
            r = parse(recvbuf, writable=True)
            in_place = _in_place_arg(sendbuf)
            s = None if in_place else parse(sendbuf, writable=False)
            if s is not None and s.nbytes and r.nbytes and s.address == r.address:
                in_place = True
            dt, o = _kernel_dtype(r.datatype, op)
            if s is not None and not in_place and s.spec[0] != r.spec[0]:
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
                # recvcounts count entries of the receive datatype: in entries of its predefined type
                counts = [c * r.per for c in counts]
            total = sum(counts)
            if not in_place:
                if s.count != total:
                    raise ValueError(f"mismatch in send count {s.count} and sum(counts) {total}")
                if r.count != counts[rank]:
                    raise ValueError(f"mismatch in receive count {r.count} and counts[{rank}] {counts[rank]}")
            elif r.count != total:
                raise ValueError(f"mismatch in receive count {r.count} and sum(counts) {total}")
            if any(c < 0 for c in counts):
                raise ValueError(f"negative count in recvcounts {counts}")
            r.dtype = dt
            if in_place:
                x = r.data()
                out = x[:counts[rank]]
            else:
                x = s.raw[:s.nbytes].view(dt.storage)
                out = r.data()
                if out.nbytes and x.nbytes and _share(x, out):
                    raise ValueError("mpicoll: send and receive buffers partially overlap")
        except _Native as why:
            return self._native(why, "Reduce_scatter", mode, (sendbuf, recvbuf, recvcounts, op), info)
        _check_algorithm("reduce_scatter", algorithm)
        return _go("Reduce_scatter", mode, "reduce_scatter", x, o, comm=self, counts=counts, out=out,
                   algorithm=algorithm, dtype=dt.name, pre=_sending(s, r, in_place), post=(r.unpack,))

    # -- data movement (any predefined datatype: nothing is reduced) --
    def _bcast(self, buf, root, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init" and type(buf) is np.ndarray and type(root) is int and buf.dtype.kind in PLAIN_KINDS:
            fl = buf.flags
            if fl.c_contiguous and fl.writeable and 0 <= root < self.Get_size():
                # A plain array: mpicoll.(i)bcast's own door, whose kept plan
                # serves a repeated signature without parsing (plancache.py).
                return _door("Bcast", mode, "bcast", buf, root, comm=self, algorithm=algorithm)
        try:
            if not _root_arg(root, self.Get_size()):
                raise _Native("a root mpi4py or MPI refuses")
            is_root = self.Get_rank() == root
            m = parse(buf, writable=not is_root)
            data = m.raw[:m.nbytes]
            if is_root and not data.flags.writeable:
                data = data.copy()  # root only sends, but mpicoll.bcast wants a writable buffer
        except _Native as why:
            return self._native(why, "Bcast", mode, (buf, root), info)
        return _go("Bcast", mode, "bcast", data, root, comm=self, algorithm=algorithm,
                   pre=(m.pack,) if is_root else (), post=() if is_root else (m.unpack,))

    def _allgather(self, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init" and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray \
                and sendbuf.dtype == recvbuf.dtype and sendbuf.dtype.kind in PLAIN_KINDS:
            p = self.Get_size()
            fs, fr = sendbuf.flags, recvbuf.flags
            if recvbuf.size == p * sendbuf.size and fs.c_contiguous and fr.c_contiguous and fr.writeable \
                    and not _share(sendbuf, recvbuf):
                # Plain arrays: mpicoll.(i)allgather's own door (kept plans, as in _bcast).
                return _door("Allgather", mode, "allgather", sendbuf, comm=self,
                             out=recvbuf.reshape((p,) + sendbuf.shape), algorithm=algorithm)
        try:
            p, rank = self.Get_size(), self.Get_rank()
            r = parse(recvbuf, writable=True, blocks=p)
            block = r.nbytes
            flat = r.raw[:block * p]
            mine, in_place, s = None, True, None
            if not _in_place_arg(sendbuf):
                s = parse(sendbuf, writable=False)
                if s.nbytes != block:
                    raise _mismatch("send size", s.nbytes, block)
                mine = s.raw[:s.nbytes]
                if block and _share(mine, flat):
                    if mine.ctypes.data != flat[rank * block:].ctypes.data:
                        raise ValueError("mpicoll: send buffer overlaps the receive buffer")
                else:
                    in_place = False
        except _Native as why:
            return self._native(why, "Allgather", mode, (sendbuf, recvbuf), info)
        return _go("Allgather", mode, _allgather_plan, self, flat, mine, rank, p, algorithm, in_place, block,
                   pre=_sending(s, r, in_place), post=(r.unpack,))



    # -- scatter / scatterv --
    def _rooted(self, coll, v, algorithm, root, counts, is_root):
        """(algorithm name, counts in bytes on every rank). The v-forms'
        non-roots know only their own count: "auto" is then the native call
        (a size rule would need every count), and the binomial tree, which
        needs them all, gets them from the root first."""
        name = _family_name(coll, algorithm)
        if v and name == "auto":
            name = "mpi"
        if v and name == "tree":
            # A collective step before the plan's: under the deadline too.
            timeout = _args.env_settings()[2]
            st = state(self, timeout, coll)
            n = np.array(counts if is_root else [0] * st.size, np.int64)
            if timeout is None:
                st.comm.Bcast(n, root)
            else:
                wait_until(st.comm.Ibcast(n, root), time.monotonic() + timeout, st.rank, coll,
                           "broadcast of the root's counts", st.seq, buffers=(n,))
            counts = n.tolist()
        return name, counts

    def _fast_rooted_v(self, coll, full, block, root, algorithm, recv_side):
        """Scatterv/Gatherv's fast path: (algorithm, root's flat buffer or None,
        counts) when this rank's ``block`` is a plain array and, on root, the
        v-spec ``full`` is ``[array, counts]`` over a plain array (specs.plain_v);
        None sends the call down the general path. Off root only this rank's
        count is known, as in the general path (_rooted)."""
        if type(root) is not int or not plain(block, recv_side):
            return None
        p, rank = self.Get_size(), self.Get_rank()
        if not 0 <= root < p:
            return None
        if rank == root:
            fv = plain_v(full, p, not recv_side, like=block)
            if fv is None or fv[1][rank] != block.size or not apart(fv[0], block):
                return None
            flat, counts = fv
        else:
            flat, counts = None, [0] * p
            counts[rank] = block.size
        name = _family_name(coll, algorithm)
        if name == "auto":
            name = "mpi"
        return None if name == "tree" else (name, flat, counts)

    def _scatter(self, which, sendbuf, recvbuf, root, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Scatterv"
        if v and mode != "init":
            fast = self._fast_rooted_v("scatter", sendbuf, recvbuf, root, algorithm, recv_side=True)
            if fast is not None:  # plain arrays: mpicoll.(i)scatter's own door (kept plans)
                name, flat, counts = fast
                return _door(which, mode, "scatter", flat, root, comm=self, out=recvbuf.reshape(-1), counts=counts,
                             algorithm=name)
        if not v and mode != "init":
            x = plain_rooted(self, sendbuf, recvbuf, root, recv_side=True)
            if x is not False:  # plain arrays: mpicoll.(i)scatter's own door (kept plans)
                return _door(which, mode, "scatter", x, root, comm=self, out=recvbuf, algorithm=algorithm)
        try:
            if not _root_arg(root, self.Get_size()):
                raise _Native("a root mpi4py or MPI refuses")
            p, rank = self.Get_size(), self.Get_rank()
            is_root = rank == root
            r = None if is_root and _in_place_arg(recvbuf) else parse(recvbuf, writable=True)
            pre = ()
            post = () if r is None else (r.unpack,)
            if is_root:
                if v:
                    s = parse_v(sendbuf, False, p)
                    counts = s.counts
                    full = s.raw[:sum(counts)]
                else:
                    s = parse(sendbuf, writable=False, blocks=p)
                    full, counts = s.raw[:s.nbytes * p], [s.nbytes] * p
                pre = (s.pack,)
                if r is not None and r.nbytes != counts[rank]:
                    raise _mismatch("the root's send block", counts[rank], r.nbytes)
                a = sum(counts[:rank])
                out = full[a:a + counts[rank]] if r is None else r.raw[:r.nbytes]
            else:
                full, out = None, r.raw[:r.nbytes]
                counts = [0] * p
                counts[rank] = r.nbytes
                if not v:
                    counts = [r.nbytes] * p
        except _Native as why:
            return self._native(why, which, mode, (sendbuf, recvbuf, root), info)
        name, counts = self._rooted("scatter", v, algorithm, root, counts, is_root)
        return _go(which, mode, "scatter", full, root, comm=self, out=out, counts=counts, algorithm=name,
                   pre=pre, post=post)

    # -- gather / gatherv --
    def _gather(self, which, sendbuf, recvbuf, root, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Gatherv"
        if v and mode != "init":
            fast = self._fast_rooted_v("gather", recvbuf, sendbuf, root, algorithm, recv_side=False)
            if fast is not None:  # plain arrays: mpicoll.(i)gather's own door (kept plans)
                name, flat, counts = fast
                return _door(which, mode, "gather", sendbuf.reshape(-1), root, comm=self, out=flat, counts=counts,
                             algorithm=name)
        if not v and mode != "init":
            out = plain_rooted(self, recvbuf, sendbuf, root, recv_side=False)
            if out is not False:  # plain arrays: mpicoll.(i)gather's own door (kept plans)
                return _door(which, mode, "gather", sendbuf, root, comm=self, out=out, algorithm=algorithm)
        try:
            if not _root_arg(root, self.Get_size()):
                raise _Native("a root mpi4py or MPI refuses")
            p, rank = self.Get_size(), self.Get_rank()
            is_root = rank == root
            s = None if is_root and _in_place_arg(sendbuf) else parse(sendbuf, writable=False)
            if is_root:
                if v:
                    r = parse_v(recvbuf, True, p)
                    counts = r.counts
                    full = r.raw[:sum(counts)]
                else:
                    r = parse(recvbuf, writable=True, blocks=p)
                    full, counts = r.raw[:r.nbytes * p], [r.nbytes] * p
                if s is not None and s.nbytes != counts[rank]:
                    raise _mismatch("send size", s.nbytes, counts[rank])
                a = sum(counts[:rank])
                x = full[a:a + counts[rank]] if s is None else s.raw[:s.nbytes]
                pre, post = _sending(s, r, s is None), (r.unpack,)
            else:
                full, x, pre, post = None, s.raw[:s.nbytes], (s.pack,), ()
                counts = [0] * p
                counts[rank] = s.nbytes
                if not v:
                    counts = [s.nbytes] * p
        except _Native as why:
            return self._native(why, which, mode, (sendbuf, recvbuf, root), info)
        name, counts = self._rooted("gather", v, algorithm, root, counts, is_root)
        return _go(which, mode, "gather", x, root, comm=self, out=full, counts=counts, algorithm=name,
                   pre=pre, post=post)

    # -- allgatherv --
    def _allgatherv(self, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        if mode != "init" and plain(sendbuf, False):
            fv = plain_v(recvbuf, self.Get_size(), True, like=sendbuf)
            if fv is not None and fv[1][self.Get_rank()] == sendbuf.size and apart(fv[0], sendbuf):
                # plain arrays: mpicoll.(i)allgatherv's own door (kept plans)
                return _door("Allgatherv", mode, "allgatherv", sendbuf.reshape(-1), fv[1], comm=self, out=fv[0],
                             algorithm=algorithm)
        try:
            p, rank = self.Get_size(), self.Get_rank()
            r = parse_v(recvbuf, True, p)
            counts = r.counts
            full = r.raw[:sum(counts)]
            a = sum(counts[:rank])
            s = None
            if _in_place_arg(sendbuf):
                x = full[a:a + counts[rank]]
            else:
                s = parse(sendbuf, writable=False)
                if s.nbytes != counts[rank]:
                    raise _mismatch("send size", s.nbytes, counts[rank])
                x = s.raw[:s.nbytes]
        except _Native as why:
            return self._native(why, "Allgatherv", mode, (sendbuf, recvbuf), info)
        return _go("Allgatherv", mode, "allgatherv", x, counts, comm=self, out=full, algorithm=algorithm,
                   pre=_sending(s, r, s is None), post=(r.unpack,))

    # -- alltoall / alltoallv --
    def _alltoall(self, which, sendbuf, recvbuf, algorithm, mode, info=MPI.INFO_NULL):
        v = which == "Alltoallv"
        if not v and mode != "init" and type(sendbuf) is np.ndarray and type(recvbuf) is np.ndarray \
                and sendbuf.dtype == recvbuf.dtype and sendbuf.dtype.kind in PLAIN_KINDS:
            p = self.Get_size()
            fs, fr = sendbuf.flags, recvbuf.flags
            if sendbuf.size == recvbuf.size and sendbuf.size % p == 0 and fs.c_contiguous and fr.c_contiguous \
                    and fr.writeable and not _share(sendbuf, recvbuf):
                # plain arrays: mpicoll.(i)alltoall's own door (kept plans)
                shape = (p, sendbuf.size // p)
                return _door(which, mode, "alltoall", sendbuf.reshape(shape), comm=self, out=recvbuf.reshape(shape),
                             algorithm=algorithm)
        if v and mode != "init":
            p = self.Get_size()
            sv = plain_v(sendbuf, p, False)
            rv = None if sv is None else plain_v(recvbuf, p, True, like=sv[0])
            if rv is not None and apart(sv[0], rv[0]):
                # plain arrays: mpicoll.(i)alltoallv's own door (kept plans)
                return _door(which, mode, "alltoallv", sv[0], sv[1], rv[1], comm=self, out=rv[0], algorithm=algorithm)
        try:
            p = self.Get_size()
            s = None
            if v:
                r = parse_v(recvbuf, True, p)
                rc = r.counts
                out = r.raw[:sum(rc)]
                if _in_place_arg(sendbuf):
                    x, sc = out, rc
                else:
                    s = parse_v(sendbuf, False, p)
                    sc = s.counts
                    x = s.raw[:sum(sc)]
            else:
                r = parse(recvbuf, writable=True, blocks=p)
                out = r.raw[:r.nbytes * p]
                if _in_place_arg(sendbuf):
                    x = out
                else:
                    s = parse(sendbuf, writable=False, blocks=p)
                    if s.nbytes != r.nbytes:
                        raise _mismatch("send block size", s.nbytes, r.nbytes)
                    x = s.raw[:s.nbytes * p]
        except _Native as why:
            return self._native(why, which, mode, (sendbuf, recvbuf), info)
        pre, post = _sending(s, r, s is None), (r.unpack,)
        if v:
            return _go(which, mode, "alltoallv", x, sc, rc, comm=self, out=out, algorithm=algorithm,
                       pre=pre, post=post)
        block = out.size // p
        return _go(which, mode, "alltoall", x.reshape(p, block), comm=self, out=out.reshape(p, block),
                   algorithm=algorithm, pre=pre, post=post)


# ---- the public methods, from one table -------------------------------------------
# mpi4py's name of each collective, its parameters as mpi4py spells them
# (callers pass them by position and by keyword alike), the method above that
# serves it in every mode and the arguments that method takes before them.
# Each row becomes three methods, e.g. Allreduce, Iallreduce, Allreduce_init:
#
#     def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, *, algorithm="auto"):
#         return self._allreduce(sendbuf, recvbuf, op, algorithm, "run")
#
# (the _init form takes mpi4py's ``info`` after the others). They are
# written out as source and compiled once at import, as namedtuple and
# dataclasses do: a real signature (mpi4py's TypeError for a wrong call,
# help() and inspect show it) at the cost of a plain method call. Where
# csrc/native.c is built, every row's blocking and I-form is a MethodDoor
# (its D_COMM_<NAME> and D_COMM_I<NAME>) over that method: a repeated call on plain arrays finds the kept entry
# the api door filed and runs its gated call without these methods' frames
# (~1.5 us of a 2 us call at p = 2); any other call goes to the method.
_METHODS = (
    ("Allreduce", "sendbuf, recvbuf, op=MPI.SUM", "_allreduce", ""),
    ("Reduce", "sendbuf, recvbuf, op=MPI.SUM, root=0", "_reduce", ""),
    ("Reduce_scatter_block", "sendbuf, recvbuf, op=MPI.SUM", "_reduce_scatter_block", ""),
    ("Reduce_scatter", "sendbuf, recvbuf, recvcounts=None, op=MPI.SUM", "_reduce_scatter", ""),
    ("Bcast", "buf, root=0", "_bcast", ""),
    ("Allgather", "sendbuf, recvbuf", "_allgather", ""),
    ("Scatter", "sendbuf, recvbuf, root=0", "_scatter", "'Scatter', "),
    ("Scatterv", "sendbuf, recvbuf, root=0", "_scatter", "'Scatterv', "),
    ("Gather", "sendbuf, recvbuf, root=0", "_gather", "'Gather', "),
    ("Gatherv", "sendbuf, recvbuf, root=0", "_gather", "'Gatherv', "),
    ("Allgatherv", "sendbuf, recvbuf", "_allgatherv", ""),
    ("Alltoall", "sendbuf, recvbuf", "_alltoall", "'Alltoall', "),
    ("Alltoallv", "sendbuf, recvbuf", "_alltoall", "'Alltoallv', "),
)

_DOCS = {
    "run": "mpi4py's ``{name}`` on mpicoll (the module docstring says what is accepted); ``algorithm=`` "
           "picks one of mpicoll's algorithms. Returns None, as mpi4py does.",
    "start": "mpi4py's ``{name}`` on mpicoll: returns an ``mpicoll.Request`` (``Wait``/``Test``/``wait``/"
             "``test``; ``mpicoll.waitall`` for several), or mpi4py's ``MPI.Request`` where the call falls "
             "back to mpi4py.",
    "init": "mpi4py's ``{name}`` on mpicoll: a persistent request (``Start``/``Wait``/``Test``), an "
            "``mpicoll.Persistent``, or mpi4py's ``MPI.Prequest`` where the call falls back to mpi4py.",
}


# The kept signature's name (the api function the method calls), where it is
# not the method's own name in lower case.
_DOOR_KEYS = {"Reduce_scatter_block": "reduce_scatter", "Scatterv": "scatter", "Gatherv": "gather"}


def _define_methods(cls) -> None:
    mod = _native.module()
    for base, params, impl, lead in _METHODS:
        args = ", ".join(a.split("=")[0] for a in params.split(", "))
        for mode in ("run", "start", "init"):
            name = _method(base, mode)
            extra, info = (", info=MPI.INFO_NULL", ", info") if mode == "init" else ("", "")
            src = (f"def {name}(self, {params}{extra}, *, algorithm='auto'):\n"
                   f"    return self.{impl}({lead}{args}, algorithm, {mode!r}{info})\n")
            scope = {"MPI": MPI}
            exec(compile(src, f"<mpicoll.Comm.{name}>", "exec"), scope)
            fn = scope[name]
            fn.__module__, fn.__qualname__ = cls.__module__, f"{cls.__name__}.{name}"
            fn.__doc__ = _DOCS[mode].format(name=name)
            if mode != "init" and mod is not None:
                which = getattr(mod, "D_COMM_" + ("" if mode == "run" else "I") + base.upper())
                key = ("i" if mode == "start" and base == "Allreduce" else "") + _DOOR_KEYS.get(base, base.lower())
                fn = functools.update_wrapper(mod.MethodDoor(
                    which, fn, _by_handle, 0, MPI.Comm, key, _api.started_long, _MISS,
                    (globals(), MPI.SUM, MPI.IN_PLACE, MPI.Op, PLAIN_KINDS)), fn)
            setattr(cls, name, fn)


_define_methods(Comm)
