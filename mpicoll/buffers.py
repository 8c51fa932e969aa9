"""Turning what the caller passed into arrays the algorithms can use.

Everything here runs before the first message is sent, so a bad argument
raises on the rank that passed it without leaving the other ranks waiting
inside a collective. (Ranks that disagree with each other - different
counts, say - are a different problem: see the algorithms' size checks.)
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dtypes


def as_array(x, what: str = "x") -> np.ndarray:
    """A C-contiguous ndarray over ``x``'s memory (copied if it was not contiguous).

    Accepts numpy arrays and scalars, anything with the buffer protocol
    (bytearray, array.array, memoryview, ...) and DLPack producers.
    """
    if isinstance(x, np.ndarray):
        arr = x
    elif isinstance(x, np.generic):
        arr = np.asarray(x)
    else:
        try:
            arr = np.asarray(memoryview(x))
        except TypeError:
            if hasattr(x, "__dlpack__"):
                arr = np.from_dlpack(x)
            else:
                raise TypeError(f"mpicoll: {what} must be a numpy array or support the buffer protocol, "
                                f"not {type(x).__name__}") from None
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return arr


def as_reducible(x, dtype=None, what: str = "x"):
    """(array, DType) for an input that will be reduced."""
    if type(x) is np.ndarray and x.flags.c_contiguous:  # the common case, without the checks' cost
        arr = x
    else:
        arr = as_array(x, what)
    return arr, _dtypes.resolve(arr.dtype, dtype)


def storage(arr: np.ndarray, dt: _dtypes.DType) -> np.ndarray:
    """The flat storage view the algorithms move and the kernels reduce."""
    flat = arr if arr.ndim == 1 else arr.reshape(-1)
    return flat if flat.dtype is dt.storage or flat.dtype == dt.storage else flat.view(dt.storage)


def as_bytes(arr: np.ndarray) -> np.ndarray:
    """A flat uint8 view: for collectives that only move data (allgather, bcast)."""
    return arr.reshape(-1).view(np.uint8) if arr.size else np.empty(0, np.uint8)


def output(out, shape, dtype: np.dtype, what: str = "out") -> np.ndarray:
    """A writable, C-contiguous ndarray of ``shape`` and ``dtype`` to write a result into."""
    if out is None:
        return np.empty(shape, dtype)
    if not isinstance(out, np.ndarray):
        try:
            out = np.asarray(memoryview(out))
        except TypeError:
            raise TypeError(f"mpicoll: {what} must be a numpy array or a writable buffer, "
                            f"not {type(out).__name__}") from None
    if out.dtype != dtype:
        raise TypeError(f"mpicoll: {what} has dtype {out.dtype}, expected {dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"mpicoll: {what} has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.flags.c_contiguous:
        raise ValueError(f"mpicoll: {what} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"mpicoll: {what} is read-only")
    return out


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True if ``a`` and ``b`` are the same buffer (in-place use); ValueError
    if they overlap only partly, which no collective can honour."""
    if a is b:
        return True
    if a.nbytes == 0 or b.nbytes == 0 or not np.may_share_memory(a, b):
        return False
    # Both are contiguous, so overlapping bounds mean overlapping memory.
    if a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.nbytes == b.nbytes:
        return True
    raise ValueError("mpicoll: out partially overlaps the input")
