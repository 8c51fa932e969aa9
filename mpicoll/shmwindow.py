"""The shared-memory window of a node communicator: its lifetime and its
sync flags (the state the "shm" schedule uses; mpicoll/algorithms/shm.py).

Each rank of a node owns one page-aligned segment of an MPI shared window
(``MPI_Win_allocate_shared``): a header of sync flags, then two slots. The
window is made collectively on a communicator's first shared-memory call
(``window``), grown when a call needs bigger slots (``grow``, at the head
of the queue, after the node agreed on the call), and freed at exit, in
creation order, before MPI_Finalize. The flags are one counter per rank
(csrc/shmsync.c's release stores and acquire loads), with the call's
signature beside each counter so that the ranks of a node agree on a call
(``publish``/``verify``) before anyone reads a peer's slot.
"""
from __future__ import annotations

import atexit
import sys
import time
import weakref

import numpy as np
from mpi4py import MPI

from . import dtypes as _dtypes
from . import executor as _executor
from . import ops as _ops
from ._kernels import ffi, lib
from .errors import MismatchError
from .poll import poll

# The bound: never more than this per rank in the window (header included).
MAX_WINDOW_BYTES = 32 << 20
# Largest slot: two slots and a header of up to 64 KiB (flags for 512 ranks).
MAX_SLOT_BYTES = (MAX_WINDOW_BYTES - (64 << 10)) // 2
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
SIG_WORDS = lib.MPICOLL_SHM_SIG_WORDS

# The executor's shared-memory step (shm.program) waits with this back-off.
_executor.use_shm(SPINS, YIELD_S, ROUND_S)


class _InCtl:
    """A window's counter kept in its struct mpicoll_shm_ctl (C memory:
    the executor's shared-memory step reads and moves it too)."""

    def __init__(self, field: str):
        self.field = field

    def __get__(self, w, owner=None):
        return self if w is None else getattr(w._ctl, self.field)

    def __set__(self, w, value) -> None:
        setattr(w._ctl, self.field, value)


