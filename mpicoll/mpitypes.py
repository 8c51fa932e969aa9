"""mpicoll's element types and ops as MPI sees them: the one module of the
kernel layer that maps MPI's types (mpicoll.dtypes and mpicoll.ops name
their MPI equivalents but do not import mpi4py, so kernels, benchmarks and
build checks work without an MPI library).

- ``reduces_natively``: whether the MPI library's own op gives numpy's
  result, the same bits on every rank, for a (dtype, op);
- ``type_info`` / ``kernel_dtype``: every named predefined MPI datatype
  mapped to its size and mpicoll element type, and the (dtype, op) of a
  reduction mpicoll can serve, for the drop-in ``mpicoll.Comm``. ``Native``
  is raised for whatever only the MPI library can do, which sends the call
  to mpi4py's own method.
"""
from __future__ import annotations

from mpi4py import MPI
from mpi4py.util import dtlib

from . import dtypes as _dtypes
from . import ops as _ops

# Reductions this MPI library's predefined op gets wrong. mpicoll's contract
# is numpy's arithmetic (integer sums wrap around); Open MPI 5.0's op/avx
# component adds 8- and 16-bit integers with saturating vector instructions
# once a buffer fills a vector (found with the PyPI wheel, Open MPI 5.0.11
# on an AVX-512 CPU: from 8 int16 or 16 int8 elements; uint16 65535 + 65534
# gave 65535, not 65533; every other dtype and op, and MPICH, matched numpy:
# `python tools/mpi_op_check.py`; open-mpi/ompi#8045 reports it for int16). Decided by library, not by a probe of this CPU: every rank
# of a job runs the same library, and all ranks must pass the same MPI_Op.
_SATURATING_SUMS = frozenset(("int8", "uint8", "int16", "uint16"))
_vendor = None


def _is_open_mpi() -> bool:
    global _vendor
    if _vendor is None:
        _vendor = MPI.get_vendor()[0]
    return _vendor == "Open MPI"


# Float min/max: MPI leaves NaN to the implementation, and MPICH's and Open
# MPI's MPI_MIN/MPI_MAX are "a < b ? a : b", which keeps or drops a NaN
# depending on the operand order: allreduce of [nan, 5.0] over two ranks
# gave nan on one rank and 5.0 on the other (MPICH 5.0 wheel). mpicoll's
# promise is numpy's rule (NaN propagates) with the same bits on every
# rank, which its kernel keeps whatever the order (csrc/reduce.c).
_UNORDERED_OPS = frozenset(("min", "max"))


def reduces_natively(dtype, op) -> bool:
    """Whether the MPI library's predefined op reduces ``dtype`` (a
    ``mpicoll.dtypes.DType``) with ``op`` (a ``mpicoll.ops.Op``) to numpy's
    result, with the same bits on every rank. Where it does not, the "mpi"
    algorithm reduces with mpicoll's C kernel as a user-defined MPI_Op, and
    "auto" treats the pair as it treats float16 (mpicoll's own algorithms)."""
    if not dtype.native:
        return False
    if dtype.is_float and op.name in _UNORDERED_OPS:
        return False
    return not (op.name in ("sum", "avg") and dtype.name in _SATURATING_SUMS and _is_open_mpi())


# ---- every predefined MPI datatype, for the drop-in mpicoll.Comm ----------

class Native(Exception):
    """Raised inside the parsing to send the call to mpi4py's own method."""


# ---- datatypes ----------------------------------------------------------------

def _predefined_types():
    """Every named, predefined MPI datatype: py2f handle -> (datatype, mpicoll DType or None)."""
    table = {}
    for name in dir(MPI):
        v = getattr(MPI, name)
        if not isinstance(v, MPI.Datatype) or v == MPI.DATATYPE_NULL:
            continue
        try:
            if not v.is_predefined or v.combiner != MPI.COMBINER_NAMED or v.size <= 0:
                continue
            if v.lb != 0 or v.extent != v.size:  # padded pair types (DOUBLE_INT): MPI moves those
                continue
        except MPI.Exception:  # a type this MPI library does not provide
            continue
        dt = None
        try:
            dt = _dtypes.of_numpy(dtlib.to_numpy_dtype(v))
        except Exception:  # no numpy equivalent (PACKED, ...) or no mpicoll kernel
            pass
        if dt is not None and dt.itemsize != v.size:
            dt = None
        if v == MPI.PACKED or v == MPI.LOGICAL:  # bytes, not numbers / Fortran truth values: MPI's rules
            dt = None
        table[v.py2f()] = (v, dt)
    return table


_TYPES = None


def type_info(datatype: MPI.Datatype):
    """(size in bytes, mpicoll DType or None); _Native for derived types."""
    global _TYPES
    if _TYPES is None:
        _TYPES = _predefined_types()
    found = _TYPES.get(datatype.py2f())
    if found is None:
        raise Native("a datatype mpicoll has no size for")  # derived, or padded/unknown: MPI handles it
    return found[0].size, found[1]


def kernel_dtype(datatype: MPI.Datatype, op) -> tuple:
    """(DType, mpicoll Op) for a reduction, or _Native."""
    if not isinstance(op, MPI.Op):
        raise Native("op is not an MPI.Op")  # mpi4py raises its TypeError
    _, dt = type_info(datatype)
    if datatype == MPI.BYTE:
        # MPI defines BYTE for the bitwise ops only; anything else is MPI's error to give.
        if op not in (MPI.BAND, MPI.BOR, MPI.BXOR):
            raise Native("MPI.BYTE with an arithmetic op")
        dt = _dtypes.BY_NAME["uint8"]
    if dt is None:
        raise Native(f"no reduction kernel for {datatype.Get_name()}")
    try:
        o = _ops.resolve(op)
        o.check_dtype(dt)
    except (TypeError, ValueError):
        raise Native(f"no kernel for this op on {dt.name} (user-defined, MAXLOC, ...)") from None
    return dt, o


