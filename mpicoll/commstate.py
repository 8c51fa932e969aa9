"""Per-communicator state, cached on the communicator itself.

The first mpicoll call on a communicator duplicates it (a collective call,
like every mpicoll call) and keeps the duplicate, together with scratch
buffers and anything else an algorithm wants to remember, in an MPI
attribute on the user's communicator. That is how MPI libraries cache their
own collective state:

* mpicoll's point-to-point messages travel on the duplicate, so they can
  never match the user's own sends and receives on the same communicator;
* the state lives exactly as long as the communicator: MPI calls the
  attribute's delete callback when the user frees it, and we free the
  duplicate there.

One duplicate serves every call, blocking, nonblocking and persistent:
each call takes the next number of the communicator's sequence
(``next_seq``) and its messages carry a tag made from it. Every rank makes
collective calls in the same order (MPI's rule), so the ranks agree on the
tag, and calls in flight at the same time never match each other's
messages.

Creating the state is the one moment when mpicoll talks to the other ranks
before anything else (the Dup is collective anyway), so the facts every rank
must agree on are settled there, in one small allgather (with a deadline:
an all-to-all on the user's communicator before the Idup, which also tells
who arrived; see ``_handshake``):

* the tuning profile: each rank hashes the profile it would use; if the
  hashes differ (a file missing or different on some host), rank 0's
  profile is broadcast and used by all, so "auto" picks the same algorithm
  everywhere;
* the node layout for the decision (how many ranks share a host), from a
  hash of each rank's processor name (or ``MPICOLL_FAKE_NODE_SIZE``). The
  node and cross communicators themselves (``mpicoll.node``) are only made
  when a shared-memory or hierarchical algorithm runs.
"""
from __future__ import annotations

import itertools
import json
import os
import threading
import time
import zlib

import numpy as np
from mpi4py import MPI

from . import profile as _profile
from .errors import CollectiveTimeout
from .plancache import PlanCache
from .poll import poll

_keyval = None
# Fast path in front of the attribute: communicator handle -> state. An
# MPI_Comm_get_attr through mpi4py costs about 1 us, a dict lookup a tenth of
# that, and small all-reduces are latency-bound. The entry is removed in the
# attribute's delete callback, so a handle the MPI library reuses for a new
# communicator can never find a stale state.
_by_handle = {}


def _delete_state(comm, keyval, state):
    _by_handle.pop(state.handle, None)
    state.free()


