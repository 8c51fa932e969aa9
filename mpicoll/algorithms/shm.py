"""Shared-memory all-reduce: the ranks of a node read each other's data directly.

Function:     allreduce(ctx, buf, red, src=None, *, chunk_bytes=CHUNK_BYTES, sync=None)
Description:  The node's k ranks share one MPI-3 shared-memory window
              (``MPI_Win_allocate_shared``), allocated on first use (with
              64 KiB slots, whatever the message, so that every rank makes
              the same window), kept in the communicator's state and
              reused; it grows (collectively) when a longer message needs
              bigger chunks, and is freed with the communicator or at
              interpreter exit. Each rank's part of the window holds two
              chunk slots (double buffering, below).

              Agreement: each rank writes the call's signature (message
              bytes, dtype, op, chunk size) next to its sync counter before
              the call's first sync, and compares every rank's after it:
              if they differ, every rank of the node raises MismatchError,
              before any rank reads a peer's slot (nothing is partly
              reduced) and the window stays usable. A call whose message
              needs a bigger window, or is empty, passes one sync of its
              own for this first, so the window only grows once every rank
              knows that every rank will grow it.

              The message is processed in chunks of at most ``chunk_bytes``
              (so the window stays at most 2 * chunk_bytes per rank for any
              message size). For each chunk, in slot s (alternating from
              chunk to chunk, and across calls):

                1. copy in:   rank r copies its chunk of the input into W[r][s],
                              except slice r (below), which no one else reads
                2. sync
                3. reduce:    rank r owns slice r of the chunk (array_split
                              into k slices) and computes, with the k-input
                              C kernel in one pass over memory and in rank
                              order, its own part read from its private input,
                                W[r][s][slice r] = ((x0 op x1) op x2) ... x(k-1)
                              where xq is W[q][s][slice r] (q != r), or this
                              rank's input (q = r)
                3b. between:  optional hook on the reduced slices (the
                              hierarchical algorithm all-reduces them across
                              nodes)
                4. sync
                5. copy out:  every rank copies slice q of its result from
                              W[q][s][slice q], for every q

              Two slots make a third sync per chunk unnecessary: the copy-in
              of chunk c+1 writes the other slot, and the copy-in of chunk
              c+2 into slot s happens after the step-2 sync of chunk c+1,
              which no rank reaches before finishing step 5 of chunk c.

              Synchronisation (``sync=``): "flags" (default), one int64
              counter per rank in the window: a rank stores the sync's
              number with a release store and waits, in C, until every
              counter has reached it (acquire loads, the nonblocking test's
              included), spinning briefly, then yielding the core at each
              poll for 10 ms, then sleeping with back-off up to 1 ms (the
              peer it waits for may need that core: 4-8 ranks share 2 cores
              in the tests). The C wait returns to Python every 50 ms at
              most, so the deadline (``timeout=``) and Ctrl-C
              (KeyboardInterrupt) are honoured while a peer is late, dead
              or absent. "barrier":
              MPI_Win_sync, MPI_Barrier on the node communicator,
              MPI_Win_sync (the MPI-3 idiom). Measured on the 2-core machine
              at p=2 and 4, 1-64 MiB: flags 1.1-1.7x faster.
Cost:         Per rank and per byte of message: (k-1)/k of a copy in, 1/k
              of a k-input reduction (reads k/k = 1 byte), one copy out:
              about (3k-1)/k bytes read and 2 written, with no network
              message and no temporaries; 2 syncs per chunk (one more for
              a call that grows the window or is empty). MPI_Allreduce through
              MPICH's shared-memory transport moves every byte through
              bounce buffers several times and reduces pairwise.
Limitations:  One node only. On a communicator that spans several nodes
              ``shm`` runs the ``hierarchical`` algorithm (shared memory
              inside each node, network between nodes). Every element is
              reduced in rank order on one rank and copied to all, so the
              result is bit-identical on every rank, and, on one node, also
              identical to the serial rank-ordered reduction (reproducible).
              Calls on one communicator take turns on its window in the
              order they were started (the same on every rank), so several
              nonblocking shm all-reduces may be outstanding at once, but
              they run one after the other. Nonblocking tests poll the flags
              once (in C); waits wait in C in bounded rounds. The agreement
              covers the ranks of one node: on several nodes
              (hierarchical) a node whose ranks agree among themselves but
              not with another node's is caught by the cross-node
              algorithm's receive-size checks (one rank's MismatchError,
              or the others' CollectiveTimeout with ``timeout=``), like
              the network algorithms. Window creation on first use is
              collective MPI with no deadline.
"""
from __future__ import annotations

