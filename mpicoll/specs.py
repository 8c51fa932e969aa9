"""mpi4py's buffer specs, parsed the way mpi4py's ``message_simple`` parses
them (same accepted forms, same errors), for the drop-in ``mpicoll.Comm``:
a bare buffer, ``[buf, datatype]``, ``[buf, count]``, ``[buf, count,
datatype]``, ``[buf, (count, displ), datatype]``, ``[buf, count, displ,
datatype]``; buffers acquired by mpi4py's own ``MPI.buffer``."""
from __future__ import annotations

import operator

import numpy as np
from mpi4py import MPI

from .typemap import Native as _Native, type_info as _type_info


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
    """One parsed buffer spec: ``raw`` (uint8 view from the first used byte),
    ``count`` entries of ``datatype`` (``itemsize`` bytes each)."""

    __slots__ = ("raw", "count", "datatype", "itemsize", "dtype")

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


def _host_bytes(o_buf, writable: bool) -> np.ndarray:
    """uint8 view of a host buffer, acquired by mpi4py's own MPI.buffer."""
    if not _is_buffer(o_buf):
        if hasattr(o_buf, "__cuda_array_interface__"):
            raise _Native  # device memory: the MPI library may handle it, we cannot
        dev = getattr(o_buf, "__dlpack_device__", None)
        if dev is not None and dev()[0] != 1:  # kDLCPU
            raise _Native
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


def _buffer_format(o_buf) -> str:
    if _is_buffer(o_buf):
        with memoryview(o_buf) as mv:
            return mv.format
    arr = np.from_dlpack(o_buf)
    return memoryview(arr).format if arr.size else np.dtype(arr.dtype).char


def parse(msg, writable: bool, blocks: int = 0) -> _Msg:
    """Parse an mpi4py buffer spec the way mpi4py's ``message_simple`` does
    (same accepted forms, same errors); _Native for what only MPI can do."""
    o_buf = o_count = o_displ = o_type = None
    if _is_buffer(msg):
        o_buf = msg
    elif isinstance(msg, (list, tuple)):
        n = len(msg)
        if n == 2:
            o_buf, o_count = msg
            if _is_datatype(o_count):
                o_count, o_type = None, o_count
            elif isinstance(o_count, (list, tuple)):
                o_count, o_displ = o_count
        elif n == 3:
            o_buf, o_count, o_type = msg
            if isinstance(o_count, (list, tuple)):
                o_count, o_displ = o_count
        elif n == 4:
            o_buf, o_count, o_displ, o_type = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
    elif hasattr(msg, "__dlpack__") or hasattr(msg, "__cuda_array_interface__"):
        o_buf = msg
    else:
        raise TypeError("message: expecting buffer or list/tuple")

    if o_buf is None or o_buf is MPI.BOTTOM:
        datatype = _as_datatype(o_type)
        raw = np.empty(0, np.uint8)
        if o_buf is MPI.BOTTOM:
            raise _Native  # absolute addresses: only MPI can follow them
    else:
        raw = _host_bytes(o_buf, writable)
        datatype = _as_datatype(o_type) if o_type is not None else _format_type(o_buf, _buffer_format(o_buf))
    size, dt = _type_info(datatype)

    length = raw.size
    if o_displ is not None:
        displ = _index(o_displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        if displ > 0:
            if displ * size > length:
                raise ValueError(f"message: displacement {displ} out of bounds, "
                                 f"number of datatype entries {length // size}")
            raw = raw[displ * size:]
            length = raw.size
    if o_count is not None:
        count = _index(o_count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count > 0 and o_buf is None:
            raise ValueError(f"message: buffer is None but count is {count}")
        if count * size * max(blocks, 1) > length:
            # mpi4py hands this to MPI unchecked (a read or write past the buffer).
            raise ValueError(f"message: count {count} of {max(blocks, 1)} block(s) needs "
                             f"{count * size * max(blocks, 1)} bytes, the buffer has {length}")
    else:
        count = 0
        if length > 0:
            if length % size:
                raise ValueError(f"message: cannot infer count, buffer length {length} is not a multiple of "
                                 f"datatype extent {size} (lb:0, ub:{size})")
            entries = length // size
            if blocks < 2:
                count = entries
            else:
                if entries % blocks:
                    raise ValueError(f"message: cannot infer count, number of entries {entries} is not a "
                                     f"multiple of required number of blocks {blocks}")
                count = entries // blocks
    m = _Msg()
    m.raw, m.count, m.datatype, m.itemsize, m.dtype = raw, count, datatype, size, dt
    return m


def _in_place_arg(sendbuf) -> bool:
    """mpi4py reads a send buffer of None as MPI.IN_PLACE."""
    return sendbuf is None or sendbuf is MPI.IN_PLACE


def _check_pair(s: _Msg, r: _Msg) -> None:
    if s.datatype != r.datatype:
        raise ValueError("mismatch in send and receive MPI datatypes")
    if s.count != r.count:
        raise ValueError(f"mismatch in send count {s.count} and receive count {r.count}")


def _in_place(s: _Msg, r: _Msg) -> bool:
    """mpi4py's rule: a send buffer at the receive buffer's address is in
    place. Any other overlap is an error MPI would not catch reliably."""
    if s.nbytes and r.nbytes and s.address == r.address:
        return True
    if s.nbytes and r.nbytes and np.may_share_memory(s.raw[:s.nbytes], r.raw[:r.nbytes]):
        raise ValueError("mpicoll: send and receive buffers partially overlap")
    return False


