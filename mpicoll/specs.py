"""mpi4py's buffer specs, parsed the way mpi4py's ``message_simple`` and
``message_vector`` parse them (same accepted forms, same errors), for the
drop-in ``mpicoll.Comm``: a bare buffer, ``[buf, datatype]``, ``[buf,
count]``, ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]``,
``[buf, count, displ, datatype]`` (counts and displacements per block for
the v-forms); buffers acquired by mpi4py's own ``MPI.buffer``.

Whether a call runs on mpicoll may depend only on what MPI requires every
rank to agree on (the type signature, the collective, the root), never on
one rank's layout: a derived datatype whose signature is one predefined
type repeated, MPI.BOTTOM, and v-form displacements are packed into a
contiguous scratch on that rank (``_Msg.pack``/``unpack``)."""
from __future__ import annotations

import ctypes
import itertools
import operator
import threading

import numpy as np
from mpi4py import MPI

from .buffers import may_share_memory as _share
from .mpitypes import Native as _Native, type_info as _type_info
from .plancache import counts_key


# ---- buffer specs (mirrors mpi4py's message_simple) -----------------------------

_TYPEDICT = MPI._typedict


def _as_datatype(t) -> MPI.Datatype:
    if isinstance(t, MPI.Datatype):
        return t
    try:
        return _TYPEDICT[t]
    except (KeyError, TypeError):
        raise KeyError(f"cannot map {t!r} to MPI datatype") from None


def _format_type(obj, fmt: str) -> MPI.Datatype:
    if fmt == "B":
        return MPI.BYTE
    if fmt[:1] in "@<" and len(fmt) > 1:
        if fmt[0] == "<" and np.little_endian is False:  # pragma: no cover - big-endian hosts
            raise BufferError(f"format string {fmt!r} with non-native byte order")
        fmt = fmt[1:]
    elif fmt[:1] in ">!":
        if not (fmt[0] == ">" and not np.little_endian):
            raise BufferError(f"format string {fmt!r} with non-native byte order")
        fmt = fmt[1:]
    return _as_datatype(fmt)


def _is_datatype(x) -> bool:
    return isinstance(x, (MPI.Datatype, str))


def _index(x) -> int:
    return operator.index(x)


class _Msg:
    """One parsed buffer spec: ``raw`` (uint8, from the first used byte),
    ``count`` entries of ``datatype`` (``itemsize`` bytes each); for a
    vector spec also ``counts`` (bytes per block, packed one after the
    other in ``raw``).

    A layout MPI can describe but mpicoll's plans cannot (a derived
    datatype, MPI.BOTTOM, v-form displacements that are not the packed
    prefix sums) is absorbed on this rank alone: ``raw`` is then a packed
    scratch, ``pack()`` copies the user's data into it and ``unpack()``
    copies it back (both None for a plain buffer). Every rank so runs the
    same mpicoll call whatever layout each one chose, as MPI allows."""

    __slots__ = ("raw", "count", "datatype", "itemsize", "dtype", "counts", "pack", "unpack", "per", "spec")

    @property
    def nbytes(self) -> int:
        return self.count * self.itemsize

    def data(self) -> np.ndarray:
        """The used bytes, as a storage array of the kernel dtype (bytes if none)."""
        b = self.raw[:self.nbytes]
        return b.view(self.dtype.storage) if self.dtype is not None else b

    @property
    def address(self) -> int:
        return self.raw.ctypes.data if self.raw.size else 0


def _new_msg(raw, count, datatype, size, dt, pack=None, unpack=None, counts=None, per=1, spec=None) -> _Msg:
    """``per``: entries of ``datatype`` (the predefined type) per entry of the
    user's datatype; ``spec``: (the user's datatype, count) as mpi4py sees them."""
    m = _Msg()
    m.raw, m.count, m.datatype, m.itemsize, m.dtype = raw, count, datatype, size, dt
    m.counts, m.pack, m.unpack, m.per = counts, pack, unpack, per
    m.spec = (datatype, count) if spec is None else spec
    return m


