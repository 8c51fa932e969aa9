"""Turning what the caller passed into arrays the algorithms can use.

Everything here runs before the first message is sent, so a bad argument
raises on the rank that passed it without leaving the other ranks waiting
inside a collective. (Ranks that disagree with each other - different
counts, say - are a different problem: see the algorithms' size checks.)
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dtypes

try:
    # numpy's C function itself: np.may_share_memory is a Python dispatcher
    # in front of it (__array_function__), which cost half of its ~0.33 us
    # on every short call that checks an overlap.
    from numpy._core._multiarray_umath import may_share_memory
except ImportError:  # pragma: no cover - another numpy layout
    may_share_memory = np.may_share_memory


class Copy:
    """``dst[...] = src``: a plan's step that copies an input into a work
    buffer or a result out of it. A callable like any step, and a fact the
    C front of a persistent request reads (csrc/native.c, PersistFront):
    where both arrays are contiguous, of one dtype and size, it copies them
    itself instead of calling back into Python for ~0.5 us of numpy."""

    __slots__ = ("dst", "src")

    def __init__(self, dst, src):
        self.dst = dst
        self.src = src

    def __call__(self) -> None:
        self.dst[...] = self.src


def view(x, what: str = "x") -> np.ndarray:
    """An ndarray over ``x``'s own memory (never a copy; possibly strided).

    Accepts numpy arrays and scalars, anything with the buffer protocol
    (bytearray, array.array, memoryview, ...) and DLPack producers.
    """
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, np.generic):
        return np.asarray(x)
    try:
        return np.asarray(memoryview(x))
    except TypeError:
        if hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        raise TypeError(f"mpicoll: {what} must be a numpy array or support the buffer protocol, "
                        f"not {type(x).__name__}") from None


def as_array(x, what: str = "x") -> np.ndarray:
    """A C-contiguous ndarray with ``x``'s contents: ``x``'s memory itself, or
    a copy taken now if it was not contiguous. Only for a call that reads
    ``x`` once, now; a plan that runs again later uses ``as_input``."""
    arr = view(x, what)
    return arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)


def _restage(dst: np.ndarray, src: np.ndarray):
    def stage():
        np.copyto(dst, src, casting="no")
    return stage


def as_input(x, what: str = "x", aligned: bool = False):
    """(array, stage) for an input a plan reads every time it runs.

    ``array`` is C-contiguous (and, with ``aligned``, aligned to its
    itemsize, as the C kernels require). When ``x``'s memory already is,
    ``array`` is that memory and ``stage`` is None. Otherwise ``array`` is a
    private copy and ``stage()`` refreshes it from ``x``: a plan must call it
    at every run, or a kept plan (the small-message cache, a persistent
    request) would reduce the values ``x`` held when the plan was built - a
    strided column ``A[:, 0]`` that a solver updates between calls, say.
    Being a local copy, it changes nothing the other ranks see.
    """
    arr = view(x, what)
    if arr.flags.c_contiguous and (arr.flags.aligned or not aligned):
        return arr, None
    copy = np.empty(arr.shape, arr.dtype)
    stage = _restage(copy, arr)
    stage()
    return copy, stage


def as_reducible(x, dtype=None, what: str = "x"):
    """(array, DType, stage) for an input that will be reduced (see as_input)."""
    if type(x) is np.ndarray and x.flags.c_contiguous and x.flags.aligned:  # the common case, cheaply
        arr, stage = x, None
    else:
        arr, stage = as_input(x, what, aligned=True)
    return arr, _dtypes.resolve(arr.dtype, dtype), stage


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


def aligned_output(result: np.ndarray):
    """(work, unstage) for a result the C kernels will reduce into.

    The kernels need elements aligned to their itemsize. A valid output
    buffer may not be (a view at an odd byte offset into a bytearray, say):
    then ``work`` is an aligned private array and ``unstage()`` copies it
    into ``result`` once the collective is done; otherwise ``work`` is
    ``result`` and ``unstage`` None. Found here, before any message is sent,
    and purely local, so the other ranks never notice."""
    if result.flags.aligned:
        return result, None
    work = np.empty(result.shape, result.dtype)
    return work, _restage(result, work)


def same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """True if ``a`` and ``b`` are the same buffer (in-place use); ValueError
    if they overlap only partly, which no collective can honour."""
    if a is b:
        return True
    if a.nbytes == 0 or b.nbytes == 0 or not may_share_memory(a, b):
        return False
    # Both are contiguous, so overlapping bounds mean overlapping memory.
    if a.__array_interface__["data"][0] == b.__array_interface__["data"][0] and a.nbytes == b.nbytes:
        return True
    raise ValueError("mpicoll: out partially overlaps the input")
