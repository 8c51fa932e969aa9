"""MPI datatypes and ops as mpicoll's kernels see them, for the drop-in
``mpicoll.Comm``: every named predefined MPI datatype mapped to its size and
mpicoll element type (or None), and the (dtype, op) of a reduction mpicoll
can serve. ``Native`` is raised for whatever only the MPI library can do,
which sends the call to mpi4py's own method."""
from __future__ import annotations

from mpi4py import MPI
from mpi4py.util import dtlib

from . import dtypes as _dtypes
from . import ops as _ops


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


