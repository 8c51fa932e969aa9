"""Nonblocking all-reduce: ``iallreduce`` returns a request; the work runs
while the caller computes.

How it works
------------
Each algorithm is a *state machine* written as a Python generator: it posts
nonblocking point-to-point calls (``Isend``/``Irecv``, or one native
``Iallreduce``), yields the list of MPI requests it needs before it can go
on, and is resumed (with their statuses) once they have all completed; in
between it reduces with the C kernels. A generator is the state machine:
its local variables are the state and each ``yield`` is a transition, which
keeps the code as readable as the blocking algorithm it mirrors.

Operations are advanced by ``progress()``:

* on every ``Request.test()`` and ``Request.wait()`` (``wait`` loops on it);
* by a background progress thread, when the MPI library was initialised with
  ``MPI_THREAD_MULTIPLE`` (mpi4py asks for it by default; the MPICH and Open
  MPI wheels both grant it). It runs only while operations are outstanding,
  so communication advances while the caller computes. It is on by default;
  ``MPICOLL_PROGRESS_THREAD=0`` or ``set_progress_thread(False)`` turns it
  off, and then progress happens only inside test()/wait() (and inside the
  MPI library whenever the caller makes other MPI calls).

``progress()`` always advances *every* outstanding operation, not only the
one being waited for: another rank may be waiting for a different operation
whose next message this rank has not posted yet, and waiting for ours alone
would deadlock.

Keeping operations apart
------------------------
Nonblocking operations travel on a second private duplicate of the
communicator (the blocking algorithms use fixed tags on the first one, see
``algorithms/common.py``), and each operation gets its own tag from a
per-communicator sequence number. Every rank starts collective operations in
the same order (MPI's rule for collectives), so all ranks give an operation
the same tag, and MPI never matches messages with different tags: several
outstanding operations on one communicator never cross, whatever order
they are completed in. Each operation owns its scratch buffers (never the
shared ``st.scratch``, which blocking calls reuse).

Thread safety: all MPI requests and generator steps of all operations are
touched only under one process-wide lock, so the progress thread and the
caller's test()/wait() never run a step concurrently.

The caller must not modify the input, nor read or modify ``out``, until the
request is complete (as with ``MPI_Iallreduce``).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from . import buffers
from .algorithms.common import BYTE, Fold, block_bounds, split_range
from .comm import check_intracomm, state

ENV_ALGORITHM = "MPICOLL_ALGORITHM"

ENV_PROGRESS_THREAD = "MPICOLL_PROGRESS_THREAD"

# Tags on the nonblocking duplicate: one per operation, recycled after
# TAG_SPAN operations (MPI guarantees tags up to 32767 everywhere).
TAG_BASE = 1
TAG_SPAN = 32000

# How often (seconds) the interpreter hands the GIL to the progress thread
# while operations are outstanding (see _Engine._run).
SWITCH_INTERVAL = 100e-6

# Ring pipelining: segments of at most this many bytes, so each reduced
# segment is forwarded at once instead of after its whole block.
SEGMENT_BYTES = 1 << 20


# ---- per-communicator state ---------------------------------------------------

class _NBState:
    """The second private duplicate and the operation counter of one communicator."""

    def __init__(self, st):
        self.comm = st.comm.Dup()  # collective: every rank reaches it in its first iallreduce
        self.rank = st.rank
        self.size = st.size
        self.seq = 0

    def next_tag(self) -> int:
        tag = TAG_BASE + self.seq % TAG_SPAN
        self.seq += 1
        return tag

    def free(self) -> None:
        if self.comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self.comm.Free()


def _nb_state(comm) -> _NBState:
    st = state(comm)
    nb = st.extra.get("nonblocking")
    if nb is None:
        nb = st.extra["nonblocking"] = _NBState(st)
    return nb


# ---- the state machines -------------------------------------------------------

def _check_count(status: MPI.Status, want: int, source: int, what: str) -> None:
    got = status.Get_count(BYTE)
    if got != want:
        raise RuntimeError(f"mpicoll: iallreduce {what}: expected {want} bytes from rank {source}, got {got}: "
                           "the ranks disagree on the message size")


def ring(nb, buf, red, src, tag):
    """Ring all-reduce as a state machine (the schedule is algorithms/ring.py's).

    Description:  Reduce-scatter: every block is cut into segments of at most
                  SEGMENT_BYTES; a segment received from the left is combined
                  and forwarded to the right at once. Receive slots are
                  double-buffered per step, so the next step's segments can
                  already arrive. Allgather: p-1 whole-block exchanges.
    Cost:         as the blocking ring, 2 (p-1) alpha + 2 (p-1)/p n beta +
                  (p-1)/p n gamma, plus one state-machine step (a Python-level
                  poll) per segment and step; 2 n/p bytes of scratch per
                  operation.
    Limitations:  fewer elements than ranks: recursive doubling instead. The
                  reduction order differs from block to block (every rank
                  still ends with the same bits); it is the blocking ring's
                  order, so both give the same bits."""
    p, r, comm = nb.size, nb.rank, nb.comm
    if buf.size < p:
        yield from recursive_doubling(nb, buf, red, src, tag)
        return
    own = buf if src is None else src
    right, left = (r + 1) % p, (r - 1) % p
    bounds = block_bounds(buf.size, p)
    longest = max(b - a for a, b in bounds)
    nseg = max(1, -(-longest * buf.itemsize // SEGMENT_BYTES))
    segs = [split_range(a, b, nseg) for a, b in bounds]
    # Two receive slots of one block each, owned by this operation.
    slots = np.empty((2, longest), buf.dtype)

    def post_recvs(step):
        block = segs[(r - step - 2) % p]
        base = block[0][0]
        return [comm.Irecv([slots[step % 2][a - base:b - base], BYTE], left, tag) for a, b in block]

    sends = [comm.Isend([own[a:b], BYTE], right, tag) for a, b in segs[(r - 1) % p]]
    pending = {0: post_recvs(0)}
    if p > 2:
        pending[1] = post_recvs(1)
    for step in range(p - 1):
        block = segs[(r - step - 2) % p]
        base = block[0][0]
        recvs = pending.pop(step)
        for j, (a, b) in enumerate(block):
            (status,) = yield [recvs[j]]
            _check_count(status, (b - a) * buf.itemsize, left, f"ring step {step}")
            mine = buf[a:b]
            red.combine(mine, slots[step % 2][a - base:b - base], own[a:b])  # partial from the left, then ours
            if step < p - 2:  # this segment is what the right neighbour reduces next
                sends.append(comm.Isend([mine, BYTE], right, tag))
        if step + 2 < p - 1:  # this step's slot is free again
            pending[step + 2] = post_recvs(step + 2)
    # The allgather overwrites blocks that the sends above may still be reading.
    yield sends
    for step in range(p - 1):
        sa, sb = bounds[(r - step) % p]
        ra, rb = bounds[(r - step - 1) % p]
        rreq = comm.Irecv([buf[ra:rb], BYTE], left, tag)
        sreq = comm.Isend([buf[sa:sb], BYTE], right, tag)
        status, _ = yield [rreq, sreq]
        _check_count(status, (rb - ra) * buf.itemsize, left, f"ring allgather step {step}")



def recursive_doubling(nb, buf, red, src, tag):
    """Recursive doubling as a state machine (the schedule is
    algorithms/recursive_doubling.py's, with the fold to a power of two).

    Cost:         ceil(log2 p) (alpha + n beta + n gamma), plus the fold's
                  2 alpha + 2 n beta + n gamma when p is not a power of two;
                  n bytes of scratch per operation.
    Limitations:  moves the whole vector every round: for short messages.
                  Both partners combine the same operands in the same order,
                  so every rank ends with the same bits."""
    if src is not None:
        buf[...] = src
    comm = nb.comm
    fold = Fold(nb.rank, nb.size)
    tmp = np.empty_like(buf)  # this operation's own receive buffer
    nbytes = buf.nbytes
    if nb.rank < 2 * fold.rem:  # fold in
        if fold.newrank < 0:
            yield [comm.Isend([buf, BYTE], nb.rank + 1, tag)]
        else:
            (status,) = yield [comm.Irecv([tmp, BYTE], nb.rank - 1, tag)]
            _check_count(status, nbytes, nb.rank - 1, "fold-in")
            red.combine(buf, tmp, buf)
    if fold.newrank >= 0:
        mask = 1
        while mask < fold.pof2:
            partner = fold.newrank ^ mask
            peer = fold.real(partner)
            status, _ = yield [comm.Irecv([tmp, BYTE], peer, tag), comm.Isend([buf, BYTE], peer, tag)]
            _check_count(status, nbytes, peer, "recursive doubling")
            if partner < fold.newrank:
                red.combine(buf, tmp, buf)
            else:
                red.combine(buf, buf, tmp)
            mask <<= 1
    if nb.rank < 2 * fold.rem:  # fold out
        if fold.newrank < 0:
            (status,) = yield [comm.Irecv([buf, BYTE], nb.rank + 1, tag)]
            _check_count(status, nbytes, nb.rank + 1, "fold-out")
        else:
            yield [comm.Isend([buf, BYTE], nb.rank - 1, tag)]


def native(nb, buf, red, src, tag):
    """The MPI library's own MPI_Iallreduce on the nonblocking duplicate
    (predefined MPI datatypes only; avg is a sum here, scaled afterwards)."""
    mpitype = red.dtype.mpi
    yield [nb.comm.Iallreduce(MPI.IN_PLACE if src is None else [src, mpitype], [buf, mpitype], red.op.mpi)]


ALGORITHMS = {"mpi": native, "recursive_doubling": recursive_doubling, "ring": ring}

# Below this, the few messages of recursive doubling beat the ring's 2(p-1) steps.
SMALL_MESSAGE_BYTES = 64 << 10


def names() -> list:
    """Names accepted by iallreduce's ``algorithm=`` ('auto' first)."""
    return ["auto"] + sorted(ALGORITHMS)


def choose(p: int, nbytes: int, native_dtype: bool) -> str:
    """What "auto" runs: MPI's own Iallreduce when MPI can reduce the dtype
    (advanced by the same progress thread as the others), else recursive
    doubling for short and the ring for long messages."""
    if native_dtype:
        return "mpi"
    return "recursive_doubling" if nbytes <= SMALL_MESSAGE_BYTES else "ring"


# ---- requests and the progress engine -----------------------------------------

class Request:
    """An outstanding ``iallreduce``. ``wait()`` returns the result array;
    ``test()`` says whether it is complete (and advances every outstanding
    operation). ``Wait()``/``Test()`` are mpi4py-style aliases."""

    def __init__(self, result, machine, finish):
        self.result = result
        self._machine = machine
        self._finish = finish  # called once, after the last step (avg's scaling)
        self._reqs = []
        self._statuses = []
        self._error = None
        self._done = threading.Event()

    # Called with the engine lock held.
    def _start(self) -> None:
        self._step(None)

    def _step(self, statuses) -> None:
        try:
            reqs = self._machine.send(statuses)
        except StopIteration:
            self._finish()
            self._complete()
            return
        except BaseException as exc:  # reported by wait()/test() on the caller's thread
            self._error = exc
            self._complete()
            return
        self._reqs = list(reqs)
        self._statuses = [MPI.Status() for _ in self._reqs]

    def _complete(self) -> None:
        self._reqs, self._statuses, self._machine = [], [], None
        self._done.set()

    def _advance(self) -> int:
        """Run as many steps as the completed requests allow; returns how
        many ran (-1 once the operation is complete)."""
        steps = 0
        while not self._done.is_set():
            try:
                ready = MPI.Request.Testall(self._reqs, self._statuses)
            except BaseException as exc:
                self._error = exc
                self._complete()
                break
            if not ready:
                return steps
            self._step(self._statuses)
            steps += 1
        return -1

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def test(self) -> bool:
        if not self._done.is_set():
            _engine.progress()
        if self._done.is_set():
            self._raise()
            return True
        return False

    def wait(self):
        _engine.wait(self)
        self._raise()
        return self.result

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def Test(self, status=None) -> bool:  # noqa: N802 (mpi4py's spelling)
        return self.test()

    def Wait(self, status=None):  # noqa: N802
        self.wait()
        return True

    def __repr__(self):
        return f"<mpicoll.Request {'complete' if self.done else 'pending'}>"


class _Engine:
    """The process-wide list of outstanding operations and the progress thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active = []
        self.wake = threading.Condition(self.lock)
        self.waiters = 0  # threads blocked in wait(): the progress thread then polls without pausing
        self.thread = None
        self.stopping = False
        self.enabled = os.environ.get(ENV_PROGRESS_THREAD, "1").strip().lower() not in ("0", "false", "no", "off")

    def thread_available(self) -> bool:
        return MPI.Is_initialized() and not MPI.Is_finalized() and MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def start(self, req: Request) -> None:
        with self.lock:
            req._start()
            if not req.done:
                self.active.append(req)
                if self.use_thread():
                    self.wake.notify()
        if self.use_thread() and self.thread is None:
            self._spawn()

    def use_thread(self) -> bool:
        return self.enabled and not self.stopping and self.thread_available()

    def _spawn(self) -> None:
        with self.lock:
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name="mpicoll-progress", daemon=True)
            self.thread.start()

    def _progress_locked(self) -> bool:
        moved = False
        still = []
        for req in self.active:
            steps = req._advance()
            moved = moved or steps != 0
            if steps >= 0:
                still.append(req)
        self.active = still
        return moved

    def progress(self) -> None:
        with self.lock:
            if self.active:
                self._progress_locked()

    def wait(self, req: Request) -> None:
        if req.done:
            return
        if self.thread is not None and self.use_thread():
            # The progress thread polls without pausing while someone waits.
            with self.lock:
                self.waiters += 1
                self.wake.notify()
            try:
                while not req._done.wait(0.05):
                    if not (self.thread.is_alive() and self.use_thread()):
                        break
            finally:
                with self.lock:
                    self.waiters -= 1
        while not req.done:
            with self.lock:
                self._progress_locked()
            if not req.done:
                time.sleep(0)  # let other threads (and MPI's) run

    def _run(self) -> None:
        pause = 0.0
        normal = sys.getswitchinterval()
        while True:
            with self.lock:
                if not self.stopping and (not self.active or not self.enabled):
                    sys.setswitchinterval(normal)
                    while not self.stopping and (not self.active or not self.enabled):
                        pause = 0.0
                        self.wake.wait()
                    # A computing caller releases the GIL inside every numpy
                    # loop but takes it straight back; a waiting thread only
                    # gets it when the interpreter forces a switch, by default
                    # after 5 ms. While operations are outstanding, force it
                    # after SWITCH_INTERVAL so that the progress thread gets a
                    # turn about that often.
                    normal = sys.getswitchinterval()
                    sys.setswitchinterval(min(normal, SWITCH_INTERVAL))
                if self.stopping:
                    sys.setswitchinterval(normal)
                    return
                moved = self._progress_locked()
                hurry = self.waiters > 0
            # Poll fast while things move or someone waits; otherwise back off
            # to at most 200 us so a computing caller keeps its cores.
            if moved or hurry:
                pause = 0.0
                time.sleep(0)
            else:
                pause = min(max(pause * 2, 10e-6), 200e-6)
                time.sleep(pause)

    def stop(self) -> None:
        """Stop the thread (before MPI_Finalize: atexit runs this first)."""
        with self.lock:
            self.stopping = True
            self.wake.notify_all()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)


_engine = _Engine()
atexit.register(_engine.stop)  # registered after mpi4py's finalizer, so it runs before it


def set_progress_thread(enabled: bool) -> None:
    """Turn the background progress thread on or off (default: on where
    MPI_THREAD_MULTIPLE is available; env ``MPICOLL_PROGRESS_THREAD=0``)."""
    with _engine.lock:
        _engine.enabled = bool(enabled)
        _engine.wake.notify_all()


def progress_thread_active() -> bool:
    """Whether iallreduce operations are advanced by the background thread."""
    return _engine.use_thread()


def progress() -> None:
    """Advance every outstanding nonblocking operation once."""
    _engine.progress()


def waitall(requests) -> list:
    """Wait for every request (mpicoll's or mpi4py's); returns their results
    (None for MPI requests), in order."""
    requests = list(requests)
    results = []
    for req in requests:
        if isinstance(req, Request):
            results.append(req.wait())
        elif isinstance(req, MPI.Request):
            req.Wait()
            results.append(None)
        else:
            raise TypeError(f"mpicoll: waitall takes requests, not {type(req).__name__}")
    return results


def start(comm, flat, red, src, name, result, nbytes_for_choice=None) -> Request:
    """Start an all-reduce of storage array ``flat`` (``src`` the input when
    out of place) and register it with the engine. ``name`` is validated."""
    st = state(comm)
    if st.size == 1:
        if src is not None:
            flat[...] = src
        red.finish(flat, 1)
        req = Request(result, iter(()), lambda: None)
        req._complete()
        return req
    nb = _nb_state(comm)
    if name == "auto":
        name = choose(st.size, flat.nbytes, red.dtype.mpi is not None)
    if name == "mpi" and red.dtype.mpi is None:
        raise ValueError(f"mpicoll: algorithm 'mpi' needs an MPI datatype; {red.dtype.name} has none")
    tag = nb.next_tag()
    machine = ALGORITHMS[name](nb, flat, red, src, tag)
    req = Request(result, machine, lambda: red.finish(flat, st.size))
    _engine.start(req)
    return req


def iallreduce(x, op="sum", *, comm=None, out=None, algorithm="auto", dtype=None) -> Request:
    """Start an all-reduce of ``x`` across ``comm``; returns a Request.

    Same arguments as ``mpicoll.allreduce``; ``algorithm`` is "auto" or one
    of ``mpicoll.nonblocking.names()`` ("mpi", "recursive_doubling",
    "ring"). ``req.wait()`` returns ``out`` (a new array if None). Do not
    touch ``x`` or ``out`` before the request completes.
    """
    from .api import _reduction  # the cached (op, dtype) kernels

    arr, dt = buffers.as_reducible(x, dtype)
    red = _reduction(op, dt)
    if not isinstance(algorithm, str):
        raise TypeError(f"mpicoll: algorithm must be a name, not {type(algorithm).__name__}")
    forced = os.environ.get(ENV_ALGORITHM)
    if forced in ALGORITHMS and (forced != "mpi" or dt.mpi is not None):  # forces where it applies
        algorithm = forced
    if algorithm not in ALGORITHMS and algorithm != "auto":
        raise ValueError(f"mpicoll: unknown iallreduce algorithm {algorithm!r}; known: {', '.join(names())}")
    if algorithm == "mpi" and dt.mpi is None:
        raise ValueError(f"mpicoll: algorithm 'mpi' needs an MPI datatype; {dt.name} has none")
    comm = check_intracomm(comm)
    result = buffers.output(out, arr.shape, arr.dtype)
    flat = buffers.storage(result, dt)
    src = None if buffers.same_memory(result, arr) else buffers.storage(arr, dt)
    return start(comm, flat, red, src, algorithm, result)
