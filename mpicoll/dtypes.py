"""Element types mpicoll reduces, and how each maps to numpy, the C kernels and MPI.

numpy has no bfloat16. Arrays of the optional ``ml_dtypes`` package's
``bfloat16`` are recognised directly (mpicoll does not import it: the
program that made such an array has); without it (or as
well), a uint16 array can be declared bfloat16 with ``dtype="bfloat16"``,
and the result comes back as uint16 holding bfloat16 bits.

Algorithms never see numpy's view of the element type: they move and reduce
the *storage* array (``DType.storage``, uint16 for both 16-bit float types),
and pass the ``DType`` to the kernels, which know the real type.

This module does not import mpi4py (mpicoll/mpitypes.py is the one that
maps MPI's types): ``DType.mpi`` is looked up in mpi4py on first access,
``DType.native`` answers "does MPI have this type" without it.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

import numpy as np

from ._kernels import lib


def bfloat16_numpy() -> Optional[np.dtype]:
    """ml_dtypes' bfloat16 numpy dtype (importing the optional package), or
    None where it is not installed."""
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return np.dtype(ml_dtypes.bfloat16)


@dataclass(frozen=True)
class DType:
    """One element type: its name, kernel code, storage dtype and MPI datatype."""

    name: str
    code: int  # enum mpicoll_dtype in csrc/kernels.h, read from the built library
    kind: str  # "int", "uint" or "float"
    storage: np.dtype  # what the bytes are moved and held as
    mpi_name: Optional[str]  # its predefined MPI datatype's name in mpi4py.MPI; None: MPI has none

    @property
    def native(self) -> bool:
        """MPI has a predefined datatype for it (all but float16, bfloat16)."""
        return self.mpi_name is not None

    # The predefined MPI.Datatype, None where MPI has none. cached_property
    # stores the value in the instance __dict__ (bypassing the frozen
    # __setattr__), where it then shadows the descriptor: every access after
    # the first is a plain attribute read, as fast as a field.
    @cached_property
    def mpi(self):
        if self.mpi_name is None:
            return None
        from mpi4py import MPI

        return getattr(MPI, self.mpi_name)

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


def _dt(name, kind, storage, mpi_name):
    # The code comes from the compiled enum (cffi exposes kernels.h's enums
    # as lib.MPICOLL_*), so it cannot drift from the C table it indexes.
    return DType(name, getattr(lib, "MPICOLL_" + name.upper()), kind, np.dtype(storage), mpi_name)


# In the order of enum mpicoll_dtype.
ALL = (
    _dt("int8", "int", np.int8, "INT8_T"),
    _dt("int16", "int", np.int16, "INT16_T"),
    _dt("int32", "int", np.int32, "INT32_T"),
    _dt("int64", "int", np.int64, "INT64_T"),
    _dt("uint8", "uint", np.uint8, "UINT8_T"),
    _dt("uint16", "uint", np.uint16, "UINT16_T"),
    _dt("uint32", "uint", np.uint32, "UINT32_T"),
    _dt("uint64", "uint", np.uint64, "UINT64_T"),
    _dt("float16", "float", np.uint16, None),
    _dt("bfloat16", "float", np.uint16, None),
    _dt("float32", "float", np.float32, "FLOAT"),
    _dt("float64", "float", np.float64, "DOUBLE"),
)
BY_NAME = {d.name: d for d in ALL}
FLOAT16 = BY_NAME["float16"]
BFLOAT16 = BY_NAME["bfloat16"]
FLOAT32 = BY_NAME["float32"]

# numpy dtype -> DType, for arrays that carry their type. ml_dtypes'
# bfloat16 joins when an array of it first comes by: such an array exists
# only once its program imported ml_dtypes, and importing it here would cost
# every rank of every job ~0.6 s of CPU at `import mpicoll`.
_BY_NUMPY = {np.dtype(d.name): d for d in ALL if d.name != "bfloat16"}


def _learn_bfloat16() -> bool:
    """Add ml_dtypes' bfloat16 if the program has imported ml_dtypes."""
    ml = sys.modules.get("ml_dtypes")
    if ml is None or np.dtype(ml.bfloat16) in _BY_NUMPY:
        return False
    _BY_NUMPY[np.dtype(ml.bfloat16)] = BFLOAT16
    return True


def names() -> list:
    return [d.name for d in ALL]


def of_numpy(dtype: np.dtype) -> DType:
    """The DType of a numpy dtype; TypeError if mpicoll has no kernel for it."""
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        pass
    if _learn_bfloat16() and dtype in _BY_NUMPY:
        return _BY_NUMPY[dtype]
    if dtype.kind in "iuf" and not dtype.isnative:
        raise TypeError(f"mpicoll: non-native byte order is not supported ({dtype}); "
                        "convert with .astype(dtype.newbyteorder('='))")
    raise TypeError(f"mpicoll: unsupported dtype {dtype}; supported: {', '.join(names())}")


def resolve(array_dtype: np.dtype, requested=None) -> DType:
    """The element type of an array, optionally declared by the caller.

    ``requested`` may name a type whose storage matches the array's
    ("bfloat16" over uint16) or be the array's own type; anything else is a
    TypeError, since reinterpreting other types' bytes is almost always a bug.
    """
    if requested is None:
        found = _BY_NUMPY.get(array_dtype)
        return found if found is not None else of_numpy(array_dtype)
    if isinstance(requested, str) and requested in BY_NAME:
        want = BY_NAME[requested]
    else:
        try:
            want = of_numpy(np.dtype(requested))
        except TypeError:
            raise TypeError(f"mpicoll: unsupported dtype {requested!r}; "
                            f"supported: {', '.join(names())}") from None
    have = of_numpy(array_dtype) if array_dtype != np.uint16 else None
    if have is want:
        return want
    if want.storage == array_dtype and array_dtype == np.uint16 and want.kind == "float":
        return want  # 16-bit float bits held in uint16 storage
    if array_dtype == np.uint16 and want.name == "uint16":
        return want
    raise TypeError(f"mpicoll: dtype={requested!r} does not match the buffer's element type {array_dtype}")