class ShmWindow:
    """One shared window on a node communicator: ``slot(r, s)`` is rank r's
    slot s (2 slots per rank, ``slot_bytes`` each), as a uint8 array; a
    header before the slots holds the sync flags."""

    def __init__(self, local: MPI.Intracomm, slot_bytes: int, sync: str = "flags", ctl=None):
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
        self._mem, self._views = [], {}
        for r in range(local.Get_size()):
            mem, _ = self.win.Shared_query(r)
            self._mem.append(np.frombuffer(mem, np.uint8))
        self.local = local
        self.k, self.me = k, local.Get_rank()
        self.sync_mode = sync
        # The counters (turn, epoch, checks: properties below) live in C
        # memory, a struct mpicoll_shm_ctl (kernels.h): the communicator's
        # (shm_ctl) for the "flags" window, whose calls also run in C (the
        # executor's shared-memory step), a window's own otherwise.
        self._ctl = ctl if ctl is not None else ffi.new("struct mpicoll_shm_ctl *")
        self.turn = self.epoch = self.checks = 0  # a new window: flags at 0, slot 0 first
        flags = self._mem[0]
        if self.me == 0:
            flags[:self.header] = 0  # rank 0 clears the flags ...
        self._flags = ffi.from_buffer(flags)
        self._my_flag = ffi.cast("int64_t *", ffi.from_buffer(flags[self.me * FLAG_STRIDE:]))
        # Every rank's flag slot as int64 words: [counter, signature, signature].
        self._slots = np.frombuffer(flags[:self.header], np.int64).reshape(-1, FLAG_STRIDE // 8)[:k]
        # For C: every rank's slot of each turn, room for k sources, the flags.
        self._c_slots = [ffi.new("char *[]", [ffi.from_buffer(v) for v in self.slots(np.uint8)[s]]) for s in (0, 1)]
        self._c_srcs = ffi.new("const void *[]", k)
        c = self._ctl
        c.k, c.me, c.flags, c.stride = k, self.me, self._flags, FLAG_STRIDE
        c.slots0, c.slots1, c.srcs = self._c_slots[0], self._c_slots[1], self._c_srcs
        self._barrier_sync()  # ... before anyone uses a flag
        c.slot_bytes = slot_bytes  # (last: C takes calls from now on)
        global _serial
        _serial += 1
        self._serial = _serial
        _live[_serial] = self

    # The slot the next call uses, the sync points passed (the counters
    # start at 0) and the signature checks passed: the same on every rank.
    turn = _InCtl("turn")
    epoch = _InCtl("epoch")
    checks = _InCtl("checks")

    def slot(self, r: int, s: int) -> np.ndarray:
        start = self.header + s * self.slot_bytes
        return self._mem[r][start:start + self.slot_bytes]

    def slots(self, dtype) -> list:
        """``[[slot(r, s) as dtype for r in ranks] for s in (0, 1)]``, made
        once per dtype (the views cost microseconds a call otherwise)."""
        got = self._views.get(dtype)
        if got is None:
            got = self._views[dtype] = [[self.slot(r, s).view(dtype) for r in range(self.k)] for s in (0, 1)]
        return got

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
        # As Python ints: numpy's comparison and all() cost 20-50 us here
        # (measured at p=2 after a 1 MiB call) for eight words.
        seen = self._slots[:, lo:hi].tolist()
        want = list(sig)
        if all(row == want for row in seen):
            return
        raise mismatch(np.array(seen, np.int64), info, ctx)

    def _ibarrier(self):
        self.win.Sync()
        return self.local.Ibarrier()

    def sync_op(self, ctx):
        """One sync point as a schedule operation."""
        if self.sync_mode == "flags":
            return ctx.custom(_FlagSync(self))
        return ctx.native(self._barrier_sync, self._ibarrier)

    def free(self) -> None:
        c = self._ctl
        c.slot_bytes = 0  # (first: C takes no call from now on)
        c.flags = c.slots0 = c.slots1 = c.srcs = ffi.NULL
        self._mem, self._views = [], {}  # no view or pointer may outlive the memory
        self._flags = self._my_flag = self._slots = self._c_slots = None
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
    ``deadline`` (time.monotonic()) has passed.

    The one wait policy (poll.py) over rounds of the C wait: each round
    spins and backs off in C for at most ROUND_S with the GIL released (a
    Python poll would hold the GIL the peers' own waits may need); between
    rounds ``poll`` checks the deadline, and Python runs its signal handlers
    (KeyboardInterrupt)."""
    start = time.monotonic()
    spins = [SPINS]  # the first round spins before it yields; later ones go on where it left off

    def one_round() -> bool:
        now = time.monotonic()
        budget = ROUND_S if deadline is None else min(ROUND_S, deadline - now)
        if budget <= 0:
            return bool(lib.mpicoll_flag_test(flags, FLAG_STRIDE, k, epoch))
        yield_s = max(0.0, YIELD_S - (now - start))  # the back-off goes on where the last round left it
        reached = lib.mpicoll_flag_wait(flags, FLAG_STRIDE, k, epoch, spins[0], int(yield_s * 1e9),
                                        int(budget * 1e9))
        spins[0] = 0
        return bool(reached)

    # (spin_s=0, max_pause=0: the rounds are the spin and the back-off)
    return poll(one_round, deadline, spin_s=0.0, max_pause=0.0)


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


def mismatch(seen, info, ctx):
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


def window_key(sync: str) -> str:
    return "shm" if sync == SYNC else f"shm-{sync}"  # one window per sync mode (benchmarks compare them)


def shm_ctl(st):
    """The communicator's struct mpicoll_shm_ctl (kernels.h): its "flags"
    window's counters and pointers, and the calls queued and running on
    it; made once, kept across the window's replacements."""
    c = st.extra.get("shm-ctl")
    if c is None:
        c = st.extra["shm-ctl"] = ffi.new("struct mpicoll_shm_ctl *")
    return c


def _new(st, local, slot_bytes, sync):
    return ShmWindow(local, slot_bytes, sync, shm_ctl(st) if sync == SYNC else None)


def window(st, info, sync: str = "flags") -> ShmWindow:
    """The communicator's window, made (collectively) on first use."""
    key = window_key(sync)
    w = st.extra.get(key)
    if w is None:
        w = st.extra[key] = _new(st, info.local, FIRST_SLOT_BYTES, sync)
    return w


def grow(st, w: ShmWindow, nbytes: int) -> ShmWindow:
    """A window with slots of at least ``nbytes`` in place of ``w`` (collective).
    Called at the head of the queue, after a matching signature check: every
    rank of the node grows, and no call still uses the old window."""
    w.local.Barrier()  # every rank has read the signatures out of the old window's header
    w.free()
    slot = min(max(nbytes, 2 * w.slot_bytes), MAX_SLOT_BYTES)  # geometric growth: few re-allocations
    slot = -(-slot // 4096) * 4096  # MAX_SLOT_BYTES is a multiple of 4096 too
    new = st.extra[window_key(w.sync_mode)] = _new(st, w.local, slot, w.sync_mode)
    return new
