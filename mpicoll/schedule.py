"""Schedules: every algorithm written once, run by three drivers.

An algorithm is a *schedule*: a generator function that describes, for one
rank, which messages it sends and receives and which reductions it does
between them. It never calls MPI itself. It asks its context ``ctx`` for
operations and ``yield``s the list it needs completed before it can go on
(the shape of libnbc's and MPICH's transport schedules)::

    def allreduce(ctx, buf, red, src):
        tmp = ctx.scratch("rd", buf.nbytes, buf.dtype)
        peer = ctx.rank ^ 1
        yield [ctx.send(buf, peer), ctx.recv(tmp, peer)]   # swap, wait for both
        red.combine(buf, buf, tmp)

Operations:

* ``ctx.send(buf, peer)`` / ``ctx.recv(buf, peer)``: a point-to-point
  message of ``buf``'s bytes. A receive must bring exactly ``buf.nbytes``
  bytes, or the driver raises ``MismatchError`` (one check, for every
  algorithm).
* ``ctx.start(op, ...)`` posts operations at once without waiting for them
  (pipelines keep receives in flight); a later ``yield [op]`` waits.
* ``ctx.native(blocking, start)``: one call of the MPI library's own
  collective. The blocking driver calls ``blocking()`` (MPI_Allreduce...),
  the nonblocking driver ``start()``, which returns an MPI request
  (MPI_Iallreduce...).
* ``ctx.custom(op)``: anything else that completes later (the shared-memory
  flags): an object with ``post()``, ``test() -> bool`` and
  ``wait(deadline)``.

The drivers:

* blocking (``run``): waits for each yielded list at once (MPI_Waitall),
  then resumes the generator;
* nonblocking (``mpicoll.engine``): keeps the generator and its pending
  requests; the progress engine (test(), wait(), the progress thread)
  resumes it when they have completed;
* simulated (``simulate``): runs the schedules of all p ranks in one
  process without MPI, matching sends to receives, and counts per rank the
  messages and bytes sent and the bytes reduced - the figures the cost model
  (``mpicoll.model.terms``) predicts - while computing the real result.

Every operation of a collective call carries the call's tag, taken from the
communicator's sequence number (``CommState.next_seq``): every rank starts
collectives in the same order, so they agree on it, and calls in flight at
the same time never match each other's messages.

Deadlines: every driver wait can carry a deadline (``timeout=``); when it
passes, ``CollectiveTimeout`` names the collective, the algorithm, the
step, the peers whose messages had not completed, the bytes and the call's
sequence number.
"""
from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .errors import CollectiveTimeout, MismatchError, PeerFailure

BYTE = MPI.BYTE

SEND, RECV, NATIVE, CUSTOM = 0, 1, 2, 3
_KIND = {SEND: "send to", RECV: "receive from", NATIVE: "native", CUSTOM: "wait"}


class Op:
    """One operation of a schedule (see the module docstring)."""

    __slots__ = ("kind", "buf", "peer", "ctx", "req", "blocking", "start", "custom")

    def __init__(self, kind, ctx, buf=None, peer=-1):
        self.kind = kind
        self.ctx = ctx
        self.buf = buf
        self.peer = peer
        self.req = None  # MPI.Request once posted (SEND/RECV/NATIVE)

    def describe(self) -> str:
        if self.kind in (SEND, RECV):
            return f"{_KIND[self.kind]} rank {self.peer} ({self.buf.nbytes} B)"
        if self.kind == CUSTOM:
            return getattr(self.custom, "what", "shared-memory sync")
        return "the MPI library's collective"


