"""The C extensions built per MPI library (csrc/build_executor.py):
``mpicoll._executor_<mpi>`` and ``mpicoll._native_<mpi>``, found for
mpi4py's library. Imports nothing of mpicoll, so that engine.py (which
executor.py and native.py import) can reach them too.
"""
from __future__ import annotations

import importlib

from mpi4py import MPI

_TAGS = {"MPICH": "mpich", "Open MPI": "openmpi"}


def library_module(prefix: str):
    """(module, "") of mpicoll.<prefix>_<mpi>, the build of csrc/build_executor.py
    for mpi4py's MPI library, or (None, why not)."""
    vendor = MPI.get_vendor()[0]
    tag = _TAGS.get(vendor)
    if tag is None:
        return None, f"no {prefix} module for {vendor!r} (MPICH and Open MPI are supported)"
    try:
        return importlib.import_module(f"mpicoll.{prefix}_{tag}"), ""
    except ImportError as exc:
        return None, (f"mpicoll.{prefix}_{tag} is not built ({exc}); run "
                      "'python csrc/build_executor.py' with this environment's Python (make install does)")
