"""The SimGrid driver: mpicoll's schedules at p = 16..1024 on a simulated platform.

A fourth driver beside blocking (``schedule.run``), nonblocking
(``engine.Request``) and counting (``counting.simulate``). Each of the p
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
* shared memory (``shm`` on one node, ``hierarchical`` across nodes, whose
  schedules run unchanged): ``ctx.copy`` costs ``bytes / copy_Bps`` of the
  rank's time, a sync point ``sync_s`` and then waits for every rank of
  the node (a SimGrid barrier); the cross-node all-reduce runs on a
  simulated sub-communicator (one rank per node, its own mailboxes).

The data does not move: buffers are *phantom* numpy arrays of the real
length whose elements all alias one scalar (stride 0), so a 64 MiB
all-reduce at p = 1024 costs no memory, while the schedules still slice
them and every size and byte count is the real one.

Limitations: the MPI library's own collective (``mpi``) raises
``Unsimulable`` and is reported as not simulated, and so does
``hierarchical`` where its cross-node step would be that call (auto's
choice for short slices: select._across_nodes; give ``cross=`` to
simulate one of mpicoll's); the MPI library's algorithms are simulated natively by SMPI
instead (sim/anchor.c, docs/scale.md). A node's ranks do not share its
memory bandwidth here (copies and reductions each run at the full rate
on their own core), which flatters shm's copies on a busy node. A send of more
than ``eager_bytes`` completes only once its receive is posted (MPI's
rendezvous protocol): a schedule that waits for such a send before posting
the matching receive deadlocks here (RuntimeError naming the stuck ranks),
as it could under MPI. avg's final division is free; local copies cost
only where the schedule copies through ``ctx.copy`` (shm's window, and
the out-of-place copies of the network algorithms, which this driver's
in-place calls never make).
Platform parameters are in the platform file's ``<prop id="mpicoll.*">``
elements (see platforms/*.xml).

Cost of the simulation itself: one SimGrid actor (a thread) per rank and
1200-2700 messages per second of wall time on a loaded 2-core machine;
a ring all-reduce at p = 1024 (2.1 M messages) takes tens of minutes, so
the study skips cells above ``--max-messages`` (estimated by
``mpicoll.model.terms``). Every ``run`` starts a new Python process (about
0.3 s): SimGrid allows one engine per process.

    python -m mpicoll.simulate --platform platforms/cluster-128x8-fattree.xml \\
        --p 64,256,1024 --ppn 8 --sizes 8:64M [--algorithms ring,tree] [--profile-out F]

SimGrid's Python module comes from Debian (``apt-get install
python3-simgrid``, SimGrid 3.32); it is found in Debian's dist-packages
folder when it is not importable otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
from typing import Dict, List, NamedTuple, Optional

import numpy as np

from . import counting, schedule
from .schedule import CUSTOM, RECV, SEND

DEBIAN_DIST_PACKAGES = "/usr/lib/python3/dist-packages"

# The collectives this driver runs (the anchor's family); the others' calls
# differ only in arguments and can be added to _schedule_args.
COLLECTIVES = ("allreduce", "bcast", "reduce", "reduce_scatter", "allgather")


def import_simgrid():
    """The ``simgrid`` module, from Debian's dist-packages if need be; raises
    ImportError with the install command when it is missing."""
    try:
        import simgrid  # noqa: F401 - the first attempt: any installation on the path
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
    copy_Bps: Optional[float] = None  # bytes one rank copies per second (shm's copies in and out)
    sync_s: Optional[float] = None  # software cost of one shared-memory sync (shm's flag wait)


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
    for h in root.iter("host"):  # hosts listed one by one (platforms/hetero-8x1.xml)
        hosts += 1
        cores = int(h.get("core", "1"))
    optional = {k: float(props[k]) if k in props else None for k in ("copy_Bps", "sync_s")}
    return Platform(path, hosts, cores, float(props["reduce_Bps"]), float(props["op_overhead_s"]),
                    float(props["call_overhead_s"]), int(float(props["eager_bytes"])), props, **optional)


# ---- phantom buffers ----------------------------------------------------------------

def phantom(n: int, dtype) -> np.ndarray:
    """A writable array of ``n`` elements of ``dtype`` that all share one
    element's memory: real shape, sizes and slices, no storage."""
    base = np.zeros(1, dtype)
    return np.lib.stride_tricks.as_strided(base, shape=(n,), strides=(0,), writeable=True)


# ---- the driver --------------------------------------------------------------------