class CommState:
    """What mpicoll keeps per communicator.

    ``comm`` is the private duplicate; ``rank`` and ``size`` are cached
    because mpi4py's ``Get_rank()`` costs a call into MPI each time.
    """

    def __init__(self, user_comm: MPI.Intracomm, deadline=None, collective="", private=False):
        self.handle = user_comm.handle
        rank, size = user_comm.Get_rank(), user_comm.Get_size()
        prof, env, mine = _facts(rank, size)
        # A plain Intracomm even when the user's is a subclass (mpicoll.Comm,
        # whose Dup returns its own class): our point-to-point and native
        # calls must reach MPI, not an override that calls back into mpicoll.
        if private:
            # Already mpicoll's own (split from a private duplicate, like the
            # cross communicator of mpicoll.node): nothing else can send on
            # it, so it needs no duplicate; the state owns it from now on.
            self.comm = MPI.Intracomm(user_comm)
            table = _exchange(self.comm, mine, size)
        elif deadline is None:
            self.comm: MPI.Intracomm = MPI.Intracomm(user_comm.Dup())
            table = _exchange(self.comm, mine, size)
        else:
            # The first collective steps of a program's first call: if a rank
            # skipped that call, a blocking step would wait forever, before
            # any deadline-aware code runs. The facts go first, in a form
            # that also tells who arrived (see _handshake); then the Idup.
            table = _handshake(user_comm, mine, rank, size, deadline, collective)
            dup, req = MPI.Intracomm.Idup(user_comm)
            wait_until(req, deadline, rank, collective, "creating mpicoll's state: MPI_Comm_idup", buffers=(dup,))
            self.comm = MPI.Intracomm(dup)  # the handle is valid only once the request completed
        self.rank: int = rank
        self.size: int = size
        self.pool = {}  # scratch of blocking calls (schedule.Context.scratch), reused call after call
        self.idle_pools = []  # scratch dictionaries of completed nonblocking calls, for the next ones
        self.extra = {}  # per-algorithm cached state (e.g. node communicators)
        self.plans = PlanCache()  # kept plans of this communicator's calls, by signature (plancache.py)
        # The call numbers: next() of an itertools.count is one C call under
        # the GIL, so two threads can never take the same number (a lock
        # around a read and a write cost ~0.2 us of every short call).
        # ``seq`` is the next number, for messages.
        self._numbers = itertools.count()
        self.seq = 0
        # Guards freeing the duplicate: the user's Free and the last pending
        # request's completion may come from different threads.
        self.lock = threading.Lock()
        # One entry per nonblocking request outstanding on the duplicate
        # (hold/release): list.append and list.pop are single C calls under
        # the GIL, so counting needs no lock (~0.2 us of every nonblocking
        # call); only a freed communicator's last release takes it.
        self._live = []
        self.freed = False  # the user's communicator was freed (the duplicate may outlive it, see free)
        self._released = False  # the duplicate and the extras are freed
        # Held while a thread runs or starts a collective on this communicator
        # (runtime.enter): a second thread arriving meanwhile gets a clear error
        # instead of sharing the scratch and the call sequence (wrong sums).
        # (csrc/native.c's Lock(gate=True) where the module is built and on: a lock the
        # C fast paths take in one step; else a threading.Lock)
        self.busy = _new_gate()
        # MPI guarantees tags up to 32767; tag 0 stays free for nothing in particular.
        self.tag_span = max(1024, min(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767), 1 << 20) - 1)
        try:
            self.profile, self.profile_note, self.ranks_per_node, self.nodes = _agree(
                self.comm, table, prof, env)
        except BaseException:
            # Not cached: free the duplicate (local).
            self.comm.Free()
            raise

    def next_seq(self):
        """(sequence number, tag) of the next collective call on this
        communicator. Every call takes its number here, atomically (or
        in C from the same counter, with the same tag formula: a gated
        kept call, csrc/native.c kept_run)."""
        seq = next(self._numbers)
        self.seq = seq + 1  # (callers hold busy: nobody else writes it meanwhile)
        return seq, 1 + seq % self.tag_span

    @property
    def pending(self) -> int:
        """Nonblocking requests outstanding on the duplicate."""
        return len(self._live)

    def hold(self) -> None:
        """A nonblocking request starts on the duplicate (engine.start)."""
        self._live.append(None)

    def release(self) -> None:
        """That request completed: the last one of a freed communicator
        frees the duplicate."""
        self._live.pop()
        if self.freed:  # (set under the lock before free() counts: see free)
            with self.lock:
                now = not self._live and not self._released
                self._released = self._released or now
            if now:
                self._release()

    def free(self) -> None:
        """The user freed the communicator (MPI calls this from the
        attribute's delete callback). MPI lets a program free a communicator
        with nonblocking collectives pending, and they still complete: the
        duplicate they run on is freed when the last of them completes
        (release), not now."""
        self.plans.clear()  # kept decisions die with the user's communicator
        with self.lock:
            self.freed = True
            now = not self._live and not self._released
            self._released = self._released or now
        if now:
            self._release()

    # Idle scratch dictionaries kept for the next nonblocking calls.
    IDLE_POOLS = 4

    def borrow_pool(self):
        """(pool, give_back) for one nonblocking call: the scratch dictionary
        of a completed call (a fresh 16 MiB temporary costs about as much in
        page faults as reducing it), or a new one; ``give_back()`` files it
        for the next call once this one has completed."""
        idle = self.idle_pools
        pool = idle.pop() if idle else {}

        def give_back():
            if len(idle) < self.IDLE_POOLS:
                idle.append(pool)
        return pool, give_back

    def _release(self) -> None:
        self.pool.clear()
        self.idle_pools.clear()
        for v in self.extra.values():
            free = getattr(v, "free", None)
            if free is not None:
                free()
        self.extra.clear()
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