import atexit
import collections
import itertools
import sys
import time
import weakref

import numpy as np
from mpi4py import MPI

from . import register
from .. import dtypes as _dtypes
from .. import ops as _ops
from .._kernels import ffi, lib
from ..errors import MismatchError
from ..node import node_info
from .common import block_bounds

# The bound: never more than this per rank in the window (header included).
MAX_WINDOW_BYTES = 32 << 20
# Largest slot: two slots and a header of up to 64 KiB (flags for 512 ranks).
MAX_SLOT_BYTES = (MAX_WINDOW_BYTES - (64 << 10)) // 2
# Chunk size: measured with sweeps of 1, 4 and 16 MiB chunks
# (numbers in docs/shm.md) on the shared 2-core machine, the largest
# chunk was fastest at every size: each sync can cost a scheduler time slice
# when other processes load the cores, so fewer syncs win over keeping a
# chunk in the 32 MiB L3. Keyword ``chunk_bytes`` to override.
CHUNK_BYTES = MAX_SLOT_BYTES
# "flags" (counters in the window, csrc/shmsync.c) or "barrier" (MPI_Barrier):
# flags measured 1.1-1.7x faster at p=2 and p=4 (waiting ranks yield the core).
SYNC = "flags"

# Windows to free at exit, before MPI_Finalize, keyed by creation number:
# creation is collective, so every rank frees its windows in the same order.
_live = weakref.WeakValueDictionary()
_serial = 0


# Sync flags: one int64 counter per rank, FLAG_STRIDE bytes apart (two cache
# lines: no false sharing, even with adjacent-line prefetch), all in a header
# at the start of rank 0's segment; every segment has a header of the same
# size so that the slots are laid out alike.
FLAG_STRIDE = 128
# A flag wait (csrc/shmsync.c) polls SPINS times, then yields the core at
# each poll for YIELD_S, then sleeps with back-off; it comes back to Python
# every ROUND_S at most, so that Ctrl-C (KeyboardInterrupt) and the deadline
# are seen while a peer is late or dead.
SPINS = 200
YIELD_S = 0.01
ROUND_S = 0.05
# Each rank's flag slot (FLAG_STRIDE bytes, as int64 words): the counter,
# then the call's signature (SIG_WORDS words) in two copies, by the parity
# of the check's number (see ShmWindow.publish).
SIG_WORDS = 4


