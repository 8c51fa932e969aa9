"""The algorithm registry: every algorithm of every collective, by name.

It sits below the algorithms (``mpicoll.algorithms``, whose modules
register themselves here when the package is imported) so that the layers
which only look names up - selection, tuning profiles - need not import
the algorithms themselves.

Each module in this package implements one algorithm, for one or more
collectives, as *schedules* (generator functions, see ``mpicoll.schedule``)
with the collective's shared signature:

====================  ==============================================  =========================
collective            schedule signature                              on completion
====================  ==============================================  =========================
``allreduce``         ``fn(ctx, buf, red, src=None, **knobs)``        every rank's ``buf`` holds
                                                                      the reduction
``reduce_scatter``    ``fn(ctx, buf, red, bounds, **knobs)``          ``buf[bounds[rank]]`` holds
                                                                      this rank's reduced block
``allgather``         ``fn(ctx, buf, bounds, **knobs)``               every block everywhere
``bcast``             ``fn(ctx, buf, root, **knobs)``                 root's ``buf`` everywhere
``reduce``            ``fn(ctx, buf, red, root, **knobs)``            root's ``buf`` holds the
                                                                      reduction
``scatter``           ``fn(ctx, buf, bounds, root, **knobs)``         each rank's ``buf`` holds
                                                                      its block of root's ``buf``
``gather``            ``fn(ctx, buf, bounds, root, **knobs)``         root's ``buf[bounds[i]]``
                                                                      holds rank i's ``buf``
``allgatherv``        ``fn(ctx, buf, bounds, **knobs)``               as allgather (uneven blocks)
``alltoall``          ``fn(ctx, src, dst, sbounds, rbounds,           ``dst[rbounds[i]]`` holds
                      **knobs)``                                      rank i's ``src[sbounds[me]]``
``alltoallv``         as alltoall                                     as alltoall (uneven blocks)
====================  ==============================================  =========================

``ctx`` is the call's ``schedule.Context`` (rank, size, operations,
scratch); ``buf`` is a contiguous 1-D *storage* array (float16/bfloat16 as
uint16) that the algorithm may overwrite; ``red`` is a
``kernels.Reduction``; ``src``, when given, is the input and ``buf`` only
the output (out-of-place calls: the algorithm may fold the copy into its
first step); ``bounds`` is ``[(start, stop)]`` per rank, in elements.

The data-movement collectives added with scatter (scatter, gather,
allgatherv, alltoall, alltoallv) work on uint8 storage (nothing is reduced,
so bounds are in bytes). For scatter and gather, ``buf`` is the whole
buffer (every rank's block, at ``bounds``) on the root and only this rank's
block elsewhere; the root's own block is placed by the plan layer, never by
the schedule. For alltoall(v), ``src`` and ``dst`` never overlap (the plan
layer copies an in-place input first) and the schedule copies the rank's
own block itself; alltoall's blocks are all the same length.

Algorithms register with ``@register(collective, name, knobs=...)``;
``knobs`` names the keyword arguments a tuning profile may set (checked
when a profile is loaded), ``prepare`` is an optional hook the plan layer
calls at call time, ``prepare(st, buf, red, **knobs)``, before the schedule
runs: collective set-up such as a shared-memory window (every rank makes
calls in the same order, so call time is a safe moment for collective
set-up, while a nonblocking schedule's later steps are not), and the
decisions the schedule would otherwise make while it runs. It returns
None, or a dict of knobs it decided, which the schedule then receives
(hierarchical's ``cross``: the algorithm across nodes, chosen once per
call from the cross communicator's profile, not once per chunk inside the
schedule). ``native`` marks the MPI library's own collective (the plan
layer may then call it directly, or use MPI's persistent form);
``compilable`` a schedule a kept plan may record for the C executor;
``program`` gives a kept all-reduce signature a program for the executor
that the algorithm writes itself instead (shm's one-chunk call: a step
that is not a message).

The registry's entries are also callable with a blocking signature,
``get("allreduce", "ring")(st, buf, red, src=None, **knobs)``, which runs
the schedule with the blocking driver (for benchmarks and tests).
"""
from __future__ import annotations

import warnings
from typing import Callable, Dict, Optional, Tuple

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce",
               "scatter", "gather", "allgatherv", "alltoall", "alltoallv")