class Context:
    """What a schedule sees of one rank of one communicator, for one call.

    ``st`` is the communicator's CommState, ``tag`` the call's tag, ``pool``
    the scratch dictionary the call may use (per communicator for blocking
    calls, per request for nonblocking and persistent ones). ``phase`` is a
    label the schedule keeps current for error messages: a string, or a
    (label, number) pair such as ("ring step", 3), which costs less to make
    on the per-step path than a formatted string.
    """

    __slots__ = ("st", "comm", "rank", "size", "tag", "pool", "phase", "info")

    def __init__(self, st, tag: int, pool: dict, info=None):
        self.st = st
        self.comm = st.comm
        self.rank = st.rank
        self.size = st.size
        self.tag = tag
        self.pool = pool
        self.phase = ""
        self.info = info  # (collective, algorithm, nbytes, seq) for error messages

    def send(self, buf, peer: int) -> Op:
        return Op(SEND, self, buf, peer)

    def recv(self, buf, peer: int) -> Op:
        return Op(RECV, self, buf, peer)

    def native(self, blocking, start) -> Op:
        op = Op(NATIVE, self)
        op.blocking, op.start = blocking, start
        return op

    def custom(self, obj) -> Op:
        op = Op(CUSTOM, self)
        op.custom = obj
        return op

    def start(self, *ops):
        """Post ``ops`` now (they complete while the schedule goes on)."""
        for op in ops:
            if op.req is None:
                _post(op)
        return ops

    def scratch(self, name: str, n: int, dtype) -> np.ndarray:
        """A temporary of ``n`` elements of ``dtype``, reused across calls
        that share this context's pool (never across concurrent calls)."""
        return scratch(self.pool, name, n, dtype)

    def sub(self, st) -> "Context":
        """A context on another communicator (the hierarchical algorithm's
        cross communicator), for the same call: same tag and pool."""
        c = Context(st, self.tag, self.pool, self.info)
        c.phase = self.phase
        return c


def scratch(pool: dict, name: str, n: int, dtype) -> np.ndarray:
    """``n`` elements of ``dtype`` from scratch ``pool`` (a dict of uint8
    buffers by name, grown when too small): large temporaries are reused
    because a fresh 16 MiB array costs about as much in page faults as
    reducing it."""
    if type(dtype) is not np.dtype and not isinstance(dtype, np.dtype):
        dtype = np.dtype(dtype)
    nbytes = n * dtype.itemsize
    buf = pool.get(name)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 64), np.uint8)
        pool[name] = buf
    return buf[:nbytes].view(dtype)


def _post(op: Op) -> None:
    ctx = op.ctx
    if op.kind == SEND:
        op.req = ctx.comm.Isend([op.buf, BYTE], op.peer, ctx.tag)
    elif op.kind == RECV:
        op.req = ctx.comm.Irecv([op.buf, BYTE], op.peer, ctx.tag)
    elif op.kind == NATIVE:
        op.req = op.start()
    else:
        op.custom.post()
        op.req = op.custom


# ---- completion checks, shared by the blocking and nonblocking drivers ---------

def check_received(ops, statuses) -> None:
    """Raise MismatchError unless every receive brought exactly its size."""
    for op, status in zip(ops, statuses):
        if op.kind == RECV:
            got = status.Get_count(BYTE)
            if got != op.buf.nbytes:
                raise size_mismatch(op, got)


def phase_text(phase) -> str:
    return f"{phase[0]} {phase[1]}" if isinstance(phase, tuple) else str(phase)


def size_mismatch(op: Op, got: int) -> MismatchError:
    ctx = op.ctx
    what = f"got {got}" if got >= 0 else "got a longer message (truncated)"
    where = f" ({phase_text(ctx.phase)})" if ctx.phase else ""
    coll = f"{ctx.info[0]}/{ctx.info[1]}: " if ctx.info else ""
    return MismatchError(
        f"mpicoll: {coll}rank {ctx.rank}{where}: expected {op.buf.nbytes} bytes from rank {op.peer}, {what}: "
        "the ranks disagree on the message size (count, dtype or algorithm differ). Only this rank saw it; "
        "run with MPICOLL_CHECK=1 (or check=True) to have every rank raise, and launch with "
        "'python -m mpi4py' so that one failing rank ends the job.", "count", {})


