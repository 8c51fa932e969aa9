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
              in the tests). The C wait returns to its caller every 50 ms
              at most, so the deadline (``timeout=``, the schedule's) and
              Ctrl-C (KeyboardInterrupt, every form) are honoured while a
              peer is late, dead or absent. "barrier":
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
              they run one after the other. A kept call of one chunk
              (blocking, nonblocking or persistent) runs all five steps as
              one step of the C executor (``program``): its nonblocking
              passes test each flag once, a blocking wait waits in C in
              rounds (its caller runs the signal handlers between them); the
              other calls run the schedule step by step. A call with
              ``timeout=`` always runs the schedule. The agreement
              covers the ranks of one node: on several nodes
              (hierarchical) a node whose ranks agree among themselves but
              not with another node's is caught by the cross-node
              algorithm's receive-size checks (one rank's MismatchError,
              or the others' CollectiveTimeout with ``timeout=``), like
              the network algorithms. Window creation on first use is
              collective MPI with no deadline of its own; with
              ``timeout=`` the ranks first meet under the deadline
              (plan._meet_before_setup), so a missing rank is a
              CollectiveTimeout there. A window that must grow later
              grows after a sync every rank has passed.
"""
from __future__ import annotations

import collections
import itertools

import numpy as np

from .. import program as _program
from .._kernels import ffi as _ffi, lib as _lib
from ..registry import get as _get, has, register
from ..node import node_info
from ..shmwindow import MAX_SLOT_BYTES, SYNC, grow, mismatch, shm_ctl, signature, window, window_key
from .common import block_bounds

# Chunk size: measured with sweeps of 1, 4 and 16 MiB chunks
# (numbers in docs/shm.md) on the shared 2-core machine, the largest
# chunk was fastest at every size: each sync can cost a scheduler time slice
# when other processes load the cores, so fewer syncs win over keeping a
# chunk in the 32 MiB L3. Keyword ``chunk_bytes`` to override.
CHUNK_BYTES = MAX_SLOT_BYTES


class _Turn:
    """Waits until the calls started before this one on the communicator's
    window have finished (every rank starts them in the same order): those
    queued before it, and a call running in C (the executor's step, which
    starts only when nothing is queued)."""

    what = "an earlier shared-memory call on this communicator"

    def __init__(self, queue, ticket, ctl):
        self.queue, self.ticket, self.ctl = queue, ticket, ctl

    def post(self) -> None:
        pass

    def test(self) -> bool:
        # (an acquire load: a run the progress thread just ended has moved the turn and counts)
        return self.queue[0] == self.ticket and not _lib.mpicoll_shm_running(self.ctl)

    # No wait(): the blocking driver polls test() and advances the calls
    # ahead in the queue, which may be nonblocking (schedule.advance_others).


_tickets = itertools.count()


def _queue(st):
    q = st.extra.get("shm-queue")
    if q is None:
        q = st.extra["shm-queue"] = collections.deque()
    return q


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
    queue, ctl = _queue(st), shm_ctl(st)
    ticket = next(_tickets)
    queue.append(ticket)
    ctl.queued = len(queue)  # (calls in C wait for an empty queue)
    try:
        turn = _Turn(queue, ticket, ctl)
        if not turn.test():
            ctx.phase = "shm: waiting for the window"
            yield [ctx.custom(turn)]
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
            w = grow(st, w, cap * size)
        slots = w.slots(dtype)
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
            # Copies through ctx.copy: the SimGrid driver prices them (memory
            # bandwidth), the MPI drivers copy.
            copy = ctx.copy
            copy(mine[:a], own[c0:c0 + a])  # my own slice stays private: only I read it
            copy(mine[b:m], own[c0 + b:c0 + m])
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
                copy(buf[c0 + qa:c0 + qb], peers[q][qa:qb])
    finally:
        queue.remove(ticket)
        ctl.queued = len(queue)


# On several nodes a window cannot reach every rank: "shm" runs the
# hierarchical algorithm (shm within each node, then across), looked up in
# the registry at call time (hierarchical.py builds on this module, so this
# one does not import it).

# Algorithms the cross communicator (one rank per node) may run: not the
# node-level ones, which would recurse into hierarchical.
NODE_LEVEL = ("shm", "hierarchical", "cascade")


def cross_available(name: str) -> bool:
    return name not in NODE_LEVEL and has("allreduce", name)


def check_cross(cross) -> None:
    """hierarchical's (and so shm's) ``cross`` knob: None or an all-reduce
    algorithm that is not node-level; checked on one node too, where it is
    not used, so that a wrong value fails the same way everywhere."""
    if cross is not None and not (isinstance(cross, str) and cross_available(cross)):
        raise ValueError(f"mpicoll: hierarchical cross must be an all-reduce algorithm other than "
                         f"{', '.join(NODE_LEVEL)} (or None), got {cross!r}")


def _prepare_shm(st, buf, red=None, **knobs):
    check_cross(knobs.get("cross"))
    if node_info(st).nodes > 1:
        return _get("allreduce", "hierarchical").prepare(st, buf, red, **knobs)
    prepare(st, buf, **knobs)
    return None


# ``cross`` matters only where shm runs as hierarchical (its algorithm across
# nodes, see hierarchical.py); on one node it is ignored.
def check_knob_values(knobs) -> None:
    """shm's and hierarchical's knob values, checked when a call gives them."""
    check_cross(knobs.get("cross"))


def program(st, n, dtype, red, has_src, *, chunk_bytes=CHUNK_BYTES, sync=None, cross=None):
    """A kept signature's calls in C, when the message is one chunk: a
    program of one executor step (program.SHM, csrc/shmsync.c's
    mpicoll_shm_run) that does steps 1-5 above with the same syncs, slots,
    signature words and counters as the schedule, so that ranks running
    either meet; blocking, nonblocking (each flag wait tested once per
    pass) and persistent alike. It runs only while the window takes it
    (the executor's probe: slots big enough, no call queued or running);
    the schedule runs the others (growing the window, waiting its turn).
    None where the schedule always runs the call: several nodes, barrier
    syncs, an empty message or one longer than a chunk."""
    itemsize = np.dtype(dtype).itemsize
    if not n or n > min(chunk_bytes, MAX_SLOT_BYTES) // itemsize or (sync or SYNC) != "flags":
        return None
    info = node_info(st)
    if info.nodes > 1:
        return None
    ctl, nbytes = shm_ctl(st), n * itemsize

    def explain(status, ctx):
        if status == _lib.MPICOLL_SHM_EMISMATCH:
            w = st.extra[window_key(SYNC)]
            lo, hi = w._sig_words()  # (the failed check's: the count stays where it was)
            return mismatch(w._slots[:, lo:hi].copy(), info, ctx)
        return RuntimeError(f"mpicoll: the shared-memory reduction kernel refused its arguments (status {status})")

    step = [_program.SHM, int(_ffi.cast("intptr_t", ctl)), 0, n, itemsize, 0, 0, 0]
    return _program.Program([step], list(signature(nbytes, red, nbytes)), (), (), 1, nbytes, has_src,
                            keep=ctl, explain=explain)


@register("allreduce", "shm", knobs=("chunk_bytes", "sync", "cross"), prepare=_prepare_shm,
          check_values=check_knob_values, program=program)
def allreduce(ctx, buf, red, src=None, *, chunk_bytes=CHUNK_BYTES, sync=None, cross=None):
    info = node_info(ctx.st)
    if info.nodes > 1:
        yield from _get("allreduce", "hierarchical").schedule(ctx, buf, red, src, chunk_bytes=chunk_bytes,
                                                              sync=sync, cross=cross)
        return
    yield from pipeline(ctx, info, buf, red, src, chunk_bytes, sync=sync)