def _host_bytes(o_buf, writable: bool) -> np.ndarray:
    """uint8 view of a host buffer, acquired by mpi4py's own MPI.buffer."""
    if not _is_buffer(o_buf):
        if hasattr(o_buf, "__cuda_array_interface__"):
            raise _Native("device memory")  # the MPI library may handle it, we cannot
        dev = getattr(o_buf, "__dlpack_device__", None)
        if dev is not None and dev()[0] != 1:  # kDLCPU
            raise _Native("device memory")
    mb = MPI.buffer(o_buf)
    if writable and mb.readonly:
        # Let mpi4py's own writable-buffer acquisition raise its own error (it
        # fails before MPI is called; a no-op on COMM_SELF if it did not).
        MPI.COMM_SELF.Allreduce(MPI.IN_PLACE, [o_buf, MPI.BYTE], MPI.BOR)
        raise BufferError("message: buffer is not writable")
    if mb.nbytes == 0:
        return np.empty(0, np.uint8)
    return np.frombuffer(mb, np.uint8)


def _is_buffer(obj) -> bool:
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


# ---- DLPack: the element format, read from the capsule as mpi4py does ---------------
# numpy.from_dlpack cannot be used for this: it refuses (or worse, with some
# producers crashes on) dtypes numpy lacks or capsules it does not expect.

class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):  # DLManagedTensor (DLPack 0.x)
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _DLManagedVersioned(ctypes.Structure):  # DLManagedTensorVersioned (DLPack 1.x)
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]

_C_SIZES = {"char": 1, "short": ctypes.sizeof(ctypes.c_short), "int": ctypes.sizeof(ctypes.c_int),
            "long": ctypes.sizeof(ctypes.c_long), "longlong": ctypes.sizeof(ctypes.c_longlong),
            "float": 4, "double": 8, "longdouble": ctypes.sizeof(ctypes.c_longdouble)}


def _dlpack_format(o_buf) -> str:
    """The struct format mpi4py gives a CPU DLPack buffer (its
    dlpack_get_format): "B" (bytes) for what it has no code for."""
    try:  # DLPack 1.x first, then 0.x: the order mpi4py tries them in
        capsule, name, layout = o_buf.__dlpack__(max_version=(1, 0), copy=False), b"dltensor_versioned", \
            _DLManagedVersioned
    except TypeError:
        capsule, name, layout = o_buf.__dlpack__(), b"dltensor", _DLManaged
    if not _capsule_valid(capsule, name):
        raise BufferError("dlpack: invalid capsule object")
    # The capsule stays unconsumed: its destructor releases the tensor.
    dtype = layout.from_address(_capsule_pointer(capsule, name)).dl_tensor.dtype
    code, bits, lanes = dtype.code, dtype.bits, dtype.lanes
    if lanes != 1:
        if code == 2 and lanes == 2 and bits in (32, 64, 8 * _C_SIZES["longdouble"]):
            return {32: "Zf", 64: "Zd"}.get(bits, "Zg")
        return "B"
    if code == 6 and bits == 8:  # kDLBool
        return "?"
    if code in (0, 1):  # kDLInt, kDLUInt: char, short, int, long, long long in mpi4py's order
        for k, ch in (("char", "b"), ("short", "h"), ("int", "i"), ("long", "l"), ("longlong", "q")):
            if bits == 8 * _C_SIZES[k]:
                return ch if code == 0 else ch.upper()
    if code == 2:  # kDLFloat
        for b, ch in ((16, "e"), (32, "f"), (64, "d"), (8 * _C_SIZES["longdouble"], "g")):
            if bits == b:
                return ch
    if code == 5:  # kDLComplex
        for b, ch in ((32, "Ze"), (64, "Zf"), (128, "Zd"), (16 * _C_SIZES["longdouble"], "Zg")):
            if bits == b:
                return ch
    return "B"


def _buffer_format(o_buf) -> str:
    if _is_buffer(o_buf):
        with memoryview(o_buf) as mv:
            return mv.format
    return _dlpack_format(o_buf)


# ---- derived datatypes and MPI.BOTTOM: packed locally by MPI itself ----------------

_SELF = None
# One copy at a time: an unpack may run on the progress thread while the
# program's thread packs the next call, and two Sendrecv on one
# communicator with one tag could match each other's messages.
_SELF_LOCK = threading.Lock()


def _self_comm() -> MPI.Intracomm:
    """A private duplicate of COMM_SELF for the local copies (never matches
    a message of the program's own)."""
    global _SELF
    if _SELF is None:
        _SELF = MPI.COMM_SELF.Dup()
    return _SELF


