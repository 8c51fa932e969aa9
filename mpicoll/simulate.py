"""The SimGrid driver: mpicoll's schedules at p = 16..1024 on a simulated platform.

A fourth driver beside blocking (``schedule.run``), nonblocking
(``engine.Request``) and counting (``schedule.simulate``). Each of the p
ranks' schedule generators - the registry's, unchanged - runs as a SimGrid
actor on a host of a platform file (SimGrid XML); rank r runs on host
``r // ppn`` of the platform's cluster. SimGrid's network model prices the
messages, so contention on shared links, the critical path of a tree and
the overlap of a pipelined ring come out of the simulation rather than out
of a closed formula (``mpicoll.model``).

What each operation costs:

* ``ctx.send(buf, peer)``: ``op_overhead_s`` of the sender's time (the
  Python and MPI software cost of posting one message, calibrated on this
  machine), then a SimGrid ``put_async`` of ``buf.nbytes`` bytes on the
  mailbox of the (sender, receiver) pair. A mailbox matches in posting
  order, as MPI does within one tag. Sends up to ``eager_bytes`` are
  detached (complete at once, MPI's eager protocol); longer ones complete
  when the transfer has (rendezvous).
* ``ctx.recv(buf, peer)``: a ``get_async`` on the same pair's mailbox; the
  message carries its byte count, and a receive of another size raises
  ``MismatchError`` as the other drivers do.
* a yielded batch waits for all its operations (``Comm.wait_all``).
* ``red.combine``: ``bytes / reduce_Bps`` seconds of computation on the
  rank's host (a SimGrid execution, so ranks share a host's cores).
* each call starts with ``call_overhead_s`` (the per-call cost ``o`` of
  ``mpicoll.model``: plan, Python, the driver's entry).

The data does not move: buffers are *phantom* numpy arrays of the real
length whose elements all alias one scalar (stride 0), so a 64 MiB
all-reduce at p = 1024 costs no memory, while the schedules still slice
them and every size and byte count is the real one.

Limitations: only point-to-point schedules run. The MPI library's own
collective (``mpi``), and algorithms that need a sub-communicator or
shared memory (``hierarchical``, ``shm``) raise ``Unsimulable`` and are
reported as not simulated; the MPI library's algorithms are simulated
natively by SMPI instead (sim/anchor.c, docs/scale.md). Platform parameters
are in the platform file's ``<prop id="mpicoll.*">`` elements (see
platforms/*.xml).

    python -m mpicoll.simulate --platform platforms/cluster-128x8-fattree.xml \\
        --p 64,256,1024 --ppn 8 --sizes 8:64M [--algorithms ring,tree] [--profile-out F]

SimGrid's Python module comes from Debian (``apt-get install
python3-simgrid``, SimGrid 3.32); it is found in Debian's dist-packages
folder when it is not importable otherwise.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from . import schedule
from .schedule import RECV, SEND

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"

# The collectives this driver runs (the anchor's family); the others' calls
# differ only in arguments and can be added to _schedule_args.
COLLECTIVES = ("allreduce", "bcast", "reduce", "reduce_scatter", "allgather")


def import_simgrid():
    """The ``simgrid`` module, from Debian's dist-packages if need be; raises
    ImportError with the install command when it is missing."""
    try:
        import simgrid
    except ImportError:
        # Debian builds the module for the system Python 3.11; the venv's
        # Python 3.11 loads it once that folder is on the path. Appended,
        # so that the venv's own packages keep precedence.
        if DEBIAN_DIST_PACKAGES not in sys.path and os.path.isdir(DEBIAN_DIST_PACKAGES):
            sys.path.append(DEBIAN_DIST_PACKAGES)
        try:
            import simgrid
        except ImportError as exc:
            raise ImportError("mpicoll.simulate needs SimGrid's Python module: apt-get install python3-simgrid "
                              "(SimGrid 3.32)") from exc
    return simgrid


class Unsimulable(NotImplementedError):
    """The algorithm needs something the SimGrid driver does not model."""


# ---- the platform ---------------------------------------------------------------

class Platform(NamedTuple):
    """A platform file and mpicoll's parameters for it (its ``mpicoll.*`` props)."""
    path: str
    hosts: int  # hosts in the file (nodes)
    cores: int  # cores per host
    reduce_Bps: float  # bytes combined per second by one rank (the C kernel, float32 sum)
    op_overhead_s: float  # software cost of posting one message
    call_overhead_s: float  # fixed cost of one collective call
    eager_bytes: int  # sends up to this size complete at once
    props: dict