class ShmWindow:
    """One shared window on a node communicator: ``slot(r, s)`` is rank r's
    slot s (2 slots per rank, ``slot_bytes`` each), as a uint8 array; a
    header before the slots holds the sync flags."""

    def __init__(self, local: MPI.Intracomm, slot_bytes: int, sync: str = "flags"):
        if sync not in ("flags", "barrier"):
            raise ValueError(f"mpicoll: shm sync must be 'flags' or 'barrier', not {sync!r}")
        k = local.Get_size()
        self.header = -(-k * FLAG_STRIDE // 4096) * 4096
        self.slot_bytes = slot_bytes
        # Page-aligned per-rank segments: each rank's memory is first touched
        # (and so placed) by that rank, and no two ranks write one cache line.
        info = MPI.Info.Create()
        info.Set("alloc_shared_noncontig", "true")
        self.win = MPI.Win.Allocate_shared(self.header + 2 * slot_bytes, 1, info, comm=local)
        info.Free()
        self.win.Lock_all(MPI.MODE_NOCHECK)  # one passive epoch for the window's lifetime
        self._mem = []
        for r in range(local.Get_size()):
            mem, _ = self.win.Shared_query(r)
            self._mem.append(np.frombuffer(mem, np.uint8))
        self.local = local
        self.turn = 0  # the slot the next chunk uses (same on every rank)
        self.k, self.me = k, local.Get_rank()
        self.sync_mode = sync
        self.epoch = 0  # sync points passed (same on every rank); counters start at 0
        self.checks = 0  # signature checks passed (same on every rank)
        flags = self._mem[0]
        if self.me == 0:
            flags[:self.header] = 0  # rank 0 clears the flags ...
        self._flags = ffi.from_buffer(flags)
        self._my_flag = ffi.cast("int64_t *", ffi.from_buffer(flags[self.me * FLAG_STRIDE:]))
        # Every rank's flag slot as int64 words: [counter, signature, signature].
        self._slots = np.frombuffer(flags[:self.header], np.int64).reshape(-1, FLAG_STRIDE // 8)[:k]
        self._barrier_sync()  # ... before anyone uses a flag
        global _serial
        _serial += 1
        self._serial = _serial
        _live[_serial] = self

    def slot(self, r: int, s: int) -> np.ndarray:
        start = self.header + s * self.slot_bytes
        return self._mem[r][start:start + self.slot_bytes]

    def _barrier_sync(self) -> None:
        # MPI-3's idiom for shared windows: Win_sync, Barrier, Win_sync.
        self.win.Sync()
        self.local.Barrier()
        self.win.Sync()

    def wait_flags(self, epoch: int, deadline) -> bool:
        """Wait until every counter has reached ``epoch`` (True), or until
        ``deadline`` (time.monotonic(); None: no limit) has passed (False)."""
        return wait_flags(self._flags, self.k, epoch, deadline)

    def _sig_words(self):
        lo = 1 + (self.checks & 1) * SIG_WORDS
        return lo, lo + SIG_WORDS

    def publish(self, sig) -> None:
        """Write this call's signature for the next sync to carry (before its
        release store). Two copies, by the parity of the check's number: a
        rank that has passed check c (and raised, say) may write its next
        call's signature for check c+1 while a slower rank still reads
        those of check c; it cannot pass the sync of c+1, and so write
        c+2's, before that rank has reached it."""
        self.checks += 1
        lo, hi = self._sig_words()
        self._slots[self.me, lo:hi] = sig

    def verify(self, sig, info, ctx) -> None:
        """After the sync that carried the signatures (flags: the counters
        were read with acquire loads; barrier: Win_sync here): MismatchError
        on every rank of the node if they differ, before anyone reads a
        peer's slot or grows the window."""
        if self.sync_mode != "flags":
            self.win.Sync()  # the barrier's memory side: the peers' header writes
        lo, hi = self._sig_words()
        seen = self._slots[:, lo:hi]
        if (seen == np.asarray(sig, np.int64)).all():
            return
        raise _mismatch(seen, info, ctx)

    def _ibarrier(self):
        self.win.Sync()
        return self.local.Ibarrier()

    def sync_op(self, ctx):
        """One sync point as a schedule operation."""
        if self.sync_mode == "flags":
            return ctx.custom(_FlagSync(self))
        return ctx.native(self._barrier_sync, self._ibarrier)

    def free(self) -> None:
        self._mem = []  # no view or pointer may outlive the memory
        self._flags = self._my_flag = self._slots = None
        if self.win != MPI.WIN_NULL and not MPI.Is_finalized():
            self.win.Unlock_all()
            self.win.Free()
        _live.pop(self._serial, None)


class _FlagSync:
    """A flag sync as a schedule operation: post sets this rank's counter,
    test/wait see every rank's counter reach it."""

    what = "shared-memory sync (a rank of this node has not reached it)"

    def __init__(self, w: ShmWindow):
        self.w = w
        self.epoch = 0

    def post(self) -> None:
        w = self.w
        w.epoch += 1
        self.epoch = w.epoch
        lib.mpicoll_flag_set(w._my_flag, self.epoch)

    def test(self) -> bool:
        w = self.w
        return bool(lib.mpicoll_flag_test(w._flags, FLAG_STRIDE, w.k, self.epoch))

    def wait(self, deadline) -> bool:
        return self.w.wait_flags(self.epoch, deadline)


def wait_flags(flags, k: int, epoch: int, deadline=None) -> bool:
    """Wait until each of the ``k`` counters at ``flags`` (a cffi pointer,
    FLAG_STRIDE bytes apart) has reached ``epoch``: True, or False once
    ``deadline`` (time.monotonic()) has passed. The C wait runs at most
    ROUND_S at a time with the GIL released; between rounds Python runs its
    signal handlers (KeyboardInterrupt) and checks the deadline."""
    start = time.monotonic()
    spins = SPINS
    while True:
        now = time.monotonic()
        budget = ROUND_S if deadline is None else min(ROUND_S, deadline - now)
        if budget <= 0:
            return bool(lib.mpicoll_flag_test(flags, FLAG_STRIDE, k, epoch))
        yield_s = max(0.0, YIELD_S - (now - start))  # the back-off goes on where the last round left it
        if lib.mpicoll_flag_wait(flags, FLAG_STRIDE, k, epoch, spins, int(yield_s * 1e9), int(budget * 1e9)):
            return True
        spins = 0


def signature(nbytes: int, red, chunk_bytes: int):
    """What the ranks of a node must agree on for one call: the message's
    bytes, the element type, the op and the chunk size (the chunks' syncs)."""
    return (nbytes, red.dtype.code, red.op.code << 1 | red.op.average, chunk_bytes)


_SIG_FIELDS = ("count", "dtype", "op", "chunk_bytes")


def _sig_value(field: str, word: int):
    """A signature word as the error shows it: names for the dtype and op."""
    if field == "dtype":
        return next((d.name for d in _dtypes.ALL if d.code == word), word)
    if field == "op":
        return next((o.name for o in _ops.ALL if o.code << 1 | o.average == word), word)
    return word


def _mismatch(seen, info, ctx):
    """The MismatchError for the signatures ``seen`` (one row per local rank)."""
    ranks = info.node_ranks[info.node]
    for j, field in enumerate(_SIG_FIELDS):
        col = [_sig_value(field, int(v)) for v in seen[:, j]]
        if len(set(col)) > 1:
            break
    values = {}
    for q, v in enumerate(col):
        values.setdefault(v, []).append(ranks[q])
    coll = f"{ctx.info[0]}/{ctx.info[1]}: " if ctx.info else ""
    what = {"count": "message size in bytes", "chunk_bytes": "chunk size in bytes"}.get(field, field)
    what += ": " + "; ".join(f"{v} on rank(s) {', '.join(map(str, r))}" for v, r in values.items())
    return MismatchError(f"mpicoll: {coll}rank {ctx.rank}: the ranks of this node disagree on the {what}: "
                         "every rank of the node raises this, nothing was reduced.", field, values)


class _Turn:
    """Waits until the calls started before this one on the communicator's
    window have finished (every rank starts them in the same order)."""

    what = "an earlier shared-memory call on this communicator"

    def __init__(self, queue, ticket):
        self.queue, self.ticket = queue, ticket

    def post(self) -> None:
        pass

    def test(self) -> bool:
        return self.queue[0] == self.ticket

    def wait(self, deadline) -> bool:
        from .. import engine

        while not self.test():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            engine.progress()
            time.sleep(0)
        return True


_tickets = itertools.count()


def _queue(st):
    q = st.extra.get("shm-queue")
    if q is None:
        q = st.extra["shm-queue"] = collections.deque()
    return q


@atexit.register
def _free_all_at_exit():
    # Python's atexit handlers run before mpi4py's MPI_Finalize. Windows are
    # freed in creation order, which is the same on every rank.
    # Not when the program ends with an uncaught exception (the interpreter
    # has set sys.last_value): freeing is collective, the other ranks may
    # never get here (one raised CollectiveTimeout because another skipped
    # a call), and `python -m mpi4py` calls MPI_Abort after these handlers,
    # which releases the windows anyway. Waiting here would hold the job
    # until the others ended by themselves.
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return
    for key in sorted(_live.keys()):
        w = _live.get(key)
        if w is not None:
            w.local.Barrier()  # every rank has copied its last result out of the old window
            w.free()


# The slots of a new window: the same on every rank whatever its message
# (a window made to one rank's size would have other ranks' slots elsewhere
# in the peers' view); a call needing more grows it after the signature check.
FIRST_SLOT_BYTES = 64 << 10


def _key(sync: str) -> str:
    return "shm" if sync == SYNC else f"shm-{sync}"  # one window per sync mode (benchmarks compare them)


def window(st, info, sync: str = "flags") -> ShmWindow:
    """The communicator's window, made (collectively) on first use."""
    key = _key(sync)
    w = st.extra.get(key)
    if w is None:
        w = st.extra[key] = ShmWindow(info.local, FIRST_SLOT_BYTES, sync)
    return w


def _grow(st, w: ShmWindow, nbytes: int) -> ShmWindow:
    """A window with slots of at least ``nbytes`` in place of ``w`` (collective).
    Called at the head of the queue, after a matching signature check: every
    rank of the node grows, and no call still uses the old window."""
    w.local.Barrier()  # every rank has read the signatures out of the old window's header
    w.free()
    slot = min(max(nbytes, 2 * w.slot_bytes), MAX_SLOT_BYTES)  # geometric growth: few re-allocations
    slot = -(-slot // 4096) * 4096  # MAX_SLOT_BYTES is a multiple of 4096 too
    new = st.extra[_key(w.sync_mode)] = ShmWindow(w.local, slot, w.sync_mode)
    return new


def chunk_elems(n: int, itemsize: int, chunk_bytes: int) -> int:
    return max(1, min(n, min(chunk_bytes, MAX_SLOT_BYTES) // itemsize))


def _cap(n: int, itemsize: int, chunk_bytes: int) -> int:
    cap = chunk_elems(n, itemsize, chunk_bytes)
    return -(-n // -(-n // cap))  # equal chunks: 16 MiB is one chunk, not 16 MiB - 32 KiB plus a sliver


def prepare(st, buf, chunk_bytes=CHUNK_BYTES, sync=None, **_) -> None:
    """Call-time set-up (collective): the node layout and the window. The
    same steps whatever the message (even empty), so that ranks that
    disagree on it still meet at the schedule's signature check."""
    window(st, node_info(st), sync or SYNC)


def pipeline(ctx, info, buf, red, src, chunk_bytes, between=None, sync=None):
    """Steps 1-5 above over the whole message, in place on ``buf`` (a schedule).

    The ranks' signatures (bytes, dtype, op, chunk size) travel with the
    first sync and are compared after it, on every rank: MismatchError
    everywhere, before a peer's slot is read. When the window must grow
    (or the message is empty) a sync of its own carries them first, so a
    rank with a longer message never grows the window alone."""
    n = buf.size
    st = ctx.st
    queue = _queue(st)
    ticket = next(_tickets)
    queue.append(ticket)
    try:
        if queue[0] != ticket:
            ctx.phase = "shm: waiting for the window"
            yield [ctx.custom(_Turn(queue, ticket))]
        k, me = info.local_size, info.local_rank
        dtype, size = buf.dtype, buf.itemsize
        cap = _cap(n, size, chunk_bytes) if n else 0
        w = window(st, info, sync or SYNC)
        sig = signature(n * size, red, cap * size)
        if n == 0 or w.slot_bytes < cap * size:
            ctx.phase = "shm: agreeing on the message"
            w.publish(sig)
            yield [w.sync_op(ctx)]
            w.verify(sig, info, ctx)
            sig = None
            if n == 0:
                return
            w = _grow(st, w, cap * size)
        slots = [[w.slot(r, s).view(dtype) for r in range(k)] for s in (0, 1)]
        own = buf if src is None else src
        bounds = block_bounds(min(cap, n), k)
        for c0 in range(0, n, cap):
            ctx.phase = ("shm chunk at element", c0)
            m = min(cap, n - c0)
            if m != cap:
                bounds = block_bounds(m, k)
            a, b = bounds[me]
            # The slot alternates across calls too: the next call's first copy-in
            # must not land in the slot a slower rank is still copying out of.
            peers = slots[w.turn]
            mine = peers[me]
            mine[:a] = own[c0:c0 + a]  # my own slice stays private: only I read it
            mine[b:m] = own[c0 + b:c0 + m]
            if sig is not None:
                w.publish(sig)
            yield [w.sync_op(ctx)]
            if sig is not None:
                w.verify(sig, info, ctx)
                sig = None
            # Turned only now: after a MismatchError every rank is still on this slot.
            w.turn ^= 1
            srcs = [p[a:b] for p in peers]
            srcs[me] = own[c0 + a:c0 + b]
            red.combine_many(mine[a:b], srcs)  # rank order; the result replaces my (unused) slice
            if between is not None:
                yield from between(w, peers, bounds)
            yield [w.sync_op(ctx)]
            if w.sync_mode != "flags":
                w.win.Sync()
            for q, (qa, qb) in enumerate(bounds):
                buf[c0 + qa:c0 + qb] = peers[q][qa:qb]
    finally:
        queue.remove(ticket)


def _prepare_shm(st, buf, **knobs) -> None:
    if node_info(st).nodes > 1:
        from . import hierarchical

        return hierarchical.prepare(st, buf, **knobs)
    prepare(st, buf, **knobs)


@register("allreduce", "shm", knobs=("chunk_bytes", "sync"), prepare=_prepare_shm)
def allreduce(ctx, buf, red, src=None, *, chunk_bytes=CHUNK_BYTES, sync=None):
    info = node_info(ctx.st)
    if info.nodes > 1:
        from . import hierarchical

        yield from hierarchical.allreduce(ctx, buf, red, src, chunk_bytes=chunk_bytes, sync=sync)
        return
    yield from pipeline(ctx, info, buf, red, src, chunk_bytes, sync=sync)
