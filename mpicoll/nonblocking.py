"""Nonblocking collectives: ``iallreduce``, ``ireduce_scatter``, ``iallgather``,
``ibcast``, ``ireduce`` return a ``Request`` at once; the work runs while the
caller computes.

Every registered algorithm has a nonblocking form, because an algorithm is
written once, as a schedule (``mpicoll.schedule``), and the nonblocking
driver (``mpicoll.engine``) runs the same schedule as the blocking one:
``iallreduce(x, algorithm=name)`` works for every name in
``mpicoll.algorithms("allreduce")``. The progress engine, its background
thread and ``waitall`` live in ``mpicoll.engine``; this module keeps their
public names.
"""
from __future__ import annotations

from . import algorithms as _alg
from .api import iallgather, iallreduce, ibcast, ireduce, ireduce_scatter  # noqa: F401
from .engine import (ENV_PROGRESS_THREAD, Request, _engine, progress, progress_thread_active,  # noqa: F401
                     set_progress_thread, waitall)


def names() -> list:
    """Names accepted by iallreduce's ``algorithm=`` ('auto' first): all of them."""
    return _alg.names("allreduce")
