"""Compiled schedules: a schedule recorded once into a flat program.

A schedule generator (schedule.py) describes one rank's messages and
reductions; the drivers resume it step by step, which costs a few
microseconds of Python per message. For an algorithm whose messages do not
depend on the data (every point-to-point all-reduce except top-k; the
registry marks them ``compilable``), the sequence is the same at every call
of one signature (rank, size, count, dtype, op, knobs, in place or not), so
it is recorded once, when the kept plan is made, and replayed by the C
executor (csrc/executor.c through mpicoll/executor.py) with the call's
buffers bound in.

Recording runs the generator once against *stand-in* buffers of the call's
sizes, with a context that emits steps instead of posting messages and a
Reduction that emits steps instead of reducing: no MPI, no data. Every
array an operation names must lie inside one of the known regions (the
result buffer, the input, a scratch buffer the schedule asked its context
for) and be contiguous; anything else - an array the schedule made itself,
an MPI library call, a shared-memory flag, a sub-communicator - makes
recording fail with NotCompilable, and the call keeps the generator.
Copies must go through ``ctx.copy`` (a numpy assignment would not be seen):
that is the contract of ``compilable=True``, checked for every such
algorithm by tests/test_program.py, which compares the program with the
generator bit for bit at p = 1..9.

The program (executor.h has the step codes):

* ``steps``: int64 (n, 8): SEND/RECV (slot, region, offset, bytes, peer),
  WAIT (list index, k), REDUCE (dst, a, b as region/offset pairs, count),
  REDUCE_MANY (dst, list index, k, count), COPY (dst, src, bytes); SHM
  (window, list index of the signature, count, item size), the one step
  of the program shm.py writes for a one-chunk call (never recorded);
* ``lists``: the waits' (slot, expected bytes or -1 for a send) pairs and the
  k-way reductions' (region, offset) sources;
* ``scratch``: the byte size of each scratch region (region 2 + i);
* ``slots``: per slot (kind, peer, bytes, phase) for error messages.

``run_simulated`` interprets programs of all ranks in one process (the
semantics the C executor implements, and the simulated half of the
compiled-vs-generator test).
"""
from __future__ import annotations

import numpy as np

from . import schedule as _sched

SEND, RECV, WAIT, REDUCE, REDUCE_MANY, COPY, SHM = 1, 2, 3, 4, 5, 6, 7
WIDTH = 8
BUF, SRC = 0, 1

# Recording stops (NotCompilable) beyond this many steps: a program this long
# is a large p with a chatty algorithm, where per-message Python cost is
# small beside the messages themselves and the program's memory is not.
MAX_STEPS = 1 << 16
# Messages longer than this are left to the generator: the executor posts
# with int counts, and a message this long costs far more than its Python.
MAX_MESSAGE_BYTES = (1 << 31) - 1


class NotCompilable(Exception):
    """The schedule did something a program cannot replay (see the module docstring)."""


class Program:
    """One rank's recorded schedule (see the module docstring)."""

    __slots__ = ("steps", "lists", "scratch", "slots", "maxk", "nbytes", "has_src", "messages", "keep", "explain")

    def __init__(self, steps, lists, scratch, slots, maxk, nbytes, has_src, keep=None, explain=None):
        self.steps = np.array(steps, np.int64).reshape(-1, WIDTH)
        self.lists = np.array(lists if lists else [0], np.int64)
        self.scratch = tuple(scratch)
        self.slots = tuple(slots)
        self.maxk = maxk
        self.nbytes = nbytes
        self.has_src = has_src
        self.messages = len(slots)
        # A program an algorithm writes itself (registry ``program``: shm's
        # one step) may point outside its regions: ``keep`` owns that memory,
        # ``explain(status, ctx)`` gives the exception for its step's error
        # (executor ESHM); None for recorded programs.
        self.keep, self.explain = keep, explain

    def __repr__(self):
        return (f"<mpicoll.Program {len(self.steps)} steps, {self.messages} messages, "
                f"scratch {sum(self.scratch)} B>")