def _basic_of(datatype: MPI.Datatype):
    """(T, n): the datatype's type signature is n copies of the predefined
    type T (which mpicoll knows); _Native otherwise. A function of the
    signature alone, which MPI requires to match across ranks: every rank
    decides the same way."""
    if datatype == MPI.DATATYPE_NULL:
        raise _Native("MPI.DATATYPE_NULL")  # mpi4py's own error
    leaves, stack, made = {}, [datatype], []
    try:
        while stack:
            t = stack.pop()
            if t.combiner == MPI.COMBINER_NAMED:
                leaves[t.py2f()] = t
                continue
            types = t.contents[3]
            made.extend(u for u in types if u.combiner != MPI.COMBINER_NAMED)
            stack.extend(types)
            if not types or len(leaves) > 1:
                raise _Native("a type signature of several predefined types")  # or F90 parameterised
    finally:
        for u in made:  # get_contents returns new handles for derived types
            u.Free()
    if len(leaves) != 1:
        raise _Native("a type signature of several predefined types")
    (basic,) = leaves.values()
    size, _ = _type_info(basic)
    if size <= 0 or datatype.size % size:
        raise _Native("a type signature of several predefined types")
    return basic, datatype.size // size


def _spec_bounds(length: int, count: int, displ: int, datatype: MPI.Datatype, what: str) -> None:
    """The bytes ``count`` entries of ``datatype`` at entry ``displ`` touch
    must lie inside the buffer's ``length`` bytes (mpi4py leaves that to MPI)."""
    if count <= 0 or datatype.size == 0:
        return
    lb, extent = datatype.true_lb, datatype.true_extent
    first = displ * datatype.extent + lb
    last = displ * datatype.extent + (count - 1) * datatype.extent + lb + extent
    if first < 0 or last > length:
        raise ValueError(f"message: {what} of {count} entries at displacement {displ} needs bytes "
                         f"[{first}, {last}), the buffer has {length}")


def _local_copy(o_buf, count, displ, datatype, basic, n, scratch):
    """pack/unpack between [o_buf, count, displ, datatype] and ``scratch``
    (count * n entries of ``basic``): a Sendrecv on COMM_SELF, whose two
    type signatures match, so MPI itself follows the layout."""
    spec = [o_buf, count, displ, datatype]
    packed = [scratch, count * n, basic]

    def pack():
        with _SELF_LOCK:
            _self_comm().Sendrecv(spec, 0, 0, packed, 0, 0)

    def unpack():
        with _SELF_LOCK:
            _self_comm().Sendrecv(packed, 0, 0, spec, 0, 0)

    return pack, unpack


def _is_index(x) -> bool:
    """mpi4py's is_integral: an index that is not a sequence."""
    if not hasattr(type(x), "__index__"):
        return False
    try:
        len(x)
    except TypeError:
        return True
    return False


def _unpack_spec(msg, vector: bool):
    """(o_buf, o_count, o_displ, o_type) of a message, as mpi4py's
    message_simple / message_vector split it: the second item of a 2- or
    3-item spec is (count, displ) when it is a tuple (or, for a simple
    message, a list)."""
    o_buf = o_count = o_displ = o_type = None
    pair = tuple if vector else (list, tuple)
    if _is_buffer(msg):
        o_buf = msg
    elif isinstance(msg, (list, tuple)):
        n = len(msg)
        if n == 2:
            o_buf, o_count = msg
            if _is_datatype(o_count):
                o_count, o_type = None, o_count
            elif isinstance(o_count, pair):
                o_count, o_displ = o_count
        elif n == 3:
            o_buf, o_count, o_type = msg
            if isinstance(o_count, pair):
                o_count, o_displ = o_count
        elif n == 4:
            o_buf, o_count, o_displ, o_type = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
    elif hasattr(msg, "__dlpack__") or hasattr(msg, "__cuda_array_interface__"):
        o_buf = msg
    else:
        raise TypeError("message: expecting buffer or list/tuple")
    return o_buf, o_count, o_displ, o_type


def _basic_buffer(o_buf, o_type, writable: bool):
    """(bytes of the whole buffer, datatype) as mpi4py's message_basic
    acquires them; BOTTOM gives no bytes and needs a datatype."""
    if o_buf is MPI.BOTTOM:
        return None, _as_datatype(o_type)
    if o_buf is None:
        return np.empty(0, np.uint8), _as_datatype(o_type)
    raw = _host_bytes(o_buf, writable)
    datatype = _as_datatype(o_type) if o_type is not None else _format_type(o_buf, _buffer_format(o_buf))
    return raw, datatype


