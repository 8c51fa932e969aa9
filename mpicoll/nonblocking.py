"""Deprecated: the names this module re-exported are the package's own.

``mpicoll.nonblocking.X`` is ``mpicoll.X`` (``iallreduce``, ``Request``,
``waitall``, ``progress``, ``set_progress_thread``, ...); ``names()`` is
``mpicoll.algorithms("allreduce")``. Every nonblocking form lives in
``mpicoll.api``, its driver and the progress thread in ``mpicoll.engine``.
Attribute access here still works, with a DeprecationWarning.
"""
from __future__ import annotations

import warnings

from . import api, engine, registry

# The old name -> the module that holds the object the package exports.
_MOVED = {"iallgather": api, "iallreduce": api, "ibcast": api, "ireduce": api, "ireduce_scatter": api,
          "Request": engine, "progress": engine, "progress_thread_active": engine, "set_progress_thread": engine,
          "waitall": engine}


def __getattr__(name):
    if name in _MOVED:
        warnings.warn(f"mpicoll.nonblocking.{name} is mpicoll.{name}", DeprecationWarning, stacklevel=2)
        return getattr(_MOVED[name], name)
    if name == "names":
        warnings.warn("mpicoll.nonblocking.names() is mpicoll.algorithms('allreduce')", DeprecationWarning,
                      stacklevel=2)
        return lambda: registry.names("allreduce")
    raise AttributeError(f"module 'mpicoll.nonblocking' has no attribute {name!r}")
