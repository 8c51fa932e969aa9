"""Does this MPI library's predefined reduction give numpy's result?

    python tools/mpi_op_check.py            # no mpiexec needed: MPI_Reduce_local on this process

For every integer dtype of mpicoll and every predefined op that applies to
it, reduces random full-range operands with ``MPI_Reduce_local`` at several
lengths (MPI libraries switch to vector code from some length on) and
compares with numpy, whose arithmetic is mpicoll's contract (integer sums
and products wrap around). Prints one line per dtype with the (op, first
failing length) pairs, and mpicoll's decision for each pair
(``mpitypes.reduces_natively``: where it says False, mpicoll reduces with
its own kernel). Exit status 1 if the library got a pair wrong that mpicoll
would still hand to it.

Found with it: Open MPI 5.0.11 (PyPI wheel) on an AVX-512 CPU saturates
MPI_SUM of int16/uint16 from 8 and int8/uint8 from 16 elements on (the
first lengths that fill a vector register); MPICH 5.0.2 matches
numpy everywhere.
"""
import sys

import numpy as np
from mpi4py import MPI

from mpicoll import dtypes, ops
from mpicoll.mpitypes import reduces_natively

OPS = {"sum": (MPI.SUM, np.add), "prod": (MPI.PROD, np.multiply), "min": (MPI.MIN, np.minimum),
       "max": (MPI.MAX, np.maximum), "band": (MPI.BAND, np.bitwise_and), "bor": (MPI.BOR, np.bitwise_or),
       "bxor": (MPI.BXOR, np.bitwise_xor)}
LENGTHS = (1, 7, 8, 15, 16, 63, 64, 1000, 4099)


def first_failure(dt: np.dtype, mpi_op, np_op, rng):
    info = np.iinfo(dt)
    for n in LENGTHS:
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        got = b.copy()
        mpi_op.Reduce_local(a, got)
        if not np.array_equal(got, np_op(a, b)):
            return n
    return None


def main() -> int:
    print(MPI.Get_library_version().splitlines()[0])
    rng = np.random.default_rng(0)
    status = 0
    for dt in dtypes.ALL:
        if dt.kind not in ("int", "uint") or not dt.native:
            continue
        wrong = []
        for name, (mpi_op, np_op) in OPS.items():
            n = first_failure(dt.storage, mpi_op, np_op, rng)
            if n is not None:
                trusted = reduces_natively(dt, ops.resolve(name))
                wrong.append(f"{name} from {n} elements ({'STILL USED by mpicoll' if trusted else 'mpicoll uses its kernel'})")
                status |= trusted
        print(f"{dt.name:>7}: {'; '.join(wrong) if wrong else 'matches numpy'}")
    return int(status)


if __name__ == "__main__":
    sys.exit(main())
