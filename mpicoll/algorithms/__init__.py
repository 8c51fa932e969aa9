"""The algorithm registry.

Each module in this package implements one algorithm, for one or more
collectives, as functions with the collective's shared signature:

====================  ==============================================  =========================
collective            signature                                       on return
====================  ==============================================  =========================
``allreduce``         ``fn(st, buf, red, *, src=None)``               every rank's ``buf`` holds
                                                                      the reduction
``reduce_scatter``    ``fn(st, buf, red, bounds)``                    ``buf[bounds[rank]]`` holds
                                                                      this rank's reduced block
``allgather``         ``fn(st, buf, bounds)``                         every block everywhere
``bcast``             ``fn(st, buf, root)``                           root's ``buf`` everywhere
``reduce``            ``fn(st, buf, red, root)``                      root's ``buf`` holds the
                                                                      reduction
====================  ==============================================  =========================

``st`` is the communicator's cached ``CommState`` (private duplicate,
rank, size, scratch buffers); ``buf`` is a contiguous 1-D *storage* array
(float16/bfloat16 as uint16) that the algorithm may overwrite; ``red`` is a
``kernels.Reduction``; ``src``, when given, is the input and ``buf`` only
the output (out-of-place calls: the algorithm may fold the copy into its
first step instead of paying for a separate one); ``bounds`` is ``[(start, stop)]`` per rank, in
elements. Extra knobs are keyword-only with defaults
(``ring.allreduce(st, buf, red, *, segment_bytes=...)``).

Algorithms register themselves with ``@register(collective, name)``; the
public API looks them up by name, and ``select.py`` chooses one for "auto".
"""
from __future__ import annotations

from typing import Callable, Dict

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce")

_REGISTRY: Dict[str, Dict[str, Callable]] = {c: {} for c in COLLECTIVES}


def register(collective: str, name: str):
    def deco(fn):
        table = _REGISTRY[collective]
        if name in table or name == "auto":
            raise ValueError(f"algorithm {name!r} registered twice for {collective}")
        table[name] = fn
        return fn

    return deco


def get(collective: str, name: str) -> Callable:
    try:
        return _REGISTRY[collective][name]
    except KeyError:
        raise ValueError(f"mpicoll: unknown {collective} algorithm {name!r}; "
                         f"known: {', '.join(names(collective))}") from None


def names(collective: str = "allreduce") -> list:
    """Registered algorithm names for a collective, with 'auto' first."""
    if collective not in _REGISTRY:
        raise ValueError(f"mpicoll: unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return ["auto"] + sorted(_REGISTRY[collective])


def has(collective: str, name: str) -> bool:
    return name in _REGISTRY[collective]


# Importing the modules registers their algorithms.
from . import mpi, rabenseifner, recursive_doubling, ring, tree  # noqa: E402,F401
from . import hierarchical, shm  # noqa: E402,F401  (shared-memory and two-level all-reduce)