class Stats(counting.SimStats):
    """Per-rank counts (as the counting driver's) and the rank's finish time."""

    __slots__ = ("finish_s",)

    def __init__(self):
        super().__init__()
        self.finish_s = None  # None: the rank's schedule never ended


class _Context(schedule.Context):
    """A rank's context in the SimGrid driver: operations become SimGrid
    communications when posted (``_Run.post``). ``members``: the world
    ranks of this context's communicator (None: the simulated world), so
    that a sub-communicator's messages go between the right hosts."""

    __slots__ = ("run", "stats", "members")

    def __init__(self, st, tag, pool, info=None):
        super().__init__(st, tag, pool, info)
        self.members = getattr(st, "members", None)

    def post_op(self, op):
        self.run.post(op)

    def scratch(self, name, n, dtype):
        return phantom(n, dtype)

    def copy(self, dst, src):
        # Nothing moves (phantoms): the copy costs the rank its time.
        self.run.spend(dst.nbytes / self.run.plat.copy_Bps)

    def native(self, blocking, start):
        raise Unsimulable("the MPI library's own collective (simulated by SMPI instead: sim/anchor.c)")

    def custom(self, obj):
        if not isinstance(obj, _NodeSync):
            raise Unsimulable(f"{getattr(obj, 'what', 'a custom wait')} is not simulated")
        return super().custom(obj)

    def sub(self, st):
        c = _Context(st, self.tag, self.pool, self.info)
        c.run, c.stats, c.phase = self.run, self.stats, self.phase
        return c


# ---- shared memory, simulated (shm on one node, hierarchical across) --------------
# The shm pipeline (algorithms/shm.py) runs unchanged; what it asks of MPI
# is stood in for: the node layout (node.NodeInfo), the window
# (shmwindow.ShmWindow: phantom slots, no signature check: every simulated
# rank makes the same call) and its flag sync (a SimGrid barrier of the
# node's ranks after ``sync_s`` of the rank's time). Copies cost
# ``copy_Bps``, the k-input reduction ``reduce_Bps`` per byte combined, on
# the rank's host like every reduction here. Not modelled: a node's ranks
# sharing its memory bandwidth (nor for the network algorithms' reductions).

class _SubComm(counting._SimComm):
    """A simulated sub-communicator (hierarchical's cross communicator):
    ``members`` are its ranks' world ranks, in its rank order."""

    def __init__(self, rank, members):
        super().__init__(rank, len(members))
        self.members = tuple(members)
        self.profile = None  # no tuning profile: auto's fixed rules (select.py)