def _error_class(code: int) -> int:
    try:
        return MPI.Get_error_class(code)
    except MPI.Exception:  # pragma: no cover - a code the library does not know
        return code


def receive_error(ops, exc: MPI.Exception, statuses=()):
    """The exception to raise for ``exc``, an MPI error from waiting for
    ``ops`` (``statuses`` filled by the wait, in the order of ``ops``):
    MismatchError for a truncated receive (a longer message than expected),
    PeerFailure for any other error of a message (a dead peer, a broken
    connection), or None for an error of another kind (re-raised as is).

    A multiple-completion call reports MPI_ERR_IN_STATUS; which operation
    failed, and how, is then in each status's error field: the class of
    that error is what decides, never the mere fact that a receive was
    among the operations.
    """
    try:
        cls = exc.Get_error_class()
    except Exception:  # pragma: no cover - exotic MPI error objects
        return None
    if cls == MPI.ERR_IN_STATUS:
        failed = []
        for op, status in zip(ops, statuses):
            code = status.Get_error()
            if code not in (MPI.SUCCESS, MPI.ERR_PENDING):
                failed.append((op, _error_class(code)))
    elif len(ops) == 1:
        failed = [(ops[0], cls)]
    else:
        failed = [(op, cls) for op in ops if op.kind in (SEND, RECV)]
    for op, c in failed:
        if c == MPI.ERR_TRUNCATE and op.kind == RECV:
            return size_mismatch(op, -1)
    failed = [(op, c) for op, c in failed if op.kind in (SEND, RECV)]
    if not failed:
        return None
    op, c = failed[0]
    ctx = op.ctx
    peers = sorted({o.peer for o, _ in failed})
    coll = f"{ctx.info[0]}/{ctx.info[1]}: " if ctx.info else ""
    where = f" ({phase_text(ctx.phase)})" if ctx.phase else ""
    try:
        text = MPI.Get_error_string(c)
    except MPI.Exception:  # pragma: no cover
        text = f"error class {c}"
    return PeerFailure(
        f"mpicoll: {coll}rank {ctx.rank}{where}: the MPI library failed the message {op.describe()}: {text} "
        f"(error class {c}). The peer rank(s) {', '.join(map(str, peers))} probably died or lost their "
        "connection; this is not an argument mismatch.", peers=peers, error_class=c, rank=ctx.rank)


def completed(ops) -> list:
    """Which of ``ops`` have completed (tests each one: for error messages only)."""
    out = []
    for op in ops:
        if op.kind == CUSTOM:
            out.append(bool(op.custom.test()))
        elif op.req is None:
            out.append(False)
        else:
            try:
                out.append(op.req == MPI.REQUEST_NULL or bool(op.req.Test()))
            except MPI.Exception:
                out.append(True)
    return out


def timeout_error(ops, pending=None) -> CollectiveTimeout:
    """The flight-recorder message for a wait that passed its deadline."""
    ctx = ops[0].ctx if ops else None
    if pending is None:
        pending = completed(ops)
    waiting = [op for op, done in zip(ops, pending) if not done]
    peers = sorted({op.peer for op in waiting if op.kind in (SEND, RECV)})
    coll, alg, nbytes, seq = ctx.info if ctx is not None and ctx.info else ("?", "?", -1, -1)
    parts = "; ".join(op.describe() for op in waiting[:8]) + ("; ..." if len(waiting) > 8 else "")
    who = f"rank(s) {', '.join(map(str, peers))}" if peers else "the other ranks (inside the MPI library's collective)"
    phase = phase_text(ctx.phase) if ctx is not None and ctx.phase else "-"
    rank = ctx.rank if ctx is not None else -1
    return CollectiveTimeout(
        f"mpicoll: {coll} timed out on rank {rank}: algorithm {alg}, step {phase}, waiting for {who}: {parts}; "
        f"{nbytes} B, call #{seq} on this communicator. A rank probably skipped this call, called another "
        f"collective, or died.", collective=coll, algorithm=alg, step=phase, peers=peers, nbytes=nbytes, seq=seq,
        rank=rank)