ENV_FAKE_NODE_SIZE = "MPICOLL_FAKE_NODE_SIZE"
# Settings every rank must share: checked once per communicator, when its
# state is created.
AGREED_ENV = ("MPICOLL_ALGORITHM", "MPICOLL_CHECK", "MPICOLL_TIMEOUT", ENV_FAKE_NODE_SIZE)


def _digest(prof) -> int:
    if prof is None:
        return 0
    return zlib.crc32(json.dumps(prof.to_json(), sort_keys=True).encode()) or 1


# Buffers of nonblocking collectives abandoned at a deadline: the request
# stays pending (MPI cannot cancel a collective), and if the missing rank
# turns up later the MPI library still writes into them, so they must
# outlive the exception.
_abandoned = []


def _new_gate():
    """A communicator's one-thread gate (CommState.busy): the native
    module's Lock(gate=True), which its fast paths take without a Python call, or a
    threading.Lock; both are only ever acquired without blocking."""
    from . import native  # (imports engine, which imports this module)

    mod = native.module()
    return mod.Lock(gate=True) if mod is not None else threading.Lock()


def wait_until(req, deadline, rank, collective, step, seq=-1, buffers=(), missing=None) -> None:
    """Complete ``req`` by ``deadline`` (time.monotonic()), or raise
    CollectiveTimeout naming ``step``. Used for the few MPI collectives
    mpicoll makes outside a schedule (state creation, the pre-flight check).
    ``buffers`` are kept alive if the request is abandoned; ``missing()``,
    if given, is called at the deadline and returns the ranks this rank
    has not heard from."""

    def expired():
        _abandoned.append((req, buffers))
        coll = collective or "collective"
        peers = [] if missing is None else missing()
        waiting = (f"not heard from rank(s) {', '.join(map(str, peers))}" if peers
                   else "waiting for the other ranks (inside the MPI library's collective)")
        return CollectiveTimeout(
            f"mpicoll: {coll} timed out on rank {rank}: step {step}, {waiting}"
            f"{'' if seq < 0 else f', call #{seq} on this communicator'}. A rank "
            "probably skipped this call, called another collective, or died.", collective=coll, algorithm="-",
            step=step, peers=peers, nbytes=-1, seq=seq, rank=rank)

    # Once per communicator or per checked call: no need to spin first.
    poll(req.Test, deadline, expired, spin_s=0.0)


# First column of a rank's row in the state handshake: a row holds it (and
# the sender's rank in the second column) only once that rank's message
# arrived.
_MARK = 0x6D70636F6C6C0000


def _facts(rank: int, size: int):
    """(profile, agreed environment, this rank's row of the state table)."""
    prof = _profile.current()
    fake = os.environ.get(ENV_FAKE_NODE_SIZE)
    if fake:
        host = rank // max(1, int(fake))
    else:
        host = zlib.crc32(MPI.Get_processor_name().encode())
    env = tuple(os.environ.get(k) for k in AGREED_ENV)
    mine = np.array([_MARK, rank, host, _digest(prof), zlib.crc32(repr(env).encode())], np.int64)
    return prof, env, mine


def _exchange(comm, mine, size: int):
    """Every rank's row (a blocking allgather on ``comm``)."""
    table = np.empty((size, mine.size), np.int64)
    if size > 1:
        comm.Allgather(mine, table)
    else:
        table[0] = mine
    return table


