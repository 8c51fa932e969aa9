"""Element types mpicoll reduces, and how each maps to numpy, the C kernels and MPI.

numpy has no bfloat16. When the optional ``ml_dtypes`` package is installed,
arrays of ``ml_dtypes.bfloat16`` are recognised directly; without it (or as
well), a uint16 array can be declared bfloat16 with ``dtype="bfloat16"``,
and the result comes back as uint16 holding bfloat16 bits.

Algorithms never see numpy's view of the element type: they move and reduce
the *storage* array (``DType.storage``, uint16 for both 16-bit float types),
and pass the ``DType`` to the kernels, which know the real type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
from mpi4py import MPI

try:  # optional: a real bfloat16 numpy dtype
    import ml_dtypes as _ml_dtypes

    BFLOAT16_NUMPY: Optional[np.dtype] = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - depends on the environment
    BFLOAT16_NUMPY = None


@dataclass(frozen=True)
class DType:
    """One element type: its name, kernel code, storage dtype and MPI datatype."""

    name: str
    code: int  # enum mpicoll_dtype in csrc/kernels.h
    kind: str  # "int", "uint" or "float"
    storage: np.dtype  # what the bytes are moved and held as
    mpi: Optional[MPI.Datatype]  # predefined MPI type, None if MPI has none

    @property
    def itemsize(self) -> int:
        return self.storage.itemsize

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


def _dt(name, code, kind, storage, mpi):
    return DType(name, code, kind, np.dtype(storage), mpi)


# Order and codes follow enum mpicoll_dtype.
ALL = (
    _dt("int8", 0, "int", np.int8, MPI.INT8_T),
    _dt("int16", 1, "int", np.int16, MPI.INT16_T),
    _dt("int32", 2, "int", np.int32, MPI.INT32_T),
    _dt("int64", 3, "int", np.int64, MPI.INT64_T),
    _dt("uint8", 4, "uint", np.uint8, MPI.UINT8_T),
    _dt("uint16", 5, "uint", np.uint16, MPI.UINT16_T),
    _dt("uint32", 6, "uint", np.uint32, MPI.UINT32_T),
    _dt("uint64", 7, "uint", np.uint64, MPI.UINT64_T),
    _dt("float16", 8, "float", np.uint16, None),
    _dt("bfloat16", 9, "float", np.uint16, None),
    _dt("float32", 10, "float", np.float32, MPI.FLOAT),
    _dt("float64", 11, "float", np.float64, MPI.DOUBLE),
)
BY_NAME = {d.name: d for d in ALL}
FLOAT16 = BY_NAME["float16"]
BFLOAT16 = BY_NAME["bfloat16"]
FLOAT32 = BY_NAME["float32"]

# numpy dtype -> DType, for arrays that carry their type.
_BY_NUMPY = {np.dtype(d.name): d for d in ALL if d.name != "bfloat16"}
if BFLOAT16_NUMPY is not None:
    _BY_NUMPY[BFLOAT16_NUMPY] = BFLOAT16


def names() -> list:
    return [d.name for d in ALL]


def of_numpy(dtype: np.dtype) -> DType:
    """The DType of a numpy dtype; TypeError if mpicoll has no kernel for it."""
    try:
        return _BY_NUMPY[dtype]
    except KeyError:
        pass
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