# ---- the blocking driver --------------------------------------------------------

def wait_ops(ops, deadline=None) -> None:
    """Post what is not posted yet and wait for all of ``ops``."""
    if len(ops) == 1:
        op = ops[0]
        if op.req is None and op.kind == NATIVE and deadline is None:
            op.blocking()  # one native collective: MPI's blocking call, no request
            return
    # The common batch, point-to-point only, in one pass: post, collect.
    reqs = []
    custom = None
    for op in ops:
        kind = op.kind
        if kind == CUSTOM:
            if op.req is None:
                _post(op)
            custom = True
            continue
        if op.req is None:
            ctx = op.ctx
            if kind == SEND:
                op.req = ctx.comm.Isend([op.buf, BYTE], op.peer, ctx.tag)
            elif kind == RECV:
                op.req = ctx.comm.Irecv([op.buf, BYTE], op.peer, ctx.tag)
            else:
                op.req = op.start()
        reqs.append(op.req)
    if custom:
        for op in ops:
            if op.kind == CUSTOM and not op.custom.wait(deadline):
                raise timeout_error(ops)
        if not reqs:
            return
        mops = [op for op in ops if op.kind != CUSTOM]
    else:
        mops = ops
    statuses = [MPI.Status() for _ in reqs]
    try:
        if deadline is None:
            MPI.Request.Waitall(reqs, statuses)
        else:
            _wait_until(mops, reqs, statuses, deadline)
    except MPI.Exception as exc:
        err = receive_error(mops, exc, statuses)
        if err is not None:
            raise err from exc
        raise
    check_received(mops, statuses)


# A wait with a deadline polls without sleeping for this long, as MPI's own
# blocking wait spins (forever). Sleeping sooner slows the normal path: the
# first version began sleeping after a few polls, and each sleep's wake-up
# latency (50-100 us idle; a whole scheduler slice, milliseconds, on a loaded
# node, where a peer is often descheduled for longer than 1 ms) made small
# and medium all-reduces several times slower. A wait that lasts longer than
# this is a late or missing peer, where a poll every millisecond costs
# nothing measurable and leaves the core to whoever needs it.
SPIN_S = 0.1


def _wait_until(ops, reqs, statuses, deadline) -> None:
    """Waitall with a deadline: spin, then poll with a growing sleep."""
    spin_end = time.monotonic() + SPIN_S
    pause = 0.0
    while not MPI.Request.Testall(reqs, statuses):
        now = time.monotonic()
        if now >= deadline:
            raise timeout_error(ops)
        if now < spin_end:
            continue
        # Past the spin, back off to at most 1 ms: a peer that is late by
        # more than that is not hurried by polling, and on an oversubscribed
        # node it may need this core.
        pause = min(max(pause * 2, 20e-6), 1e-3)
        time.sleep(pause)


def run(gen, deadline=None) -> None:
    """The blocking driver: run schedule ``gen`` to its end."""
    try:
        ops = next(gen)
        while True:
            if ops:
                wait_ops(ops, deadline)
            ops = gen.send(None)
    except StopIteration:
        return


# ---- the simulated driver: all ranks in one process, no MPI -----------------------

class SimStats:
    """Per-rank counts of one simulated call."""

    __slots__ = ("messages", "bytes_sent", "bytes_reduced")

    def __init__(self):
        self.messages = 0
        self.bytes_sent = 0
        self.bytes_reduced = 0

    def __repr__(self):
        return f"SimStats(messages={self.messages}, bytes_sent={self.bytes_sent}, bytes_reduced={self.bytes_reduced})"


