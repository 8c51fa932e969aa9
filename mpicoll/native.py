"""The MPI library's collectives called from C on numpy arrays: the kept
plans' blocking calls (csrc/native.c).

A kept call of the library's own algorithm (kept.py) is a few checks and
one MPI call. Through mpi4py that call costs ~0.7 us of Python-object work
(buffer specs parsed, the buffer protocol twice) on top of the library's
own time, which for a short message is most of the call (8-byte sum at
p = 2: mpi4py 2.24 us, the C call 1.55 us). ``call()`` makes one
``Call`` per kept plan, with everything the call does not take from its
arrays; ``Call.run(sbuf, rbuf)`` returns the MPI error code, which
``check()`` turns into mpi4py's ``MPI.Exception``. ``Call.start`` (the
I-call: kept nonblocking calls) and ``Call.init`` (the MPI-4 persistent
request: ``*_init`` plans of the library's algorithm) return a ``Req``
whose ``Test``/``Wait``/``Start``/``Free`` are mpi4py's names, so the
engine and persistent.py drive it as they drive an ``MPI.Request``.

The module is built per MPI library beside the executor
(csrc/build_executor.py, which ``make install`` runs). Without it, or with
``MPICOLL_NATIVE=0`` (read when a signature is first kept; ``set_enabled``
from a program or test), kept plans call mpi4py: the same calls, the same
results.
"""
from __future__ import annotations

import os

from mpi4py import MPI

from . import engine
from .builds import library_module

_mod, _why = library_module("_native")
_enabled = os.environ.get("MPICOLL_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
if _mod is not None and _enabled:
    # Short native requests made and waited for in C (engine.use_native);
    # with MPICOLL_NATIVE=0 the engine's Python does it all.
    engine.use_native(_mod)

# The kinds of call (csrc/native.c's enum; None where the module is absent).
# PROGRAM: a compiled schedule's blocking run (executor.Executable.gate).
_KINDS = ("ALLREDUCE", "BCAST", "REDUCE", "ALLGATHERV", "SCATTERV", "GATHERV", "ALLTOALL", "REDUCE_SCATTER",
          "ALLTOALLV", "PROGRAM")
ALLREDUCE, BCAST, REDUCE, ALLGATHERV, SCATTERV, GATHERV, ALLTOALL, REDUCE_SCATTER, ALLTOALLV, PROGRAM = (
    getattr(_mod, k, None) for k in _KINDS)


def available() -> bool:
    return _mod is not None


def why_not() -> str:
    """Why the native calls are not available ("" when they are)."""
    return _why


def enabled() -> bool:
    """Whether kept plans made from now on call the library from C."""
    return _enabled and _mod is not None


def module():
    """The built module where native calls are on at import, else None
    (api.py's doors in C)."""
    return _mod if _enabled and _mod is not None else None


def set_enabled(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def call(kind, comm, datatype=None, op=None, root=0, block=0, counts=None, displs=None, rcounts=None,
         rdispls=None):
    """A ``Call`` of ``kind`` on ``comm`` (mpi4py objects; counts in the
    datatype's units, bytes for the byte-wise kinds), or None when native
    calls are off or not built, or a count does not fit a C int (the
    caller then calls mpi4py, which knows MPI-4's large counts)."""
    if not enabled():
        return None
    try:
        return _mod.Call(kind, comm.py2f(), 0 if datatype is None else datatype.py2f(),
                         0 if op is None else op.py2f(), root, block, counts, displs, rcounts, rdispls)
    except (ValueError, OverflowError):
        return None


def check(rc: int) -> None:
    """Raise the MPI error a run returned (mpi4py's exception and text)."""
    if rc:
        raise MPI.Exception(rc)