def _extent(datatype: MPI.Datatype, what: str):
    lb, extent = datatype.lb, datatype.extent
    if extent <= 0:
        raise ValueError(f"message: cannot {what}, datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
    return lb, extent


def _typed_buffer(o_buf, o_type, writable: bool):
    """What both spec parsers need of a buffer and its datatype: (bytes,
    datatype, MPI.BOTTOM?, derived?, the predefined type it repeats and how
    many times per entry, that type's size, mpicoll DType). MPI.BOTTOM's
    bytes are an empty array: MPI addresses them through the datatype."""
    raw, datatype = _basic_buffer(o_buf, o_type, writable)
    bottom = raw is None
    if bottom:
        raw = np.empty(0, np.uint8)
    derived = bottom or _is_derived(datatype)
    basic, n = _basic_of(datatype) if derived else (datatype, 1)
    size, dt = _type_info(basic)
    return raw, datatype, bottom, derived, basic, n, size, dt


# ---- plain numpy arrays: the common case, parsed without the general path -----
# What the general parsing finds for a C-contiguous numpy array of a plain
# dtype depends on its dtype alone: learned once per dtype (by the general
# parsing itself), then a call only checks the array and its counts. Any
# other spec, or one these checks do not accept, takes the general path,
# which gives mpi4py's errors.

_PLAIN = {}  # numpy dtype -> (datatype, size, DType), or None: the general path


def _plain_type(arr: np.ndarray):
    """(datatype, size, DType) of ``arr``'s elements as the general parsing
    maps them, or None when it needs the general parsing."""
    if not arr.flags.c_contiguous:
        return None
    d = arr.dtype
    got = _PLAIN.get(d, False)
    if got is False:
        got = None
        if d.kind in "biufc":
            try:
                _, datatype, _, derived, _, _, size, dt = _typed_buffer(np.empty(1, d), None, False)
                if not derived:
                    got = (datatype, size, dt)
            except (_Native, KeyError, BufferError, ValueError, TypeError):
                pass  # raised again, for the call's own array, by the general path
        _PLAIN[d] = got
    return got


def _parse_plain(arr: np.ndarray, writable: bool, blocks: int):
    """``parse`` of a bare numpy array, or None."""
    t = _plain_type(arr)
    if t is None or writable and not arr.flags.writeable:
        return None
    count = arr.size
    if blocks >= 2:
        if count % blocks:
            return None
        count //= blocks
    datatype, size, dt = t
    return _new_msg(arr.reshape(-1).view(np.uint8), count, datatype, size, dt)


def _parse_plain_v(arr: np.ndarray, counts: list, writable: bool, blocks: int):
    """``parse_v`` of ``[array, counts]`` (counts a list of ints: packed
    blocks, as mpi4py lays them out), or None."""
    t = _plain_type(arr)
    if t is None or writable and not arr.flags.writeable or len(counts) != blocks:
        return None
    total = 0
    for c in counts:
        if type(c) is not int or c < 0:
            return None
        total += c
    if total > arr.size:
        return None
    datatype, size, dt = t
    return _new_msg(arr.reshape(-1).view(np.uint8)[:total * size], total, datatype, size, dt,
                    counts=[c * size for c in counts])


def parse(msg, writable: bool, blocks: int = 0) -> _Msg:
    """Parse an mpi4py buffer spec the way mpi4py's ``message_simple`` does
    (same accepted forms, same errors); _Native for what only MPI can do."""
    if type(msg) is np.ndarray:
        m = _parse_plain(msg, writable, blocks)
        if m is not None:
            return m
    o_buf, o_count, o_displ, o_type = _unpack_spec(msg, False)
    raw, datatype, bottom, derived, basic, n, size, dt = _typed_buffer(o_buf, o_type, writable)

    length = raw.size
    displ = 0
    if o_displ is not None:
        displ = _index(o_displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        if displ > 0:
            lb, extent = _extent(datatype, "handle displacement") if derived else (0, size)
            if displ * extent > length:
                raise ValueError(f"message: displacement {displ} out of bounds, "
                                 f"number of datatype entries {length // extent}")
            if not derived:
                raw = raw[displ * size:]
            length -= displ * extent
    if o_count is not None:
        count = _index(o_count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count > 0 and o_buf is None:
            raise ValueError(f"message: buffer is None but count is {count}")
        if not derived and count * size * max(blocks, 1) > length:
            # mpi4py hands this to MPI unchecked (a read or write past the buffer).
            raise ValueError(f"message: count {count} of {max(blocks, 1)} block(s) needs "
                             f"{count * size * max(blocks, 1)} bytes, the buffer has {length}")
    else:
        count = 0
        if length > 0:
            lb, extent = _extent(datatype, "infer count") if derived else (0, size)
            if length % extent:
                raise ValueError(f"message: cannot infer count, buffer length {length} is not a multiple of "
                                 f"datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
            entries = length // extent
            if blocks < 2:
                count = entries
            else:
                if entries % blocks:
                    raise ValueError(f"message: cannot infer count, number of entries {entries} is not a "
                                     f"multiple of required number of blocks {blocks}")
                count = entries // blocks
    if not derived:
        return _new_msg(raw, count, datatype, size, dt)
    # The whole message (blocks of count entries each) goes through a packed scratch.
    total = count * max(blocks, 1)
    if not bottom:
        _spec_bounds(raw.size, total, displ, datatype, "message")
    scratch = np.empty(total * n * size, np.uint8)
    pack, unpack = _local_copy(o_buf, total, displ, datatype, basic, n, scratch)
    return _new_msg(scratch, count * n, basic, size, dt, pack, unpack, per=n, spec=(datatype, count))


def _is_derived(datatype) -> bool:
    """True for a datatype the type table does not list (derived, or a
    predefined one mpicoll has no size for: _basic_of sorts them out)."""
    try:
        _type_info(datatype)
        return False
    except _Native:
        return True


def parse_v(msg, writable: bool, blocks: int) -> _Msg:
    """mpi4py's vector spec (``message_vector``): buf, [buf, datatype],
    [buf, counts], [buf, (counts, displs)], [buf, counts, datatype],
    [buf, (counts, displs), datatype], [buf, counts, displs, datatype];
    counts and displacements each a sequence of ``blocks`` ints or one int
    (the same count for every block; displacement ``d * i`` for block i),
    counts inferred from the buffer when not given (spread over the blocks
    as mpi4py does). Returns a message whose ``raw`` holds the blocks packed
    in rank order and ``counts`` their sizes in bytes."""
    if type(msg) in (list, tuple) and len(msg) == 2 and type(msg[0]) is np.ndarray and type(msg[1]) is list:
        m = _parse_plain_v(msg[0], msg[1], writable, blocks)
        if m is not None:
            return m
    o_buf, o_counts, o_displs, o_type = _unpack_spec(msg, True)
    raw, datatype, bottom, derived, basic, n, size, dt = _typed_buffer(o_buf, o_type, writable)
    if o_counts is None:
        csize = 0
        if raw.size > 0:
            lb, extent = _extent(datatype, "infer count")
            if raw.size % extent:
                raise ValueError(f"message: cannot infer count, buffer length {raw.size} is not a multiple of "
                                 f"datatype extent {extent} (lb:{lb}, ub:{lb + extent})")
            csize = raw.size // extent
        counts = [csize // blocks + (csize % blocks > i) for i in range(blocks)]
    elif _is_index(o_counts):
        counts = [_index(o_counts)] * blocks
    else:
        counts = _int_list(o_counts, blocks)
    packed = [0, *itertools.accumulate(counts)][:blocks]  # each block's entry in the packed layout
    if o_displs is None:
        displs = packed
    elif _is_index(o_displs):
        d = _index(o_displs)
        displs = [d * i for i in range(blocks)]
    else:
        displs = _int_list(o_displs, blocks)
    for c in counts:
        if c < 0:
            raise ValueError(f"message: negative count {c}")
        if c > 0 and o_buf is None:
            raise ValueError(f"message: buffer is None but count is {c}")
    item = n * size  # bytes of one entry, packed
    bcounts = [c * item for c in counts]
    total = sum(bcounts)
    if not derived:
        for i, (c, d) in enumerate(zip(counts, displs)):
            if c and (d < 0 or (d + c) * size > raw.size):
                raise ValueError(f"message: block {i} ({c} entries at displacement {d}) needs bytes "
                                 f"[{d * size}, {(d + c) * size}), the buffer has {raw.size}")
        if all(d == q for c, d, q in zip(counts, displs, packed) if c):
            return _new_msg(raw[:total], sum(counts), datatype, size, dt, counts=bcounts)
        scratch = np.empty(total, np.uint8)
        moves = [(scratch[q * size:(q + c) * size], raw[d * size:(d + c) * size])
                 for c, d, q in zip(counts, displs, packed) if c]

        def pack():
            for dst, src in moves:
                dst[...] = src

        def unpack():
            for dst, src in moves:
                src[...] = dst

        return _new_msg(scratch, sum(counts), datatype, size, dt, pack, unpack, bcounts)
    scratch = np.empty(total, np.uint8)
    copies = []
    for c, d, q in zip(counts, displs, packed):
        if c:
            if not bottom:
                _spec_bounds(raw.size, c, d, datatype, "block")
            copies.append(_local_copy(o_buf, c, d, datatype, basic, n, scratch[q * item:(q + c) * item]))

    def pack():
        for f, _ in copies:
            f()

    def unpack():
        for _, f in copies:
            f()

    return _new_msg(scratch, sum(counts) * n, basic, size, dt, pack, unpack, bcounts, per=n)


def _int_list(seq, n: int) -> list:
    """mpi4py's chkarray: ``n`` ints from a sequence."""
    out = [_index(seq[i]) for i in range(len(seq))]
    if len(out) != n:
        raise ValueError(f"expecting {n} items, got {len(out)}")
    return out


def _in_place_arg(sendbuf) -> bool:
    """mpi4py reads a send buffer of None as MPI.IN_PLACE."""
    return sendbuf is None or sendbuf is MPI.IN_PLACE


def _check_pair(s: _Msg, r: _Msg) -> None:
    """mpi4py's check of a reduction's two buffers (the user's datatypes and counts)."""
    if s.spec[0] != r.spec[0]:
        raise ValueError("mismatch in send and receive MPI datatypes")
    if s.spec[1] != r.spec[1]:
        raise ValueError(f"mismatch in send count {s.spec[1]} and receive count {r.spec[1]}")


def _in_place(s: _Msg, r: _Msg) -> bool:
    """mpi4py's rule: a send buffer at the receive buffer's address is in
    place. Any other overlap is an error MPI would not catch reliably."""
    if s.nbytes and r.nbytes and s.address == r.address:
        return True
    if s.nbytes and r.nbytes and _share(s.raw[:s.nbytes], r.raw[:r.nbytes]):
        raise ValueError("mpicoll: send and receive buffers partially overlap")
    return False


# ---- plain numpy arrays: the forms the drop-in's fast paths take as they are ----

# numpy kinds whose arrays mpi4py's buffer parsing takes as they are
# (booleans, integers, floats, complex): the data-movement fast paths.
PLAIN_KINDS = frozenset("biufc")


def plain(a, writable: bool) -> bool:
    """A C-contiguous numpy array (writable if asked) of a kind mpi4py's
    buffer parsing takes as it is: the data-movement fast paths' buffers."""
    if type(a) is not np.ndarray or a.dtype.kind not in PLAIN_KINDS:
        return False
    flags = a.flags
    return flags.c_contiguous and (flags.writeable or not writable)


def plain_v(spec, p: int, writable: bool, like=None):
    """(flat array, counts) of a v-form spec ``[array, counts]`` over a plain
    array (of ``like``'s dtype when given) whose ``p`` counts (list or tuple
    of non-negative ints, in elements) tile it exactly from the start, as
    mpi4py lays them out; None sends the call down the general path (also
    for a tuple there, which mpi4py reads as ``(counts, displs)``)."""
    if type(spec) is not list and type(spec) is not tuple or len(spec) != 2:
        return None
    a, counts = spec
    if type(counts) is tuple:  # mpi4py reads a tuple here as (counts, displs): parse_v's
        return None
    if not plain(a, writable) or like is not None and a.dtype != like.dtype:
        return None
    c = counts_key(counts)
    if not c or len(c) != p or min(c) < 0 or sum(c) != a.size:
        return None
    return a.reshape(-1), c


def apart(a, b) -> bool:
    return not a.nbytes or not b.nbytes or not _share(a, b)


def plain_rooted(comm, full, block, root, recv_side):
    """Scatter/Gather's fast path over plain numpy arrays: ``block`` is this
    rank's block (the receive buffer of Scatter, the send buffer of Gather),
    ``full`` root's whole buffer (ignored elsewhere, as mpi4py does). Returns
    ``full`` shaped ``(p,) + block.shape`` on root and None elsewhere, or
    False when the call needs the general parsing."""
    if type(block) is not np.ndarray or type(root) is not int or block.dtype.kind not in PLAIN_KINDS:
        return False
    fb = block.flags
    if not fb.c_contiguous or recv_side and not fb.writeable:
        return False
    p = comm.Get_size()
    if not 0 <= root < p:
        return False
    if comm.Get_rank() != root:
        return None
    if type(full) is not np.ndarray or full.dtype != block.dtype or full.size != p * block.size:
        return False
    ff = full.flags
    if not ff.c_contiguous or not recv_side and not ff.writeable or _share(full, block):
        return False
    return full.reshape((p,) + block.shape)
