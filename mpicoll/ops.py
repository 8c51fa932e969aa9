"""Reduction operators: names, MPI.Op equivalents, and which dtypes each serves.

An op is accepted as a name ("sum", "max", ...) or as one of mpi4py's
predefined ``MPI.Op`` values. ``avg`` is not an MPI op: it is a sum followed
by a division by the communicator size, defined for floating types only.
All ops here are commutative and associative in exact arithmetic; floating
sums and products are not associative in floating point, which is why the
algorithms fix the order in which they combine (see each algorithm's
docstring) and why every rank ends with the same bits.

This module does not import mpi4py at import time: ``Op.mpi`` is looked up
on first access, and ``resolve`` only looks for an MPI.Op when mpi4py is
already loaded (an MPI.Op cannot exist otherwise).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Optional

from ._kernels import lib
from .dtypes import DType


@dataclass(frozen=True)
class Op:
    name: str
    code: int  # enum mpicoll_op in csrc/kernels.h, read from the built library (avg uses sum's)
    kinds: frozenset  # dtype kinds it is defined for
    mpi_name: str  # the predefined MPI op the native path uses, its name in mpi4py.MPI
    average: bool = False  # divide by the communicator size afterwards (avg: MPI.SUM, then scale)

    # The MPI.Op. Cached in the instance __dict__ on first access, as DType.mpi.
    @cached_property
    def mpi(self):
        from mpi4py import MPI

        return getattr(MPI, self.mpi_name)

    def check_dtype(self, dtype: DType) -> None:
        if dtype.kind not in self.kinds:
            what = "floating" if self.kinds == {"float"} else "integer"
            raise TypeError(f"mpicoll: op {self.name!r} is defined for {what} dtypes only, not {dtype.name}")


_ALL_KINDS = frozenset({"int", "uint", "float"})
_INT_KINDS = frozenset({"int", "uint"})
_FLOAT_KINDS = frozenset({"float"})

ALL = (
    Op("sum", lib.MPICOLL_SUM, _ALL_KINDS, "SUM"),
    Op("prod", lib.MPICOLL_PROD, _ALL_KINDS, "PROD"),
    Op("min", lib.MPICOLL_MIN, _ALL_KINDS, "MIN"),
    Op("max", lib.MPICOLL_MAX, _ALL_KINDS, "MAX"),
    Op("avg", lib.MPICOLL_SUM, _FLOAT_KINDS, "SUM", average=True),
    Op("band", lib.MPICOLL_BAND, _INT_KINDS, "BAND"),
    Op("bor", lib.MPICOLL_BOR, _INT_KINDS, "BOR"),
    Op("bxor", lib.MPICOLL_BXOR, _INT_KINDS, "BXOR"),
    Op("land", lib.MPICOLL_LAND, _INT_KINDS, "LAND"),
    Op("lor", lib.MPICOLL_LOR, _INT_KINDS, "LOR"),
    Op("lxor", lib.MPICOLL_LXOR, _INT_KINDS, "LXOR"),
)
BY_NAME = {o.name: o for o in ALL}
# MPI.Op handle (py2f; MPI.Op objects are not hashable) -> Op, built on the
# first MPI.Op resolved (it needs mpi4py). avg is left out: MPI.SUM means sum.
_by_handle = None


def of_mpi(op) -> Optional[Op]:
    """The Op of a predefined MPI.Op, None if mpicoll has no kernel for it
    (MPI.OP_NULL, MAXLOC, a user-defined op: handles not in the table)."""
    return (_by_handle or _handles()).get(op.py2f())


def _handles() -> dict:
    global _by_handle
    _by_handle = {o.mpi.py2f(): o for o in ALL if not o.average}
    return _by_handle


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
    mpi = sys.modules.get("mpi4py.MPI")  # loaded by whoever made an MPI.Op
    if mpi is not None and isinstance(op, mpi.Op):
        found = of_mpi(op)
        if found is None:
            raise ValueError(f"mpicoll: MPI op {op!r} has no mpicoll kernel "
                             "(user-defined ops, MAXLOC/MINLOC, REPLACE, NO_OP are not supported)")
        return found
    raise TypeError(f"mpicoll: op must be a name or an MPI.Op, not {type(op).__name__}")