class _Recorder:
    def __init__(self, buf, src):
        self.bases = [buf, src]  # region -> base array (None: absent)
        self.steps = []
        self.lists = []
        self.slots = []
        self.maxk = 1
        self.ctx = None  # the recording context (for the current phase)

    def region_of(self, arr):
        """(region, byte offset) of contiguous array ``arr``."""
        if not isinstance(arr, np.ndarray) or not arr.flags.c_contiguous:
            raise NotCompilable("an operand is not a contiguous numpy array")
        ptr = arr.__array_interface__["data"][0]
        n = arr.nbytes
        for region, base in enumerate(self.bases):
            if base is None:
                continue
            b = base.__array_interface__["data"][0]
            if b <= ptr and ptr + n <= b + base.nbytes:
                return region, ptr - b
        if n == 0:
            return BUF, 0  # an empty view may point anywhere; it is never dereferenced
        raise NotCompilable("an operand lies outside the call's buffers and scratch")

    def step(self, *words):
        if len(self.steps) >= MAX_STEPS:
            raise NotCompilable(f"more than {MAX_STEPS} steps")
        self.steps.append(words + (0,) * (WIDTH - len(words)))

    def post(self, op):
        n = op.buf.nbytes
        if n > MAX_MESSAGE_BYTES:
            raise NotCompilable("a message longer than 2 GiB")
        region, off = self.region_of(op.buf)
        slot = len(self.slots)
        kind = SEND if op.kind == _sched.SEND else RECV
        self.slots.append((op.kind, op.peer, n, self.ctx.phase))
        self.step(kind, slot, region, off, n, op.peer)
        op.req = slot

    def wait(self, ops):
        pairs = []
        for op in ops:
            if op.kind not in (_sched.SEND, _sched.RECV):
                raise NotCompilable("the schedule waits for something other than a message")
            if op.req is None:
                self.post(op)
            if op.req is True:
                continue  # waited for already
            pairs += [op.req, op.buf.nbytes if op.kind == _sched.RECV else -1]
            op.req = True
        if pairs:
            self.step(WAIT, len(self.lists), len(pairs) // 2)
            self.lists += pairs

    def reduce(self, dst, a, b, itemsize):
        n = dst.nbytes
        if a.nbytes != n or b.nbytes != n:
            raise NotCompilable("combine() on arrays of different lengths")
        self.step(REDUCE, *self.region_of(dst), *self.region_of(a), *self.region_of(b), n // itemsize)

    def reduce_many(self, dst, srcs, itemsize):
        n = dst.nbytes
        if any(s.nbytes != n for s in srcs):
            raise NotCompilable("combine_many() on arrays of different lengths")
        at = len(self.lists)
        for s in srcs:
            self.lists += list(self.region_of(s))
        self.maxk = max(self.maxk, len(srcs))
        self.step(REDUCE_MANY, *self.region_of(dst), at, len(srcs), n // itemsize)

    def copy(self, dst, src):
        if dst.nbytes != src.nbytes:
            raise NotCompilable("copy() between arrays of different lengths")
        self.step(COPY, *self.region_of(dst), *self.region_of(src), dst.nbytes)


class _RecordingContext(_sched.Context):
    __slots__ = ("rec",)

    def post_op(self, op):
        self.rec.post(op)

    def copy(self, dst, src):
        self.rec.copy(dst, src)

    def scratch(self, name, n, dtype):
        before = self.pool.get(name)
        arr = _sched.scratch(self.pool, name, n, dtype)
        base = self.pool[name]
        if base is not before:  # a new (or grown) buffer: a new region
            self.rec.bases.append(base)
        return arr

    def native(self, blocking, start):
        raise NotCompilable("the MPI library's own collective")

    def custom(self, obj):
        raise NotCompilable("a shared-memory wait")

    def sub(self, st):
        raise NotCompilable("a sub-communicator")


class _RecordingReduction:
    """What a recorded schedule combines with: records, computes nothing."""

    def __init__(self, red, rec):
        self.op, self.dtype = red.op, red.dtype
        self._rec, self._itemsize = rec, red.dtype.itemsize

    def combine(self, dst, a, b):
        self._rec.reduce(dst, a, b, self._itemsize)

    def combine_many(self, dst, srcs):
        self._rec.reduce_many(dst, list(srcs), self._itemsize)

    def finish(self, buf, size):
        raise NotCompilable("finish() inside a schedule")


def for_entry(entry, st, n: int, storage, red, has_src: bool, knobs) -> "Program | None":
    """The program of registered algorithm ``entry`` for this signature: the
    one it writes itself (registry ``program``: shm's), else its schedule
    recorded (``compilable``); None where it has neither or the recording
    fails (NotCompilable): the schedule runs the calls."""
    try:
        if entry.program is not None:
            return entry.program(st, n, storage, red, has_src, **knobs)
        if entry.compilable:
            return record(entry.schedule, st, n, storage, red, has_src, knobs)
    except NotCompilable:
        pass
    return None


def record(schedule, st, n: int, storage, red, has_src: bool, knobs=None) -> Program:
    """Record ``schedule(ctx, buf, red, src, **knobs)`` (an all-reduce-shaped
    schedule) for rank ``st.rank`` of ``st.size``, ``n`` elements of numpy
    dtype ``storage``, out of place when ``has_src``. Raises NotCompilable."""
    buf = np.zeros(n, storage)
    src = np.zeros(n, storage) if has_src else None
    rec = _Recorder(buf, src)
    ctx = _RecordingContext(st, 0, {}, ("recording", "?", buf.nbytes, 0))
    ctx.rec = rec
    rec.ctx = ctx
    gen = schedule(ctx, buf, _RecordingReduction(red, rec), src, **(knobs or {}))
    try:
        ops = next(gen)
        while True:
            if ops:
                rec.wait(ops)
            ops = gen.send(None)
    except StopIteration:
        pass
    finally:
        gen.close()
    scratch = [base.nbytes for base in rec.bases[2:]]
    return Program(rec.steps, rec.lists, scratch, rec.slots, rec.maxk, buf.nbytes, has_src)


# ---- the reference interpreter, all ranks in one process (tests) ------------------

def run_simulated(programs, bufs, srcs, red) -> None:
    """Run rank r's ``programs[r]`` on ``bufs[r]``/``srcs[r]`` for every rank
    at once, messages matched per (source, destination) in posting order as
    MPI does within one tag; raises RuntimeError on a deadlock, or
    MismatchError-like RuntimeError on a size mismatch."""
    p = len(programs)
    queues = {}  # (src, dst) -> [bytes]
    posted = {}  # (src, dst) -> [(rank, slot, array)]
    done = [set() for _ in range(p)]
    pcs = [0] * p
    regions = []
    for r, prog in enumerate(programs):
        regs = [bufs[r].reshape(-1).view(np.uint8), None if srcs[r] is None else srcs[r].reshape(-1).view(np.uint8)]
        regs += [np.zeros(nb, np.uint8) for nb in prog.scratch]
        regions.append(regs)

    def at(r, region, off, nbytes):
        return regions[r][region][off:off + nbytes]

    def deliver(dst_rank, slot, target, data):
        if data.nbytes != target.nbytes:
            raise RuntimeError(f"rank {dst_rank}: expected {target.nbytes} bytes, got {data.nbytes}")
        target[...] = data
        done[dst_rank].add(slot)

    def typed(r, region, off, count):
        return at(r, region, off, count * red.dtype.itemsize).view(bufs[r].dtype)

    live = set(range(p))
    while live:
        moved = False
        for r in sorted(live):
            prog = programs[r]
            while pcs[r] < len(prog.steps):
                s = prog.steps[pcs[r]]
                code = s[0]
                if code == SEND:
                    data = at(r, s[2], s[3], s[4]).copy()
                    waiting = posted.get((r, int(s[5])))
                    if waiting:
                        deliver(*waiting.pop(0), data)
                    else:
                        queues.setdefault((r, int(s[5])), []).append(data)
                    done[r].add(int(s[1]))
                elif code == RECV:
                    target = at(r, s[2], s[3], s[4])
                    q = queues.get((int(s[5]), r))
                    if q:
                        deliver(r, int(s[1]), target, q.pop(0))
                    else:
                        posted.setdefault((int(s[5]), r), []).append((r, int(s[1]), target))
                elif code == WAIT:
                    pairs = prog.lists[s[1]:s[1] + 2 * s[2]]
                    if not all(int(slot) in done[r] for slot in pairs[0::2]):
                        break
                elif code == REDUCE:
                    n = int(s[7])
                    red.combine(typed(r, s[1], s[2], n), typed(r, s[3], s[4], n), typed(r, s[5], s[6], n))
                elif code == REDUCE_MANY:
                    n, k = int(s[5]), int(s[4])
                    pairs = prog.lists[s[3]:s[3] + 2 * k]
                    red.combine_many(typed(r, s[1], s[2], n),
                                     [typed(r, pairs[2 * i], pairs[2 * i + 1], n) for i in range(k)])
                elif code == COPY:
                    at(r, s[1], s[2], s[5])[...] = at(r, s[3], s[4], s[5]).copy()
                else:
                    raise RuntimeError(f"unknown step code {code}")
                pcs[r] += 1
                moved = True
            if pcs[r] == len(prog.steps):
                live.discard(r)
        if not moved and live:
            raise RuntimeError(f"simulated programs deadlock at steps {[pcs[r] for r in sorted(live)]}")
