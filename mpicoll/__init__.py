"""mpicoll: collective communication for Python programs on MPI.

All-reduce (ring, tree, recursive doubling, Rabenseifner, native MPI) and
the related collectives, built on mpi4py point-to-point calls, with the
element-wise reductions in C kernels bound through cffi.

    import mpicoll
    y = mpicoll.allreduce(x, op="sum")          # comm defaults to MPI.COMM_WORLD
    mpicoll.allreduce(x, out=x)                 # in place
    mpicoll.algorithms("allreduce")             # ['auto', 'mpi', 'rabenseifner', ...]
"""
from . import algorithms as _algorithms
from . import dtypes, kernels, ops  # noqa: F401  (mpicoll.ops.names(), mpicoll.dtypes.names())
from .errors import MismatchError
from .api import allgather, allreduce, bcast, explain, reduce, reduce_scatter
from .dropin import Comm  # noqa: F401  (mpi4py drop-in: comm = mpicoll.Comm(MPI.COMM_WORLD))
from .nonblocking import Request, iallreduce, waitall  # noqa: F401  (nonblocking all-reduce)
from .bucketing import GradientBucketer, HalfPrecision, TopK  # noqa: F401  (data-parallel training)

__version__ = "0.1.0"


def algorithms(collective: str = "allreduce") -> list:
    """Names accepted by ``algorithm=`` for a collective ('auto' first)."""
    return _algorithms.names(collective)


__all__ = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce", "explain", "algorithms",
           "iallreduce", "waitall", "Request", "Comm", "GradientBucketer", "HalfPrecision", "TopK",
           "MismatchError", "__version__"]