class _SimComm:
    """A stand-in for CommState in the simulator: rank and size."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.comm = None
        self.extra = {}


class _SimContext(Context):
    __slots__ = ("net", "stats")

    def start(self, *ops):
        for op in ops:
            if op.req is None:
                self.net.post(op)
        return ops

    def native(self, blocking, start):
        raise NotImplementedError("the MPI library's own collectives cannot be simulated")

    def sub(self, st):
        raise NotImplementedError("sub-communicators are not simulated")


class CountingReduction:
    """A Reduction that also counts the bytes it reduces (per rank)."""

    def __init__(self, red, stats: SimStats):
        self._red, self._stats = red, stats
        self.op, self.dtype = red.op, red.dtype

    def combine(self, dst, a, b):
        self._stats.bytes_reduced += dst.nbytes
        self._red.combine(dst, a, b)

    def combine_many(self, dst, srcs):
        self._stats.bytes_reduced += dst.nbytes * max(len(srcs) - 1, 0)
        self._red.combine_many(dst, srcs)

    def finish(self, buf, size):
        self._red.finish(buf, size)


class _Network:
    """Matches simulated sends and receives: per (source, dest) pair in
    posting order, as MPI does for one tag. A send is buffered when posted
    (eager), so it completes at once."""

    def __init__(self, p):
        self.queues = {}  # (src, dst) -> list of bytes in flight
        self.recvs = {}  # (src, dst) -> list of posted, unmatched receive ops

    def post(self, op):
        r = op.ctx.rank
        if op.kind == SEND:
            op.ctx.stats.messages += 1
            op.ctx.stats.bytes_sent += op.buf.nbytes
            data = op.buf.view(np.uint8).copy() if op.buf.nbytes else np.empty(0, np.uint8)
            waiting = self.recvs.get((r, op.peer))
            if waiting:
                self._deliver(waiting.pop(0), data)
            else:
                self.queues.setdefault((r, op.peer), []).append(data)
            op.req = True  # complete
        elif op.kind == RECV:
            q = self.queues.get((op.peer, r))
            if q:
                self._deliver(op, q.pop(0))
            else:
                self.recvs.setdefault((op.peer, r), []).append(op)
                op.req = False  # pending
        else:
            raise NotImplementedError("only point-to-point operations are simulated")

    @staticmethod
    def _deliver(op, data):
        if data.nbytes != op.buf.nbytes:
            raise size_mismatch(op, data.nbytes)
        if data.nbytes:
            op.buf.view(np.uint8)[...] = data
        op.req = True


def simulate(p: int, make, *, pool_per_rank=True):
    """Run one collective on ``p`` simulated ranks; returns per-rank SimStats.

    ``make(ctx, stats)`` returns rank ``ctx.rank``'s schedule generator (it
    may wrap its Reduction in ``CountingReduction(red, stats)``). Raises
    RuntimeError if the schedules deadlock (a receive nobody sends).
    """
    net = _Network(p)
    stats = [SimStats() for _ in range(p)]
    gens, waiting = [], []
    for r in range(p):
        ctx = _SimContext(_SimComm(r, p), tag=0, pool={}, info=("simulated", "?", 0, 0))
        ctx.net, ctx.stats = net, stats[r]
        gens.append(make(ctx, stats[r]))
        waiting.append(None)
    live = set(range(p))

    def advance(r):
        try:
            ops = next(gens[r]) if waiting[r] is None else gens[r].send(None)
        except StopIteration:
            live.discard(r)
            return
        for op in ops:
            if op.req is None:
                net.post(op)
        waiting[r] = list(ops)

    for r in range(p):
        advance(r)
    while live:
        moved = False
        for r in sorted(live):
            if all(op.req is True for op in waiting[r]):
                advance(r)
                moved = True
        if not moved:
            stuck = {r: [op.describe() for op in waiting[r] if op.req is not True] for r in sorted(live)}
            raise RuntimeError(f"simulated schedules deadlock: {stuck}")
    return stats
