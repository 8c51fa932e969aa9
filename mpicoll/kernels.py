"""Typed wrappers over the C kernels (``mpicoll._kernels``, built by cffi).

Two layers:

* ``Reduction``: an (op, dtype) pair bound to its kernel. Algorithms call
  ``red.combine(dst, a, b)`` on storage arrays they sliced themselves; it
  checks what the C code relies on - equal byte lengths, the element size
  of every array, alignment (in C, one OR of the addresses) - and nothing
  else, because it runs once per ring segment.
* ``reduce``, ``reduce_many``, ``scale`` and the cast functions: the public,
  fully checked entry points (tests, the benchmark, compression).

Every entry hands the C side buffers from ``ffi.from_buffer`` (cheapest
route from a numpy array to a pointer, about 0.3 us; it refuses
non-contiguous arrays) and an element count that was checked against each
buffer's byte length. A view that starts at an arbitrary byte offset
(``bytes_array[1:].view(np.float32)``) is refused, not read misaligned.

Nothing here imports mpi4py.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dtypes
from . import ops as _ops
from ._kernels import ffi, lib

_STATUS = {
    lib.MPICOLL_EDTYPE: "bad dtype code",
    lib.MPICOLL_EOP: "bad op code",
    lib.MPICOLL_EOPDTYPE: "op not defined for this dtype",
    lib.MPICOLL_EARG: "bad argument",
    lib.MPICOLL_EALIGN: "a buffer is not aligned to its element size",
}


def _check(rc: int, arrays=(), itemsize=0) -> None:
    if rc == lib.MPICOLL_OK:
        return
    if rc == lib.MPICOLL_EALIGN and arrays:
        where = ", ".join(hex(x.ctypes.data) for x in arrays)
        raise ValueError(f"mpicoll kernel: buffers at {where}: not all aligned to the {itemsize}-byte element "
                         "size (a view built at a byte offset?); copy it or slice it on element boundaries")
    raise ValueError(f"mpicoll kernel: {_STATUS.get(rc, rc)}")


def _reject(what: str, itemsize: int, dst, srcs) -> None:
    """The error for arrays that failed combine's quick checks."""
    for name, x in (("dst", dst),) + tuple((f"source {i}", s) for i, s in enumerate(srcs)):
        if x.itemsize != itemsize:
            raise TypeError(f"mpicoll: {what}: {name} has {x.itemsize}-byte elements ({x.dtype}), "
                            f"the reduction's are {itemsize} bytes")
    raise ValueError(f"mpicoll: {what} of unequal byte lengths: dst {dst.nbytes}, "
                     f"sources {[s.nbytes for s in srcs]}")


def isa() -> str:
    """The instruction set chosen at run time for 16-bit conversions."""
    return ffi.string(lib.mpicoll_isa()).decode()


