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

The layers (docs/architecture.md, lowest first): foundation (types, ops,
kernels, the cost model) -> drivers and the registry (mpicoll.schedule,
mpicoll.engine, mpicoll.registry) -> communicator state and decisions
(mpicoll.commstate, mpicoll.select) -> schedules (one per algorithm, in
mpicoll/algorithms/) -> plans (mpicoll.plan) -> the doors (this package's
functions, mpicoll.Comm, the bucketer).
"""
import warnings as _warnings

# `python -m mpicoll.model` runs model.py as a script after this package -
# which uses the model - has imported it; runpy then warns that the module
# is already imported. Harmless here: the script part only hands over to
# model_cli.main, which uses the imported module.
_warnings.filterwarnings("ignore", message="'mpicoll.model' found in sys.modules", category=RuntimeWarning)

from . import algorithms  # noqa: F401  (callable: mpicoll.algorithms("allreduce") lists names)
from . import dtypes, kernels, ops  # noqa: F401  (mpicoll.ops.names(), mpicoll.dtypes.names())
from .errors import CollectiveTimeout, MismatchError, PeerFailure
from .api import (allgather, allgather_init, allreduce, allreduce_init, bcast, bcast_init, explain, iallgather,
                  iallreduce, ibcast, ireduce, ireduce_scatter, reduce, reduce_init, reduce_scatter,
                  reduce_scatter_init)
from .api import (allgatherv, allgatherv_init, alltoall, alltoall_init, alltoallv, alltoallv_init, gather,
                  gather_init, iallgatherv, ialltoall, ialltoallv, igather, iscatter, scatter, scatter_init)
from .engine import Request, progress, progress_thread_active, set_progress_thread, waitall
from .persistent import Persistent
from .dropin import Comm  # noqa: F401  (mpi4py drop-in: comm = mpicoll.Comm(MPI.COMM_WORLD))
from .bucketing import GradientBucketer, HalfPrecision, TopK  # noqa: F401  (data-parallel training)
from .sharded import ShardedOptimizer  # noqa: F401
from .stale import StaleAllreduce  # noqa: F401

__version__ = "0.1.0"


def __getattr__(name):
    # mpicoll.nonblocking was a module of re-exports; its names live here
    # now. Imported on first use, so old code keeps working (with a warning).
    if name == "nonblocking":
        # Not "from . import nonblocking": that asks this function for the
        # name first, and so on forever.
        import mpicoll.nonblocking as module

        return module
    raise AttributeError(f"module 'mpicoll' has no attribute {name!r}")

__all__ = ["allreduce", "reduce_scatter", "allgather", "bcast", "reduce",
           "iallreduce", "ireduce_scatter", "iallgather", "ibcast", "ireduce",
           "allreduce_init", "reduce_scatter_init", "allgather_init", "bcast_init", "reduce_init",
           "scatter", "gather", "allgatherv", "alltoall", "alltoallv",
           "iscatter", "igather", "iallgatherv", "ialltoall", "ialltoallv",
           "scatter_init", "gather_init", "allgatherv_init", "alltoall_init", "alltoallv_init",
           "explain", "algorithms", "waitall", "Request", "Persistent",
           "progress", "progress_thread_active", "set_progress_thread", "Comm", "GradientBucketer",
           "ShardedOptimizer", "StaleAllreduce", "HalfPrecision", "TopK", "MismatchError", "CollectiveTimeout",
           "PeerFailure",
           "__version__"]