def load_platform(path: str) -> Platform:
    """Read the mpicoll parameters of platform file ``path``."""
    root = ET.parse(path).getroot()
    props = {e.get("id")[len("mpicoll."):]: e.get("value") for e in root.iter("prop")
             if (e.get("id") or "").startswith("mpicoll.")}
    need = ("reduce_Bps", "op_overhead_s", "call_overhead_s", "eager_bytes")
    missing = [k for k in need if k not in props]
    if missing:
        raise ValueError(f"mpicoll: platform {path} lacks <prop id=\"mpicoll.{missing[0]}\" .../> "
                         f"(needs {', '.join('mpicoll.' + k for k in need)})")
    hosts, cores = 0, 1
    for c in root.iter("cluster"):
        for part in c.get("radical", "").split(","):
            lo, _, hi = part.partition("-")
            hosts += int(hi or lo) - int(lo) + 1
        cores = int(c.get("core", "1"))
    return Platform(path, hosts, cores, float(props["reduce_Bps"]), float(props["op_overhead_s"]),
                    float(props["call_overhead_s"]), int(float(props["eager_bytes"])), props)


# ---- phantom buffers ----------------------------------------------------------------

def phantom(n: int, dtype) -> np.ndarray:
    """A writable array of ``n`` elements of ``dtype`` that all share one
    element's memory: real shape, sizes and slices, no storage."""
    base = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=(n,), strides=(0,), writeable=True)


# ---- the driver --------------------------------------------------------------------

class Stats(schedule.SimStats):
    """Per-rank counts (as the counting driver's) and the rank's finish time."""

    __slots__ = ("finish_s",)

    def __init__(self):
        super().__init__()
        self.finish_s = None  # None: the rank's schedule never ended


class _Context(schedule.Context):
    """A rank's context in the SimGrid driver: operations become SimGrid
    communications when posted (``_Run.post``)."""

    __slots__ = ("run", "stats")

    def start(self, *ops):
        for op in ops:
            if op.req is None:
                self.run.post(op)
        return ops

    def scratch(self, name, n, dtype):
        return phantom(n, dtype)

    def native(self, blocking, start):
        raise Unsimulable("the MPI library's own collective (simulated by SMPI instead: sim/anchor.c)")

    def custom(self, obj):
        raise Unsimulable("shared-memory synchronisation is not simulated")

    def sub(self, st):
        raise Unsimulable("sub-communicators are not simulated")


class _TimedReduction:
    """A Reduction that costs simulated time instead of computing."""

    def __init__(self, sg, red_op, dtype, stats, seconds_per_byte):
        self._sg, self._stats, self._spb = sg, stats, seconds_per_byte
        self.op, self.dtype = red_op, dtype

    def _spend(self, nbytes):
        self._stats.bytes_reduced += nbytes
        if nbytes:
            # Flops on this host for the kernel's time: the host's speed
            # converts, and ranks sharing a host share its cores.
            host = self._sg.this_actor.get_host()
            self._sg.this_actor.execute(nbytes * self._spb * host.speed)

    def combine(self, dst, a, b):
        self._spend(dst.nbytes)

    def combine_many(self, dst, srcs):
        self._spend(dst.nbytes * max(len(srcs) - 1, 0))

    def finish(self, buf, size):
        pass  # avg's division: one pass, as cheap as a copy; not priced


