"""Reduction operators: names, MPI.Op equivalents, and which dtypes each serves.

An op is accepted as a name ("sum", "max", ...) or as one of mpi4py's
predefined ``MPI.Op`` values. ``avg`` is not an MPI op: it is a sum followed
by a division by the communicator size, defined for floating types only.
All ops here are commutative and associative in exact arithmetic; floating
sums and products are not associative in floating point, which is why the
algorithms fix the order in which they combine (see each algorithm's
docstring) and why every rank ends with the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mpi4py import MPI

from .dtypes import DType


@dataclass(frozen=True)
class Op:
    name: str
    code: int  # enum mpicoll_op in csrc/kernels.h (avg uses sum's)
    mpi: MPI.Op  # the MPI op the native path uses (avg: MPI.SUM, then scale)
    kinds: frozenset  # dtype kinds it is defined for
    average: bool = False  # divide by the communicator size afterwards

    def check_dtype(self, dtype: DType) -> None:
        if dtype.kind not in self.kinds:
            what = "floating" if self.kinds == {"float"} else "integer"
            raise TypeError(f"mpicoll: op {self.name!r} is defined for {what} dtypes only, not {dtype.name}")


_ALL_KINDS = frozenset({"int", "uint", "float"})
_INT_KINDS = frozenset({"int", "uint"})
_FLOAT_KINDS = frozenset({"float"})

ALL = (
    Op("sum", 0, MPI.SUM, _ALL_KINDS),
    Op("prod", 1, MPI.PROD, _ALL_KINDS),
    Op("min", 2, MPI.MIN, _ALL_KINDS),
    Op("max", 3, MPI.MAX, _ALL_KINDS),
    Op("avg", 0, MPI.SUM, _FLOAT_KINDS, average=True),
    Op("band", 4, MPI.BAND, _INT_KINDS),
    Op("bor", 5, MPI.BOR, _INT_KINDS),
    Op("bxor", 6, MPI.BXOR, _INT_KINDS),
    Op("land", 7, MPI.LAND, _INT_KINDS),
    Op("lor", 8, MPI.LOR, _INT_KINDS),
    Op("lxor", 9, MPI.LXOR, _INT_KINDS),
)
BY_NAME = {o.name: o for o in ALL}
# MPI.Op objects are not hashable; their Fortran handles are.
_BY_MPI = {o.mpi.py2f(): o for o in ALL if not o.average}


def names() -> list:
    return [o.name for o in ALL]


def resolve(op) -> Op:
    """The Op for a name or a predefined MPI.Op; ValueError/TypeError otherwise."""
    if isinstance(op, Op):
        return op
    if isinstance(op, str):
        found: Optional[Op] = BY_NAME.get(op.lower())
        if found is None:
            raise ValueError(f"mpicoll: unknown op {op!r}; known: {', '.join(names())}")
        return found
    if isinstance(op, MPI.Op):
        found = _BY_MPI.get(op.py2f()) if op != MPI.OP_NULL else None
        if found is None:
            raise ValueError(f"mpicoll: MPI op {op!r} has no mpicoll kernel "
                             "(user-defined ops, MAXLOC/MINLOC, REPLACE, NO_OP are not supported)")
        return found
    raise TypeError(f"mpicoll: op must be a name or an MPI.Op, not {type(op).__name__}")