class Reduction:
    """An op applied to one element type: what algorithms combine with.

    ``combine(dst, a, b)`` computes ``dst = a OP b`` element-wise on
    contiguous storage arrays of equal byte length whose elements are the
    dtype's size, aligned to it; ``dst`` may be ``a`` or ``b``. By the
    algorithms' convention ``a`` holds the contribution of the lower ranks,
    so ``combine`` applies ops in rank order (which only matters for the
    bits of NaN payloads and signed zeros under min/max).
    """

    __slots__ = ("op", "dtype", "_opcode", "_dtcode", "_itemsize")

    def __init__(self, op: _ops.Op, dtype: _dtypes.DType):
        op.check_dtype(dtype)
        self.op = op
        self.dtype = dtype
        self._opcode = op.code
        self._dtcode = dtype.code
        self._itemsize = dtype.itemsize

    def combine(self, dst: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        # Equal itemsizes and equal byte lengths make the element count
        # exact for all three; the C side checks alignment (it has the
        # addresses for free) and ffi.from_buffer refuses non-contiguous
        # arrays. Attribute reads only: this runs once per ring segment.
        nbytes = dst.nbytes
        size = self._itemsize
        if a.nbytes != nbytes or b.nbytes != nbytes or dst.itemsize != size or a.itemsize != size \
                or b.itemsize != size:
            _reject("combine", size, dst, (a, b))
        if nbytes:
            rc = lib.mpicoll_reduce(self._opcode, self._dtcode, ffi.from_buffer(dst, require_writable=True),
                                    ffi.from_buffer(a), ffi.from_buffer(b), nbytes // size)
            if rc:
                _check(rc, (dst, a, b), size)

    def combine_many(self, dst: np.ndarray, srcs) -> None:
        """``dst = ((srcs[0] OP srcs[1]) OP srcs[2]) ...`` in one pass (the
        k-input C kernel); ``dst`` may be ``srcs[0]`` and no other source.
        Hot path (shared-memory algorithms): byte lengths, itemsizes and
        alignment are checked, aliasing is the caller's promise."""
        nbytes = dst.nbytes
        size = self._itemsize
        if dst.itemsize != size or any(s.nbytes != nbytes or s.itemsize != size for s in srcs):
            _reject("combine_many", size, dst, tuple(srcs))
        if nbytes:
            ptrs = ffi.new("const void *[]", [ffi.from_buffer(s) for s in srcs])
            rc = lib.mpicoll_reduce_many(self._opcode, self._dtcode, ffi.from_buffer(dst, require_writable=True),
                                         ptrs, len(srcs), nbytes // size)
            if rc:
                _check(rc, (dst, *srcs), size)

    def finish(self, buf: np.ndarray, size: int) -> None:
        """Post-processing after the reduction: avg divides by ``size``."""
        if self.op.average and buf.nbytes:
            if buf.itemsize != self._itemsize:
                _reject("finish", self._itemsize, buf, ())
            _check(lib.mpicoll_scale(self._dtcode, ffi.from_buffer(buf, require_writable=True),
                                     buf.nbytes // self._itemsize, float(size)), (buf,), self._itemsize)

    def __repr__(self):
        return f"Reduction({self.op.name}, {self.dtype.name})"


# ---- checked public entry points ---------------------------------------------

def _storage_1d(arr, dtype: _dtypes.DType, what: str, writable=False) -> np.ndarray:
    arr = np.asarray(arr)
    if arr.dtype.itemsize != dtype.itemsize:
        raise TypeError(f"mpicoll: {what} has itemsize {arr.dtype.itemsize}, expected {dtype.itemsize} ({dtype.name})")
    if not arr.flags.c_contiguous:
        raise ValueError(f"mpicoll: {what} must be C-contiguous")
    if writable and not arr.flags.writeable:
        raise ValueError(f"mpicoll: {what} is read-only")
    return arr.reshape(-1).view(dtype.storage)


def _kernel_args(op, dst, srcs, dtype):
    o = _ops.resolve(op)
    d = _dtypes.resolve(np.asarray(dst).dtype, dtype)
    o.check_dtype(d)
    dflat = _storage_1d(dst, d, "dst", writable=True)
    sflat = [_storage_1d(s, d, f"source {i}") for i, s in enumerate(srcs)]
    for i, s in enumerate(sflat):
        if s.size != dflat.size:
            raise ValueError(f"mpicoll: source {i} has {s.size} elements, dst has {dflat.size}")
        if s is not dflat and np.shares_memory(s, dflat) and s.ctypes.data != dflat.ctypes.data:
            raise ValueError(f"mpicoll: source {i} partially overlaps dst")
    return o, d, dflat, sflat


def reduce(op, dst, a, b, *, dtype=None) -> None:
    """``dst[:] = a OP b`` element-wise (``dst`` may be ``a`` or ``b``)."""
    o, d, dflat, (af, bf) = _kernel_args(op, dst, (a, b), dtype)
    if o.average:
        raise ValueError("mpicoll: 'avg' is a collective op (sum, then divide by the size); use 'sum' here")
    Reduction(o, d).combine(dflat, af, bf)


def reduce_many(op, dst, srcs, *, dtype=None) -> None:
    """``dst[:] = ((srcs[0] OP srcs[1]) OP srcs[2]) ...`` in one pass over memory.

    ``dst`` may be ``srcs[0]`` and no other source.
    """
    srcs = list(srcs)
    if not srcs:
        raise ValueError("mpicoll: reduce_many needs at least one source")
    o, d, dflat, sflat = _kernel_args(op, dst, srcs, dtype)
    for s in sflat[1:]:
        if np.shares_memory(s, dflat):
            raise ValueError("mpicoll: only srcs[0] may alias dst in reduce_many")
    if o.average:
        raise ValueError("mpicoll: 'avg' is a collective op; use 'sum' here")
    Reduction(o, d).combine_many(dflat, sflat)


def scale(buf, divisor: float, *, dtype=None) -> None:
    """``buf[:] = buf / divisor`` for floating dtypes."""
    d = _dtypes.resolve(np.asarray(buf).dtype, dtype)
    if not d.is_float:
        raise TypeError(f"mpicoll: scale is defined for floating dtypes only, not {d.name}")
    flat = _storage_1d(buf, d, "buf", writable=True)
    if flat.size:
        _check(lib.mpicoll_scale(d.code, ffi.from_buffer(flat, require_writable=True), flat.size, float(divisor)),
               (flat,), d.itemsize)


_CTYPE = {2: "uint16_t[]", 4: "float[]"}


def _cast(fn, src, src_itemsize, dst_dtype, out):
    src = np.ascontiguousarray(src)
    if src.dtype.itemsize != src_itemsize:
        raise TypeError(f"mpicoll: cast source must have {src_itemsize}-byte elements, got {src.dtype}")
    if out is None:
        out = np.empty(src.shape, dst_dtype)
    elif out.shape != src.shape or out.dtype.itemsize != np.dtype(dst_dtype).itemsize \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("mpicoll: cast out must be a writable C-contiguous array of the source's shape")
    for what, x in (("source", src), ("out", out)):
        if x.ctypes.data % x.dtype.itemsize:  # the C loops use typed pointers
            raise ValueError(f"mpicoll: cast {what} at {hex(x.ctypes.data)} is not aligned to its "
                             f"{x.dtype.itemsize}-byte elements (a view built at a byte offset?)")
    if src.size:  # byte views: custom dtypes (ml_dtypes) may not export a buffer format
        fn(ffi.from_buffer(_CTYPE[out.dtype.itemsize], out.reshape(-1).view(np.uint8), require_writable=True),
           ffi.from_buffer(_CTYPE[src.dtype.itemsize], src.reshape(-1).view(np.uint8)), src.size)
    return out


def f32_to_f16(src, out=None) -> np.ndarray:
    """float32 -> IEEE float16, round to nearest even; returns numpy float16."""
    res = _cast(lib.mpicoll_f32_to_f16, np.asarray(src, np.float32), 4, np.uint16, out)
    return res.view(np.float16) if out is None else out


def f16_to_f32(src, out=None) -> np.ndarray:
    """IEEE float16 (numpy float16 or uint16 bits) -> float32, exact."""
    return _cast(lib.mpicoll_f16_to_f32, src, 2, np.float32, out)


def f32_to_bf16(src, out=None) -> np.ndarray:
    """float32 -> bfloat16, round to nearest even; uint16 bits unless ``out`` is given."""
    return _cast(lib.mpicoll_f32_to_bf16, np.asarray(src, np.float32), 4, np.uint16, out)


def bf16_to_f32(src, out=None) -> np.ndarray:
    """bfloat16 (ml_dtypes.bfloat16 or uint16 bits) -> float32, exact."""
    return _cast(lib.mpicoll_bf16_to_f32, src, 2, np.float32, out)