class _Run:
    """One simulated collective call: the engine, the mailboxes, the ranks."""

    def __init__(self, sg, plat: Platform, p: int, ppn: int):
        self.sg, self.plat, self.p, self.ppn = sg, plat, p, ppn
        self.mailboxes: Dict[tuple, object] = {}
        self.stats = [Stats() for _ in range(p)]
        self.error: Optional[BaseException] = None

    def mailbox(self, src, dst):
        mb = self.mailboxes.get((src, dst))
        if mb is None:
            mb = self.mailboxes[(src, dst)] = self.sg.Mailbox.by_name(f"{src}>{dst}")
        return mb

    def post(self, op):
        sg, ctx = self.sg, op.ctx
        nbytes = op.buf.nbytes
        if op.kind == SEND:
            ctx.stats.messages += 1
            ctx.stats.bytes_sent += nbytes
            if self.plat.op_overhead_s:
                sg.this_actor.sleep_for(self.plat.op_overhead_s)
            mb = self.mailbox(ctx.rank, op.peer)
            if nbytes <= self.plat.eager_bytes:
                mb.put_init(nbytes, nbytes).detach()  # detach() starts it; nobody waits
                op.req = True
            else:
                op.req = mb.put_async(nbytes, nbytes)
        elif op.kind == RECV:
            op.req = self.mailbox(op.peer, ctx.rank).get_async()  # (comm, payload getter)
        else:  # pragma: no cover - _Context refuses the other kinds before
            raise Unsimulable("only point-to-point operations are simulated")

    def wait(self, ops):
        comms = []
        for op in ops:
            if op.req is None:
                self.post(op)
            if op.req is not True:
                comms.append(op.req[0] if op.kind == RECV else op.req)
        if comms:
            self.sg.Comm.wait_all(comms)
        for op in ops:
            if op.kind == RECV and op.req is not True:
                got = op.req[1].get()
                if got != op.buf.nbytes:
                    raise schedule.size_mismatch(op, got)
            op.req = True

    def actor(self, rank, gen):
        """Rank ``rank``'s actor body: the blocking driver's loop on SimGrid."""
        try:
            if self.plat.call_overhead_s:
                self.sg.this_actor.sleep_for(self.plat.call_overhead_s)
            try:
                ops = next(gen)
                while True:
                    if ops:
                        self.wait(ops)
                    ops = gen.send(None)
            except StopIteration:
                pass
            self.stats[rank].finish_s = self.sg.Engine.clock
        except BaseException as exc:  # noqa: BLE001 - reported after the run, with the rank
            # Not re-raised: an exception escaping an actor aborts SimGrid
            # (the whole process); the other ranks then block and the run
            # ends, and _simulate raises this one.
            if self.error is None:
                self.error = exc


def _schedule_args(collective, p, n, dtype, red):
    """The schedule's arguments after ctx for one call of ``n`` elements (a
    phantom buffer per rank; bounds per np.array_split; root 0)."""
    from .algorithms.common import block_bounds

    def args(rank):
        buf = phantom(n, dtype)
        if collective == "allreduce":
            return (buf, red(rank), None)
        if collective == "reduce_scatter":
            return (buf, red(rank), block_bounds(n, p))
        if collective == "allgather":
            return (buf, block_bounds(n, p))
        if collective == "bcast":
            return (buf, 0)
        if collective == "reduce":
            return (buf, red(rank), 0)
        raise ValueError(f"mpicoll: the SimGrid driver does not run {collective!r} (runs: {', '.join(COLLECTIVES)})")

    return args


class Result(NamedTuple):
    time_s: float  # the slowest rank's finish time, simulated
    stats: list  # per-rank Stats
    wall_s: float  # how long the simulation took


