"""Schedules: every algorithm written once, run by several drivers.

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
* ``ctx.copy(dst, src)``: ``dst[...] = src`` (a schedule marked
  ``compilable`` copies only this way, so that its recording sees it).
* ``ctx.custom(op)``: anything else that completes later (the shared-memory
  flags): an object with ``post()`` and ``test() -> bool``, and optionally
  its own blocking ``wait(deadline) -> bool``; without one the blocking
  driver polls ``test()`` and advances the nonblocking calls in flight
  meanwhile (``advance_others``: a turn in a queue that calls started
  earlier must leave first).

The drivers:

* blocking (``run``): waits for each yielded list at once (MPI_Waitall),
  then resumes the generator;
* nonblocking (``mpicoll.engine``): keeps the generator and its pending
  requests; the progress engine (test(), wait(), the progress thread)
  resumes it when they have completed;
* counting (``mpicoll.counting.simulate``): runs the schedules of all p
  ranks in one process without MPI, matching sends to receives, and counts
  per rank the messages and bytes sent and the bytes reduced - the figures
  the cost model (``mpicoll.model.terms``) predicts - while computing the
  real result (and mpicoll.simulate drives the same schedules on SimGrid).

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

import numpy as np
from mpi4py import MPI

from .errors import CollectiveTimeout, MismatchError, PeerFailure
from .poll import poll

BYTE = MPI.BYTE

SEND, RECV, NATIVE, CUSTOM = 0, 1, 2, 3

# The nonblocking driver's progress function, which engine.py puts here when
# it is imported: the blocking driver calls it while it polls a custom
# operation without a wait of its own. Held in this module, below both
# drivers and the schedules, so that neither the schedules nor this driver
# import the engine.
advance_others = None
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

    # How one operation is posted: through the MPI library here. The
    # counting, recording (program.py) and SimGrid drivers' contexts post
    # to their own network instead; start() is the same for all.
    post_op = staticmethod(_post)

    def start(self, *ops):
        """Post ``ops`` now (they complete while the schedule goes on)."""
        post = self.post_op
        for op in ops:
            if op.req is None:
                post(op)
        return ops

    def copy(self, dst, src) -> None:
        """``dst[...] = src``, said to the context so that a recorded
        schedule (program.py) replays it: a compilable schedule copies
        between its buffers only through here."""
        dst[...] = src

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
            if op.kind == CUSTOM:
                wait = getattr(op.custom, "wait", None)
                done = wait(deadline) if wait is not None else \
                    poll(op.custom.test, deadline, advance=advance_others, spin_s=0.0, max_pause=0.0)
                if not done:
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


def _wait_until(ops, reqs, statuses, deadline) -> None:
    """Waitall with a deadline (poll.py: spin, then poll with a growing sleep)."""
    poll(lambda: MPI.Request.Testall(reqs, statuses), deadline, lambda: timeout_error(ops))


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