class Algorithm:
    """One registered algorithm of one collective."""

    __slots__ = ("collective", "name", "schedule", "knobs", "prepare", "native", "compilable", "doc",
                 "check_values", "program")

    def __init__(self, collective: str, name: str, schedule: Callable, knobs: Tuple[str, ...] = (),
                 prepare: Optional[Callable] = None, native: Optional[Callable] = None, compilable: bool = False,
                 check_values: Optional[Callable] = None, program: Optional[Callable] = None):
        self.collective = collective
        # program(st, n, dtype, red, has_src, **knobs) -> program.Program or
        # None: for a kept all-reduce signature (persistent requests
        # included), the program the C executor runs for it, written by the
        # algorithm rather than recorded from its schedule (shm's one-chunk
        # call), or None where the schedule runs it. Its runs must meet
        # ranks that run the schedule exactly (same messages, syncs, state
        # after); where it cannot take a call now, the executor's probe
        # says so before the call is numbered and the schedule runs it.
        self.program = program
        # check_values(knobs): raises ValueError for a knob value the
        # algorithm refuses; local and pure, so a bad value fails on every
        # rank and at every size, p = 1 included, before any message.
        self.check_values = check_values
        # The schedule's messages do not depend on the data and it copies
        # only through ctx.copy: a kept plan may record it once and run the
        # recording in C (program.py, executor.py).
        self.compilable = compilable
        self.name = name
        self.schedule = schedule
        self.knobs = tuple(knobs)
        self.prepare = prepare
        self.native = native
        self.doc = schedule.__doc__

    def check_knobs(self, knobs: dict, where: str = "") -> None:
        bad = sorted(set(knobs) - set(self.knobs))
        if bad:
            have = ", ".join(self.knobs) or "none"
            raise ValueError(f"mpicoll: {where}{self.collective} algorithm {self.name!r} has no knob "
                             f"{', '.join(map(repr, bad))} (its knobs: {have})")
        if self.check_values is not None:
            self.check_values(knobs)

    def __call__(self, st, *args, **knobs):
        """Blocking run on CommState ``st`` (benchmarks, tests)."""
        from . import schedule

        if "src" in knobs:  # allreduce(st, buf, red, src=x): the input of an out-of-place call
            args = args + (knobs.pop("src"),)
        if self.prepare is not None:
            knobs.update(self.prepare(st, args[0], args[1] if len(args) > 1 else None, **knobs) or {})
        seq, tag = st.next_seq()
        ctx = schedule.Context(st, tag, st.pool, (self.collective, self.name, _nbytes_of(args), seq))
        schedule.run(self.schedule(ctx, *args, **knobs))

    def __repr__(self):
        return f"<mpicoll algorithm {self.collective}/{self.name}>"


def _nbytes_of(args) -> int:
    return int(getattr(args[0], "nbytes", 0)) if args else 0


_REGISTRY: Dict[str, Dict[str, Algorithm]] = {c: {} for c in COLLECTIVES}


def register(collective: str, name: str, *, knobs=(), prepare=None, native=None, compilable=False,
             check_values=None, program=None):
    def deco(fn):
        table = _REGISTRY[collective]
        if name in table or name == "auto":
            raise ValueError(f"algorithm {name!r} registered twice for {collective}")
        table[name] = Algorithm(collective, name, fn, knobs, prepare, native, compilable, check_values, program)
        return fn

    return deco


# Earlier names, still accepted (with a DeprecationWarning) for today's:
# scatter and gather's binomial tree is "tree", as for allreduce, bcast and
# reduce; the all-to-all "ring" is a windowed shift exchange ("shift").
RENAMED = {("scatter", "binomial"): "tree", ("gather", "binomial"): "tree",
           ("alltoall", "ring"): "shift", ("alltoallv", "ring"): "shift"}


def canonical(collective: str, name: str) -> str:
    """Today's name of ``name`` (a renamed one warns once per call site)."""
    new = RENAMED.get((collective, name))
    if new is None:
        return name
    warnings.warn(f"mpicoll: the {collective} algorithm {name!r} is now called {new!r}", DeprecationWarning,
                  stacklevel=3)
    return new


def get(collective: str, name: str) -> Algorithm:
    try:
        return _REGISTRY[collective][canonical(collective, name)]
    except KeyError:
        if collective not in _REGISTRY:
            raise ValueError(f"mpicoll: unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None
        raise ValueError(f"mpicoll: unknown {collective} algorithm {name!r}; "
                         f"known: {', '.join(names(collective))}") from None


def names(collective: str = "allreduce") -> list:
    """Registered algorithm names for a collective, with 'auto' first."""
    if collective not in _REGISTRY:
        raise ValueError(f"mpicoll: unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    return ["auto"] + sorted(_REGISTRY[collective])


def has(collective: str, name: str) -> bool:
    return name in _REGISTRY[collective] or (collective, name) in RENAMED