def run(platform, collective: str, algorithm: str, p: int, nbytes: int, *, ppn: int = 1,
        dtype: str = "float32", op: str = "sum", knobs: Optional[dict] = None) -> Result:
    """Simulate one call of ``collective`` by ``algorithm`` on ``p`` ranks,
    ``ppn`` per host, of ``nbytes`` bytes (rounded down to whole elements);
    returns the predicted time and the per-rank counts.

    Each call runs in a fresh process-wide SimGrid engine: SimGrid allows
    one engine per process, so ``run`` forks and the child simulates.
    """
    plat = platform if isinstance(platform, Platform) else load_platform(platform)
    if p < 1 or ppn < 1:
        raise ValueError(f"mpicoll: p and ppn must be >= 1, got p={p}, ppn={ppn}")
    nodes = -(-p // ppn)
    if nodes > plat.hosts:
        raise ValueError(f"mpicoll: p={p} at {ppn} per node needs {nodes} nodes; {plat.path} has {plat.hosts}")
    from . import dtypes, ops
    from .algorithms import get

    alg = get(collective, algorithm)  # raises ValueError for an unknown name, before any work
    if alg.native is not None or algorithm in ("shm", "hierarchical"):
        raise Unsimulable(f"{collective}/{algorithm} needs the MPI library or shared memory; "
                          "the SimGrid driver runs point-to-point schedules only")
    dt = dtypes.BY_NAME[dtype]
    reduction = ops.resolve(op)
    if collective in ("allreduce", "reduce_scatter", "reduce"):
        itemsize = np.dtype(dt.storage).itemsize
        storage = dt.storage
    else:
        itemsize, storage = 1, np.uint8  # data-movement collectives: bytes
    n = nbytes // itemsize
    return _in_child(_simulate, plat, alg, collective, p, ppn, n, storage, dt, reduction, knobs or {})


def _simulate(plat, alg, collective, p, ppn, n, storage, dt, reduction, knobs):
    sg = import_simgrid()
    t0 = time.perf_counter()
    engine = sg.Engine(["mpicoll", "--log=root.thresh:critical", "--cfg=contexts/factory:thread"])
    engine.load_platform(plat.path)
    hosts = sorted(engine.all_hosts, key=lambda h: _host_order(h.name))
    r = _Run(sg, plat, p, ppn)
    spb = 1.0 / plat.reduce_Bps
    args = _schedule_args(collective, p, n, storage,
                          lambda rank: _TimedReduction(sg, reduction, dt, r.stats[rank], spb))
    for rank in range(p):
        ctx = _Context(schedule._SimComm(rank, p), 0, {}, (collective, alg.name, n, 0))
        ctx.run, ctx.stats = r, r.stats[rank]
        gen = alg.schedule(ctx, *args(rank), **knobs)
        sg.Actor.create(f"rank{rank}", hosts[rank // ppn], r.actor, rank, gen)
    engine.run()
    if r.error is not None:
        raise r.error
    late = [rank for rank, s in enumerate(r.stats) if s.finish_s is None]
    if late:
        raise RuntimeError(f"mpicoll: simulated {collective}/{alg.name} did not finish on {len(late)} rank(s) "
                           "(deadlock: a receive nobody sends)")
    return Result(max(s.finish_s for s in r.stats), r.stats, time.perf_counter() - t0)


def _host_order(name: str):
    digits = "".join(c for c in name if c.isdigit())
    return (int(digits) if digits else -1, name)


def _in_child(fn, *args):
    """``fn(*args)`` in a forked child (SimGrid: one engine per process,
    and its actor threads do not outlive a run); its result or exception
    comes back pickled."""
    import pickle

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rfd)
        try:
            out = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - sent to the parent
            out = (False, exc)
        try:
            data = pickle.dumps(out)
        except Exception as exc:  # an exception that does not pickle
            data = pickle.dumps((False, RuntimeError(f"{type(out[1]).__name__}: {out[1]} ({exc})")))
        with os.fdopen(wfd, "wb") as f:
            f.write(data)
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("mpicoll: the simulation process died (SimGrid aborted); rerun to see its log")
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value
