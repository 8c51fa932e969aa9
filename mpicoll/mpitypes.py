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
