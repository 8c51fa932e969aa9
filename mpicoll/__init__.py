"""mpicoll: collective communication for Python programs on MPI.

All-reduce (ring, tree, recursive doubling, Rabenseifner, shared memory,
hierarchical, native MPI) and the related collectives, built on mpi4py
point-to-point calls, with the element-wise reductions in C kernels bound
through cffi. Every collective has a blocking, a nonblocking (``i*``) and a
persistent (``*_init``) form.

    import mpicoll
    y = mpicoll.allreduce(x, op="sum")          # comm defaults to MPI.COMM_WORLD
    mpicoll.allreduce(x, out=x)                 # in place
    req = mpicoll.iallreduce(x, out=x); req.wait()
    mpicoll.algorithms("allreduce")             # ['auto', 'hierarchical', 'mpi', ...]

The layers (docs/architecture.md): kernels (C, no MPI) -> schedules (one
per algorithm, in mpicoll/algorithms/) -> drivers (blocking, nonblocking,
simulated: mpicoll.schedule, mpicoll.engine) -> plans (mpicoll.plan:
validation, state, decision) -> the front doors (this package's functions,
mpicoll.Comm, the bucketer).
"""
from . import algorithms  # noqa: F401  (callable: mpicoll.algorithms("allreduce") lists names)
from . import dtypes, kernels, ops  # noqa: F401  (mpicoll.ops.names(), mpicoll.dtypes.names())
from .errors import CollectiveTimeout, MismatchError, PeerFailure
from .api import (allgather, allgather_init, allreduce, allreduce_init, bcast, bcast_init, explain, iallgather,
                  iallreduce, ibcast, ireduce, ireduce_scatter, reduce, reduce_init, reduce_scatter,
                  reduce_scatter_init)
from .api import (allgatherv, allgatherv_init, alltoall, alltoall_init, alltoallv, alltoallv_init, gather,
                  gather_init, iallgatherv, ialltoall, ialltoallv, igather, iscatter, scatter, scatter_init)
from .engine import Request, waitall
from .plan import Persistent
from .dropin import Comm  # noqa: F401  (mpi4py drop-in: comm = mpicoll.Comm(MPI.COMM_WORLD))
from . import nonblocking  # noqa: F401
from .bucketing import GradientBucketer, HalfPrecision, TopK  # noqa: F401  (data-parallel training)
from .sharded import ShardedOptimizer  # noqa: F401
from .stale import StaleAllreduce  # noqa: F401

__version__ = "0.1.0"

__all__ = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce",
           "iallreduce", "ireduce_scatter", "iallgather", "ibcast", "ireduce",
           "allreduce_init", "reduce_scatter_init", "allgather_init", "bcast_init", "reduce_init",
           "scatter", "gather", "allgatherv", "alltoall", "alltoallv",
           "iscatter", "igather", "iallgatherv", "ialltoall", "ialltoallv",
           "scatter_init", "gather_init", "allgatherv_init", "alltoall_init", "alltoallv_init",
           "explain", "algorithms", "waitall", "Request", "Persistent", "Comm", "GradientBucketer",
           "ShardedOptimizer", "StaleAllreduce", "HalfPrecision", "TopK", "MismatchError", "CollectiveTimeout",
           "PeerFailure",
           "__version__"]