def _handshake(user_comm, mine, rank: int, size: int, deadline, collective):
    """Every rank's row, by ``deadline``: the state creation of a call with a
    deadline.

    An all-to-all of the row on the user's communicator (a collective, so it
    can never match the program's own point-to-point messages) instead of an
    allgather: the MPI libraries run a small all-to-all-v as direct
    messages between each pair of ranks, written straight into the receive
    buffer, whereas their allgathers route rows through other ranks or a
    temporary buffer. So at the deadline the rows that hold their sender's
    mark name exactly the ranks that arrived (MPICH: up to 32 ranks, its
    batch of simultaneous messages; beyond that, and in any library that
    stages the data elsewhere, a superset of the missing ranks). Only the
    diagnosis reads the buffer before completion; a completed exchange is
    used as any collective's result. It costs p - 1 small messages per rank,
    once per communicator, and only when a deadline is set.
    """
    table = np.zeros((size, mine.size), np.int64)
    if size == 1:
        table[0] = mine
        return table
    w = mine.size
    send = np.tile(mine, size)
    spec = ([w] * size, [w * i for i in range(size)])
    # MPI's own call even when the user's communicator is an mpicoll.Comm.
    req = MPI.Intracomm.Ialltoallv(user_comm, [send, spec, MPI.INT64_T], [table, spec, MPI.INT64_T])

    def missing():
        return [r for r in range(size) if r != rank and not (table[r, 0] == _MARK and table[r, 1] == r)]

    wait_until(req, deadline, rank, collective, "creating mpicoll's state: handshake", buffers=(send, table),
               missing=missing)
    return table


def _agree(comm, table, prof, env):
    """(profile, note, ranks_per_node, nodes) from the state table,
    identical on every rank (collective only when the ranks disagree)."""
    if len(set(table[:, 4].tolist())) > 1:
        # Every rank sees the same table, so every rank raises here, together.
        envs = comm.allgather(env)
        from .errors import MismatchError

        bad = [k for i, k in enumerate(AGREED_ENV) if len({e[i] for e in envs}) > 1]
        groups = {}
        for r, e in enumerate(envs):
            groups.setdefault(tuple(e[AGREED_ENV.index(k)] for k in bad), []).append(r)
        raise MismatchError(f"mpicoll: {', '.join(bad)} must be the same on every rank (a rank that decides "
                            "differently leaves the others waiting): "
                            + "; ".join(f"{dict(zip(bad, v))} on ranks {rs}" for v, rs in groups.items()),
                            bad[0], groups)
    note = ""
    if len(set(table[:, 3].tolist())) > 1:
        # Some rank would decide differently: everyone takes rank 0's profile.
        data = comm.bcast(None if prof is None else (prof.to_json(), prof.path), root=0)
        prof = None if data is None else _profile.Profile.from_json(data[0], path=data[1])
        note = (f"tuning profiles differ between ranks ({len(set(table[:, 3].tolist()))} versions); "
                "using rank 0's")
    hosts = {}
    for h in table[:, 2].tolist():
        hosts[h] = hosts.get(h, 0) + 1
    return prof, note, max(hosts.values()), len(hosts)


def state(comm: MPI.Intracomm, timeout=None, collective="") -> CommState:
    """The cached state of ``comm``, created (collectively) on first use;
    with ``timeout`` (seconds), a creation that has not completed by then
    raises CollectiveTimeout on this rank (``collective`` names the call)."""
    st = _by_handle.get(comm.handle)
    if st is not None:
        return st
    global _keyval
    if _keyval is None:
        _keyval = MPI.Comm.Create_keyval(delete_fn=_delete_state)
    st = comm.Get_attr(_keyval)
    if st is None:
        st = CommState(comm, None if timeout is None else time.monotonic() + timeout, collective)
        comm.Set_attr(_keyval, st)
    _by_handle[st.handle] = st
    return st


def check_intracomm(comm) -> MPI.Intracomm:
    """``comm`` if it is a usable intra-communicator, else a clear error."""
    if comm is None:
        return MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"mpicoll: comm must be an mpi4py communicator, not {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError("mpicoll: comm is MPI.COMM_NULL")
    if not isinstance(comm, MPI.Intracomm) or comm.Is_inter():
        raise TypeError("mpicoll: an intra-communicator is required (inter-communicators are not supported)")
    return comm
