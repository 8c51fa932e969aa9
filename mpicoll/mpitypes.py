"""The MPI names of mpicoll's element types and ops: the one module of the
kernel layer that imports mpi4py.

``mpicoll.kernels``, ``mpicoll.dtypes`` and ``mpicoll.ops`` work without
MPI (a kernel benchmark, a build check, a test on a machine with no MPI
library). ``DType.mpi`` and ``Op.mpi`` are resolved from the tables here
on first access, so the import of mpi4py happens then, once, and never
on behalf of a caller that only reduces arrays.
"""
from __future__ import annotations

from mpi4py import MPI

# DType.name -> predefined MPI datatype, for the types where MPI has one
# (DType.native); float16 and bfloat16 have none.
DATATYPES = {
    "int8": MPI.INT8_T, "int16": MPI.INT16_T, "int32": MPI.INT32_T, "int64": MPI.INT64_T,
    "uint8": MPI.UINT8_T, "uint16": MPI.UINT16_T, "uint32": MPI.UINT32_T, "uint64": MPI.UINT64_T,
    "float32": MPI.FLOAT, "float64": MPI.DOUBLE,
}

# Op.name -> the MPI op the native path uses; avg is a sum, then a division.
OPS = {
    "sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "avg": MPI.SUM,
    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
    "land": MPI.LAND, "lor": MPI.LOR, "lxor": MPI.LXOR,
}

# MPI.Op objects are not hashable; their Fortran handles are. avg is left
# out: MPI.SUM means sum.
OP_NAMES_BY_HANDLE = {op.py2f(): name for name, op in OPS.items() if name != "avg"}


def op_name(op: MPI.Op):
    """The mpicoll op name of a predefined MPI.Op, None if it has no kernel."""
    if op == MPI.OP_NULL:
        return None
    return OP_NAMES_BY_HANDLE.get(op.py2f())


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
