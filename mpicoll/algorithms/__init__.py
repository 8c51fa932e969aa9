"""The algorithms, one module each; importing this package registers them
all in ``mpicoll.registry`` (which documents the schedules' signatures).

``mpicoll.algorithms("allreduce")`` lists the names ``algorithm=`` accepts;
``register``, ``get``, ``has``, ``names`` are the registry's, kept here too.
"""
from __future__ import annotations

import sys as _sys

from ..registry import (COLLECTIVES, RENAMED, Algorithm, canonical, get, has, names,  # noqa: F401
                        register)

# Importing the modules registers their algorithms.
from . import mpi, rabenseifner, recursive_doubling, ring, tree  # noqa: E402,F401
from . import hierarchical, shm  # noqa: E402,F401  (shared-memory and two-level all-reduce)
from . import bruck, linear, mpi_family, pairwise, ring_family, tree_family  # noqa: E402,F401  (scatter ... alltoallv)
from . import cascade, hetero_ring, knomial  # noqa: E402,F401  (the seeds' algorithms)


# ``mpicoll.algorithms("allreduce")`` lists names, and ``mpicoll.algorithms``
# is also this package (``import mpicoll.algorithms.ring`` works): the
# package module is made callable rather than shadowed by a function.
class _CallableModule(type(_sys.modules[__name__])):
    def __call__(self, collective: str = "allreduce") -> list:
        """Names accepted by ``algorithm=`` for a collective ('auto' first)."""
        return names(collective)


_sys.modules[__name__].__class__ = _CallableModule
