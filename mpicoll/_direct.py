"""A direct call of the MPI library's MPI_Allreduce, for the small-message fast path.

mpi4py parses its buffer arguments on every call (a few hundred
nanoseconds), and for an 8-byte all-reduce that is a measurable share of
the whole call. A plan whose buffers are fixed (persistent plans, the
per-call plan cache of ``mpicoll.allreduce``) can instead keep the C
function pointer, the buffer pointers and the handles, and call
``MPI_Allreduce`` through cffi with nothing left to parse.

This needs the handle values mpi4py uses to be the library's own
(``MPI._handleof``, mpi4py 4) and the library mpi4py loaded to be found in
the process (``/proc/self/maps``); where either is missing, ``allreduce``
returns None and callers use mpi4py's call. The buffer pointers come from
``ffi.from_buffer``, which holds a buffer export: while the plan lives, numpy
refuses to resize or free the arrays, so a kept pointer cannot dangle.
Set ``MPICOLL_DIRECT=0`` to turn it off.
"""
from __future__ import annotations

import os

from mpi4py import MPI

_fn = None
_tried = False
_mask = 0


def _library_path():
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                part = line.split()[-1] if line.strip() else ""
                base = os.path.basename(part)
                if base.startswith("libmpi.so") or base.startswith("libmpi_abi.so"):
                    return part
    except OSError:
        pass
    return None


def _load():
    global _fn, _tried, _mask, _ffi, _inplace
    _tried = True
    if os.environ.get("MPICOLL_DIRECT", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    handleof = getattr(MPI, "_handleof", None)
    path = _library_path()
    if handleof is None or path is None:
        return
    try:
        import cffi

        size = MPI._sizeof(MPI.Comm)
        if size == 4:  # MPICH's ABI: handles are ints
            h = "unsigned int"
        elif size == 8:  # Open MPI's, and the MPI-5 standard ABI: handles are pointers
            h = "uintptr_t"
        else:
            return
        ffi = cffi.FFI()
        ffi.cdef(f"int MPI_Allreduce(const void *, void *, int, {h}, {h}, {h});")
        lib = ffi.dlopen(path)
        _fn = lib.MPI_Allreduce
        _mask = (1 << (8 * size)) - 1
        _ffi = ffi
        _inplace = ffi.cast("void *", int(MPI.IN_PLACE) & ((1 << 64) - 1))
        _keep.append(lib)
    except Exception:  # no cffi ABI mode, symbol missing...: mpi4py's call it is
        _fn = None


_keep = []


def allreduce(comm, src, dst, count: int, datatype, op):
    """(function, args) such that ``function(*args)`` is MPI_Allreduce of
    ``src`` (None: in place) into ``dst``; None where unavailable."""
    if not _tried:
        _load()
    if _fn is None or count > 0x7FFFFFFF:
        return None
    ffi = _ffi
    try:
        sp = _inplace if src is None else ffi.from_buffer(src)
        dp = ffi.from_buffer(dst, require_writable=True)
    except (TypeError, BufferError):
        return None
    return _fn, (sp, dp, count, MPI._handleof(datatype) & _mask, MPI._handleof(op) & _mask,
                 MPI._handleof(comm) & _mask)


def check(rc: int) -> None:
    """Raise the error MPI_Allreduce returned, as mpi4py would: MPI.Exception
    of that very code (its class and string are the library's)."""
    if rc:
        raise MPI.Exception(rc)