class _Node:
    """node.NodeInfo's facts for one rank of the simulated layout (rank r on
    node r // ppn; the last node may hold fewer ranks)."""

    def __init__(self, rank, p, ppn):
        self.nodes = -(-p // ppn)
        self.node = rank // ppn
        self.node_ranks = [list(range(m * ppn, min(p, (m + 1) * ppn))) for m in range(self.nodes)]
        mine = self.node_ranks[self.node]
        self.local_rank, self.local_size = rank - mine[0], len(mine)
        self.ranks_per_node = len(self.node_ranks[0])
        self.uniform = len(self.node_ranks[-1]) == self.ranks_per_node
        self.contiguous = True
        self._rank, self._cross = rank, None

    def cross_state(self):
        if self._cross is None:  # as NodeInfo: Split(color=local rank, key=node)
            members = [rs[self.local_rank] for rs in self.node_ranks if len(rs) > self.local_rank]
            self._cross = _SubComm(members.index(self._rank), members)
        return self._cross


class _NodeSync:
    """One shared-memory sync point: every rank of the node reaches it."""

    what = "a shared-memory sync"

    def __init__(self, run, barrier):
        self.run, self.barrier = run, barrier

    def post(self):
        pass

    def wait_simulated(self):
        if self.run.plat.sync_s:
            self.run.sg.this_actor.sleep_for(self.run.plat.sync_s)
        self.barrier.wait()


class _Window:
    """shmwindow.ShmWindow's face to the shm pipeline, with phantom slots of
    the largest size (so the window never grows)."""

    sync_mode = "flags"

    def __init__(self, run, barrier, k):
        from .shmwindow import MAX_SLOT_BYTES

        self.run, self.barrier, self.k = run, barrier, k
        self.slot_bytes, self.turn, self.checks = MAX_SLOT_BYTES, 0, 0
        self._views = {}

    def slots(self, dtype):
        got = self._views.get(dtype)
        if got is None:
            n = self.slot_bytes // np.dtype(dtype).itemsize
            got = self._views[dtype] = [[phantom(n, dtype) for _ in range(self.k)] for _ in (0, 1)]
        return got

    def publish(self, sig):
        pass

    def verify(self, sig, info, ctx):
        pass

    def sync_op(self, ctx):
        return ctx.custom(_NodeSync(self.run, self.barrier))


class _TimedReduction:
    """A Reduction that costs simulated time instead of computing."""

    def __init__(self, run, red_op, dtype, stats, seconds_per_byte):
        self._run, self._stats, self._spb = run, stats, seconds_per_byte
        self.op, self.dtype = red_op, dtype

    def _spend(self, nbytes):
        self._stats.bytes_reduced += nbytes
        self._run.spend(nbytes * self._spb)

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
        self.spaces: Dict[tuple, str] = {}  # sub-communicator (its world ranks) -> mailbox prefix
        self.stats = [Stats() for _ in range(p)]
        self.error: Optional[BaseException] = None

    def mailbox(self, members, src, dst):
        # One mailbox per (communicator, sender, receiver), as MPI matches
        # per communicator; src and dst are the communicator's ranks.
        key = (members, src, dst)  # members: a tuple, or None for the world
        mb = self.mailboxes.get(key)
        if mb is None:
            space = "" if members is None else self.spaces.setdefault(members, f"c{len(self.spaces)}:")
            mb = self.mailboxes[key] = self.sg.Mailbox.by_name(f"{space}{src}>{dst}")
        return mb

    def spend(self, seconds):
        """``seconds`` of this rank's time on its host: flops at the host's
        speed, so ranks sharing a host share its cores."""
        if seconds > 0:
            host = self.sg.this_actor.get_host()
            self.sg.this_actor.execute(seconds * host.speed)

    def post(self, op):
        sg, ctx = self.sg, op.ctx
        if op.kind == CUSTOM:  # a node sync: nothing to start (its flag store is in sync_s)
            op.req = op.custom
            return
        nbytes = op.buf.nbytes
        if op.kind == SEND:
            ctx.stats.messages += 1
            ctx.stats.bytes_sent += nbytes
            if self.plat.op_overhead_s:
                sg.this_actor.sleep_for(self.plat.op_overhead_s)
            mb = self.mailbox(ctx.members, ctx.rank, op.peer)
            if nbytes <= self.plat.eager_bytes:
                mb.put_init(nbytes, nbytes).detach()  # detach() starts it; nobody waits
                op.req = True
            else:
                op.req = mb.put_async(nbytes, nbytes)
        elif op.kind == RECV:
            op.req = self.mailbox(ctx.members, op.peer, ctx.rank).get_async()  # (comm, payload getter)
        else:  # pragma: no cover - _Context refuses the other kinds before
            raise Unsimulable("only point-to-point operations are simulated")

    def wait(self, ops):
        comms, syncs = [], []
        for op in ops:
            if op.req is None:
                self.post(op)
            if op.kind == CUSTOM:
                if op.req is not True:
                    syncs.append(op.custom)
            elif op.req is not True:
                comms.append(op.req[0] if op.kind == RECV else op.req)
        if comms:
            self.sg.Comm.wait_all(comms)
        for sync in syncs:
            sync.wait_simulated()
        for op in ops:
            if op.kind == CUSTOM:
                op.req = True
            elif op.kind == RECV and op.req is not True:
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
        raise AssertionError(collective)  # run() checked it

    return args


class Result(NamedTuple):
    time_s: float  # the slowest rank's finish time, simulated
    stats: list  # per-rank Stats
    wall_s: float  # how long the simulation took


def run(platform, collective: str, algorithm: str, p: int, nbytes: int, *, ppn: int = 1,
        dtype: str = "float32", op: str = "sum", knobs: Optional[dict] = None,
        timeout_s: Optional[float] = None) -> Result:
    """Simulate one call of ``collective`` by ``algorithm`` on ``p`` ranks,
    ``ppn`` per host, of ``nbytes`` bytes (rounded down to whole elements);
    returns the predicted time and the per-rank counts.

    Each call runs in a fresh process-wide SimGrid engine: SimGrid allows
    one engine per process, so ``run`` starts a new Python process that
    simulates (``_in_child``); past ``timeout_s`` it is killed and
    ``TimeoutError`` raised.
    """
    plat = platform if isinstance(platform, Platform) else load_platform(platform)
    if p < 1 or ppn < 1 or nbytes < 0:
        raise ValueError(f"mpicoll: need p >= 1, ppn >= 1, nbytes >= 0; got p={p}, ppn={ppn}, nbytes={nbytes}")
    if collective not in COLLECTIVES:
        raise ValueError(f"mpicoll: the SimGrid driver does not run {collective!r} (runs: {', '.join(COLLECTIVES)})")
    nodes = -(-p // ppn)
    if nodes > plat.hosts:
        raise ValueError(f"mpicoll: p={p} at {ppn} per node needs {nodes} nodes; {plat.path} has {plat.hosts}")
    from . import dtypes, ops
    from .algorithms import get

    alg = get(collective, algorithm)  # raises ValueError for an unknown name, before any work
    if alg.native is not None:
        raise Unsimulable(f"{collective}/{algorithm} is the MPI library's own call; "
                          "the SimGrid driver runs mpicoll's schedules only (SMPI runs the library's)")
    if dtype not in dtypes.BY_NAME:
        raise ValueError(f"mpicoll: unknown dtype {dtype!r}; known: {', '.join(sorted(dtypes.BY_NAME))}")
    dt = dtypes.BY_NAME[dtype]
    reduction = ops.resolve(op)  # raises ValueError for an unknown op
    if collective in ("allreduce", "reduce_scatter", "reduce"):
        itemsize = np.dtype(dt.storage).itemsize
        storage = dt.storage
    else:
        itemsize, storage = 1, np.uint8  # data-movement collectives: bytes
    n = nbytes // itemsize
    knobs = dict(knobs or {})
    if algorithm in SHARED_MEMORY:
        knobs = _shared_memory_knobs(plat, p, ppn, n, itemsize, dt, reduction, knobs)
    return _in_child(_simulate, plat, alg.name, collective, p, ppn, n, storage, dt, reduction, knobs,
                     timeout_s=timeout_s)


SHARED_MEMORY = ("shm", "hierarchical")


def _shared_memory_knobs(plat, p, ppn, n, itemsize, dt, reduction, knobs) -> dict:
    """Checks for shm/hierarchical, and the cross-node algorithm decided as
    hierarchical's ``prepare`` decides it (auto's choice for the cross
    communicator and one chunk's slice) when the knobs do not name one."""
    from .algorithms import hierarchical, shm

    if plat.copy_Bps is None or plat.sync_s is None:
        raise ValueError(f"mpicoll: {plat.path} lacks mpicoll.copy_Bps or mpicoll.sync_s "
                         "(the shared-memory algorithms' copy rate and sync cost)")
    if knobs.get("sync") not in (None, "flags"):
        raise Unsimulable(f"shm sync={knobs['sync']!r} (MPI_Barrier on the node) is not simulated; flags are")
    shm.check_cross(knobs.get("cross"))
    st = counting._SimComm(0, p)
    st.extra["node"] = info = _Node(0, p, ppn)
    if info.nodes > 1 and knobs.get("cross") is None:
        choice = hierarchical.cross_choice(st, n, itemsize, dt, reduction,
                                           knobs.get("chunk_bytes", shm.CHUNK_BYTES))
        if choice.name == "mpi":
            raise Unsimulable(f"hierarchical across {info.nodes} nodes: auto's cross-node algorithm here is "
                              "MPI_Allreduce (the library's own call); give cross=ring, rabenseifner, ... to "
                              "simulate one of mpicoll's")
        knobs["cross"] = choice.name
    return knobs


def _simulate(plat, name, collective, p, ppn, n, storage, dt, reduction, knobs):
    from .algorithms import get

    alg = get(collective, name)  # by name: a registry entry holds functions that do not pickle
    sg = import_simgrid()
    t0 = time.perf_counter()
    engine = sg.Engine(["mpicoll", "--log=root.thresh:critical", "--cfg=contexts/factory:thread"])
    engine.load_platform(plat.path)
    hosts = sorted(engine.all_hosts, key=lambda h: _host_order(h.name))
    r = _Run(sg, plat, p, ppn)
    spb = 1.0 / plat.reduce_Bps
    args = _schedule_args(collective, p, n, storage,
                          lambda rank: _TimedReduction(r, reduction, dt, r.stats[rank], spb))
    shared = alg.name in SHARED_MEMORY
    barriers = [sg.Barrier(len(ranks)) for ranks in _Node(0, p, ppn).node_ranks] if shared else None
    for rank in range(p):
        st = counting._SimComm(rank, p)
        if shared:  # what node.node_info and shmwindow.window would make (collectively, under MPI)
            from .shmwindow import SYNC, window_key

            st.extra["node"] = info = _Node(rank, p, ppn)
            st.extra[window_key(SYNC)] = _Window(r, barriers[info.node], info.local_size)
        ctx = _Context(st, 0, {}, (collective, alg.name, n, 0))
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


# The environment variables by which an MPI launcher tells a process which
# rank of which job it is. The simulation process must not see them: it
# imports mpicoll (and so mpi4py), and an MPI_Init there would join the
# parent's job as a second copy of the parent's rank.
_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIR_", "PRTE_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")


def _child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env["MPI4PY_RC_INITIALIZE"] = "0"  # the child never calls MPI
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where this mpicoll imports from
    env["PYTHONPATH"] = os.pathsep.join([root] + [x for x in env.get("PYTHONPATH", "").split(os.pathsep) if x])
    return env


def _in_child(fn, *args, timeout_s: Optional[float] = None):
    """``fn(*args)`` in a new Python process (SimGrid: one engine per
    process, and its actor threads do not outlive a run); its result or
    exception comes back pickled.

    A new interpreter, not ``os.fork()``: the caller may be an MPI program
    with threads (mpicoll's progress thread, pytest-xdist's, UCX's), and a
    forked child of such a process can block for ever on a lock another
    thread held at the fork (seen: UCX's memory hooks, on the first malloc
    of a SimGrid actor thread). The child starts clean, without MPI. Past
    ``timeout_s`` seconds it is killed and ``TimeoutError`` raised.
    """
    import pickle
    import subprocess

    cmd = [sys.executable, "-c", "from mpicoll import simulate; simulate._child_main()"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_child_env(), close_fds=True)
    try:
        request = pickle.dumps(list(sys.path)) + pickle.dumps((fn, args))  # the path first: fn's module imports
        data, err = proc.communicate(request, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise TimeoutError(f"mpicoll: the simulation did not finish in {timeout_s} s; it was killed"
                           + _tail(err)) from None
    except BaseException:  # KeyboardInterrupt and the like: no orphan left simulating
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0 or not data:
        raise RuntimeError(f"mpicoll: the simulation process died (exit status {proc.returncode})" + _tail(err))
    ok, value = pickle.loads(data)
    if not ok:
        raise value
    return value


def _tail(err: bytes, lines: int = 20) -> str:
    text = err.decode(errors="replace").strip().splitlines()[-lines:]
    return ("; its last output:\n" + "\n".join(text)) if text else ""


def _child_main() -> None:  # pragma: no cover - runs in the simulation process
    """The simulation process: the caller's ``sys.path`` and ``(fn, args)``
    pickled on stdin; ``(True, result)`` or ``(False, exception)`` pickled
    on stdout. What SimGrid or the schedule prints goes to stderr, so
    stdout carries only the answer."""
    import pickle

    answer = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    request = sys.stdin.buffer
    sys.path[:] = pickle.load(request)  # the caller's, so that fn's module imports here too
    fn, args = pickle.load(request)
    try:
        out = (True, fn(*args))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        out = (False, exc)
    try:
        data = pickle.dumps(out)
    except Exception as exc:  # an exception that does not pickle
        data = pickle.dumps((False, RuntimeError(f"{type(out[1]).__name__}: {out[1]} ({exc})")))
    answer.write(data)
    answer.flush()
    os._exit(0)  # SimGrid's threads and atexit handlers have nothing left to do


# ---- the study: a table of algorithms x (p, size) --------------------------------

def estimated_messages(algorithm: str, p: int, nbytes: int, itemsize: int = 4) -> Optional[int]:
    """Messages of the whole call (p x the busiest rank's, from the cost
    model), or None when the model does not price ``algorithm``."""
    from . import model

    if algorithm not in model.P2P:
        return None
    return p * model.terms(algorithm, p, nbytes, itemsize).messages


def auto_choice(p: int, nbytes: int, ppn: int, dtype: str = "float32", op: str = "sum", profile=None,
                available=None):
    """What ``algorithm="auto"`` runs for this call on ``p`` ranks, ``ppn``
    per node (mpicoll.select, the same pure function the plan layer asks);
    ``available`` as select.allreduce's."""
    from . import select
    from .dtypes import BY_NAME
    from .mpitypes import reduces_natively
    from .ops import resolve

    nodes = -(-p // ppn)
    return select.allreduce(p, nbytes, op, dtype, native_dtype=reduces_natively(BY_NAME[dtype], resolve(op)),
                            profile=profile, ranks_per_node=min(ppn, p), nodes=nodes, available=available)


def load_native(files) -> Dict[tuple, float]:
    """SMPI anchor results (sim/run_anchor.py JSON): (selector, collective,
    p, bytes) -> seconds per call."""
    out = {}
    for file in files or ():
        with open(file) as f:
            d = json.load(f)
        for row in d["rows"]:
            out[(d["selector"], row["collective"], row["p"], row["bytes"])] = row["time_s"]
    return out


def algorithm_spec(spec: str, ppn: int) -> tuple:
    """``"name"`` or ``"name:knob=value;..."`` (integers where they parse,
    e.g. ``knomial:radix=8``) -> (name, knobs). The cascade gets the simulated
    layout (``ppn``) unless the spec gives one: in the driver it cannot
    find the node layout itself (no MPI communicator to ask)."""
    name, _, rest = spec.partition(":")
    knobs = {}
    for item in filter(None, rest.split(";")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"mpicoll: algorithm spec {spec!r}: expected name:knob=value")
        try:
            knobs[key.strip()] = int(value)
        except ValueError:
            knobs[key.strip()] = value.strip()
    if name == "cascade":
        knobs.setdefault("ppn", ppn)
    return name, knobs


def study(plat: Platform, collective: str, algorithms: List[str], ps: List[int], ppn: int, sizes: List[int], *,
          dtype="float32", op="sum", max_messages=300_000, jobs=1, native=None, log=None,
          timeout_s: Optional[float] = None) -> List[dict]:
    """Simulate every algorithm at every (p, size): one row per cell, with
    ``time_s`` None and ``skipped`` saying why when it was not simulated
    (``Unsimulable``, over ``max_messages``, or past ``timeout_s`` seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    cells = [(p, n, a) for p in ps for n in sizes for a in algorithms]
    specs = {a: algorithm_spec(a, ppn) for a in algorithms}  # bad specs raise before any run

    def one(cell):
        p, n, a = cell
        name, knobs = specs[a]
        row = {"collective": collective, "algorithm": a, "p": p, "ppn": ppn, "bytes": n, "time_s": None,
               "wall_s": 0.0, "skipped": None}
        est = estimated_messages(name, p, n) if collective == "allreduce" and not knobs else None
        if est is not None and est > max_messages:
            row["skipped"] = f"{est} messages > --max-messages {max_messages}"
        else:
            try:
                r = run(plat, collective, name, p, n, ppn=ppn, dtype=dtype, op=op, knobs=knobs,
                        timeout_s=timeout_s)
            except (Unsimulable, TimeoutError) as exc:
                row["skipped"] = str(exc)
            else:
                row.update(time_s=r.time_s, wall_s=r.wall_s, messages=sum(s.messages for s in r.stats),
                           bytes_sent=sum(s.bytes_sent for s in r.stats))
        if log is not None:
            t = "-" if row["time_s"] is None else f"{row['time_s'] * 1e6:.1f} us"
            print(f"  p={p:<5} {n:>10} B  {a:<20} {t:>14}  (wall {row['wall_s']:.1f} s)", file=log, flush=True)
        return row

    with ThreadPoolExecutor(max(1, jobs)) as pool:  # each run is its own SimGrid process
        rows = list(pool.map(one, cells))
    return rows


def native_priced(plat: Platform, smpi_s: Optional[float], p: int, nbytes: int) -> Optional[float]:
    """The MPI library's all-reduce as mpicoll's ``mpi`` algorithm would
    cost: SMPI's simulated time, plus the reductions SMPI does not price
    (the bytes MPICH's algorithm combines, ``model.terms``, at the
    platform's kernel rate), plus mpicoll's per-call cost."""
    from . import model

    if smpi_s is None:
        return None
    combined = model.terms(model.mpich_choice(p, nbytes), p, nbytes).combined if p > 1 else 0
    return smpi_s + combined / plat.reduce_Bps + plat.call_overhead_s


def _no_shared_memory(name: str) -> bool:
    from .algorithms import has

    return has("allreduce", name) and name not in ("shm", "hierarchical")


def summarize(rows: List[dict], plat: Platform, ppn: int, native: Dict[tuple, float], dtype="float32",
              op="sum") -> List[dict]:
    """Per (p, size): the best simulated algorithm, the native figures, and
    auto's choice with its regret (auto's time / best - 1). The MPI
    library's own collective (``mpi``) is priced by ``native_priced`` from
    SMPI's MPICH selector; hierarchical is priced when the study ran it
    plain (its cross algorithm decided as auto decides it) and that
    cross is one of mpicoll's, otherwise auto's time is unknown."""
    out = []
    keys = sorted({(r["p"], r["bytes"]) for r in rows})
    for p, n in keys:
        times = {r["algorithm"]: r["time_s"] for r in rows if (r["p"], r["bytes"]) == (p, n)
                 and r["time_s"] is not None}
        nat = {sel: native.get((sel, "allreduce", p, n)) for sel in ("mpich", "ompi")}
        cand = dict(times)
        mpi = native_priced(plat, nat["mpich"], p, n)
        if mpi is not None:
            cand["mpi"] = mpi
        best = min(cand, key=cand.get) if cand else None
        row = {"p": p, "bytes": n, "times": times, "native": nat, "mpi_priced": mpi, "best": best,
               "best_s": cand.get(best)}
        # auto as the plan layer decides for this layout, and as it decides
        # for the same layout where no shared-memory window is available
        # (shm/hierarchical out of the picture: what both drivers can price).
        # Not auto's one-rank-per-node decision: priced on these runs, where
        # ranks share their node's link, that would mix two layouts.
        for key, avail in (("auto", None), ("auto_no_shm", _no_shared_memory)):
            choice = auto_choice(p, n, ppn, dtype, op, available=avail)
            t = cand.get(choice.name)
            row[key], row[key + "_s"], row[key + "_reason"] = choice.name, t, choice.reason
            row["regret" if key == "auto" else "regret_no_shm"] = \
                None if t is None or best is None else t / cand[best] - 1
        out.append(row)
    return out


def profile_from(summary: List[dict], plat: Platform, ppn: int):
    """A tuning profile whose rules pick each (p, size)'s simulated best: a
    rule covers the process counts above the previous simulated p up to this
    one (the largest: and beyond), and sizes from this one up to the next
    (the smallest simulated size is where the rules start: smaller messages
    are left to select's defaults).

    When the simulated p include powers of two and other counts, the two are
    written as separate series (rules of ``p_kind`` "power_of_two" and
    "other"), each covering p from 2 up on its own: on 1 Gbit/s the winner
    depends on whether p is a power of two (Rabenseifner's fold costs it
    1.8-1.9x at other p, docs/scale.md), so p = 56 must take p = 48's pick,
    not p = 64's. With one kind only, one series of kind "any", as before."""
    from . import profile

    def plain_best(s):
        # A profile rule names an algorithm, not knob settings: variants
        # simulated with knobs ("knomial:radix=8") are left out of its pick.
        cand = {a: t for a, t in s["times"].items() if ":" not in a}
        if s["mpi_priced"] is not None:
            cand["mpi"] = s["mpi_priced"]
        return min(cand.items(), key=lambda kv: kv[1]) if cand else None

    ps = sorted({s["p"] for s in summary})
    pow2 = [p for p in ps if profile.is_power_of_two(p)]
    other = [p for p in ps if not profile.is_power_of_two(p)]
    series = [("power_of_two", pow2), ("other", other)] if pow2 and other else [("any", ps)]
    rules = []
    for kind, kps in series:
        for i, p in enumerate(kps):
            rows = sorted(((s, plain_best(s)) for s in summary if s["p"] == p and plain_best(s)),
                          key=lambda sb: sb[0]["bytes"])
            for j, (s, (name, t)) in enumerate(rows):
                rules.append(profile.Rule(
                    p_min=kps[i - 1] + 1 if i else 2, p_max=None if i == len(kps) - 1 else p,
                    # from the smallest simulated size, not from 0 B: below it the
                    # ranking changes (latency terms; at 1 KiB the ring was 7-13x
                    # recursive doubling's time where 1 MiB picked the ring), and
                    # select's defaults decide what nobody simulated
                    bytes_min=s["bytes"],
                    bytes_max=rows[j + 1][0]["bytes"] if j + 1 < len(rows) else None,
                    algorithm=name, source="simulated", p_kind=kind,
                    note=f"simulated by SimGrid on {os.path.basename(plat.path)} at p={p}, {ppn} per node, "
                         f"{s['bytes']} B: {t * 1e6:.1f} us"))
    meta = {"host": f"simulated: {plat.path}", "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "simulated_p": ps, "ppn": ppn, "tool": "python -m mpicoll.simulate"}
    return profile.Profile(rules, meta=meta)


def _us(t):
    return "-" if t is None else f"{t * 1e6:.1f}"


def print_table(summary, algorithms, out=sys.stdout):
    natives = [sel for sel in ("mpich", "ompi") if any(s["native"][sel] is not None for s in summary)]
    heads = algorithms + [f"native:{sel}" for sel in natives]
    w = max(12, *(len(h) + 1 for h in heads))
    print(f"{'p':>5} {'bytes':>10} " + " ".join(f"{h:>{w}}" for h in heads)
          + f" {'best':>20} {'auto':>14} {'auto regret':>12}", file=out)
    for s in summary:
        cells = [_us(s["times"].get(a)) for a in algorithms] + [_us(s["native"][sel]) for sel in natives]
        regret = "?" if s["regret"] is None else f"{s['regret'] * 100:.0f}%"
        print(f"{s['p']:>5} {s['bytes']:>10} " + " ".join(f"{c:>{w}}" for c in cells)
              + f" {s['best'] or '-':>20} {s['auto']:>14} {regret:>12}", file=out)


def main(argv=None) -> int:
    from .algorithms import names
    from .bench.timing import parse_sizes

    ap = argparse.ArgumentParser(prog="python -m mpicoll.simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--platform", required=True, help="SimGrid platform file (platforms/*.xml)")
    ap.add_argument("--p", default="64,256,1024", help="comma-separated process counts")
    ap.add_argument("--ppn", type=int, default=8, help="ranks per node (rank r on node r // ppn)")
    ap.add_argument("--sizes", default="8:64M", help="comma list (8,4K,16M) or range MIN:MAX[:FACTOR]")
    ap.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    ap.add_argument("--algorithms", help="comma list, each NAME or NAME:knob=value;... (knomial:radix=8, "
                         "hierarchical:cross=ring); default: every registered one the driver can run, less "
                         "hetero_ring (without weights it is the ring) and shm (hierarchical is shm on one node)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--op", default="sum")
    ap.add_argument("--native", nargs="*", help="SMPI anchor results (sim/run_anchor.py --json) to show beside")
    ap.add_argument("--max-messages", type=int, default=300_000,
                    help="skip a cell whose call sends more messages in all (the cost model's count): "
                         "the simulation runs 1200-2700 messages per second here")
    ap.add_argument("--jobs", type=int, default=1, help="simulations at once (each one process)")
    ap.add_argument("--json", help="write every cell and the summary as JSON")
    ap.add_argument("--profile-out", help="write a tuning profile of the simulated best (all-reduce)")
    ap.add_argument("--quiet", action="store_true", help="no per-cell progress lines")
    ap.add_argument("--timeout", type=float, help="seconds per cell; a cell past it is killed and reported skipped")
    a = ap.parse_args(argv)

    plat = load_platform(a.platform)
    ps = [int(x) for x in a.p.split(",") if x.strip()]
    sizes = parse_sizes(a.sizes)
    algorithms = a.algorithms.split(",") if a.algorithms else \
        [x for x in names(a.collective)[1:] if x not in ("mpi", "shm", "hetero_ring")]
    t0 = time.perf_counter()
    rows = study(plat, a.collective, algorithms, ps, a.ppn, sizes, dtype=a.dtype, op=a.op,
                 max_messages=a.max_messages, jobs=a.jobs, log=None if a.quiet else sys.stderr,
                 timeout_s=a.timeout)
    wall = time.perf_counter() - t0
    native = load_native(a.native)
    print(f"{a.collective}, {a.dtype} {a.op}, on {a.platform} at {a.ppn} ranks per node; "
          "simulated time per call in us ('-': not simulated)")
    summary = summarize(rows, plat, a.ppn, native, a.dtype, a.op) if a.collective == "allreduce" else None
    if summary is not None:
        print_table(summary, algorithms)
    else:
        for r in rows:
            print(f"{r['p']:>5} {r['bytes']:>10} {r['algorithm']:<20} {_us(r['time_s']):>12}")
    skipped = sorted({(r["algorithm"], r["skipped"]) for r in rows if r["skipped"]})
    for alg, why in skipped[:10]:
        print(f"not simulated: {alg}: {why}")
    print(f"study wall time: {wall:.1f} s ({len(rows)} cells, {a.jobs} at once)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"platform": a.platform, "ppn": a.ppn, "collective": a.collective, "dtype": a.dtype,
                       "op": a.op, "wall_s": wall, "rows": rows, "summary": summary}, f, indent=1)
    if a.profile_out:
        if summary is None:
            ap.error("--profile-out needs --collective allreduce")
        from . import profile

        profile.save(profile_from(summary, plat, a.ppn), a.profile_out)
        print(f"wrote tuning profile {a.profile_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
