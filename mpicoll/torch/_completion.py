"""Completing torch futures from mpicoll and MPI requests.

DDP's reducer waits for a bucket's ``torch.futures.Future`` in C++, and a
``Work``'s future is waited on the same way: nobody comes back to Python to
call ``test()``/``wait()``, so the requests must be driven to completion by
some other thread, and their completion reported to the future.

* Reporting: an mpicoll request's callback
  (``mpicoll.Request.add_done_callback``) runs as soon as the request
  completes, on whichever thread completes it, so a later request that
  completes first is not held back by an earlier one. An ``MPI.Request``
  (barrier, send, recv) is reported by the waiter below once it completes.
* Driving: one waiter thread per process takes the requests in the order
  they were handed over (``drive``): it polls each without pause for up to
  a millisecond, then hands a still outstanding mpicoll request to mpicoll's
  progress thread and moves on. While it polls an ``MPI.Request`` it
  advances mpicoll's operations too, so that a receive cannot block the
  progress of a collective that its sender waits for.

Why not leave it all to mpicoll's progress thread: that thread sleeps
between polls when nothing moves (up to 200 us) so that a computing caller
keeps its cores, and each request handed to it costs a wake-up; for a short
operation that someone is already blocked on, both are pure delay. Measured
at p=2 on this 2-core machine, DDP step of a 0.2 MB model without a hook:
2.2-5.2 ms with the progress thread completing every future, 1.4-1.7 ms
with the waiter (gloo: 2.0-3.3 ms in the same runs). A waiter that polled
without pause until completion was as fast there, but with 4 ranks on the
two cores (test bed, 4.5 MB of gradients, buckets sent while the backward
pass computes) it made the steps 10-60 % slower: hence the hand-over after
``SPIN_S``.

Requests are None when the work ran blocking and is already complete.
"""
from __future__ import annotations

import queue
import threading
import time

from mpi4py import MPI

from .. import engine as _engine

# How long the waiter polls a request without pause before it hands it to
# the progress thread (see drive()).
SPIN_S = 1e-3


def is_done(req) -> bool:
    if req is None:
        return True
    if isinstance(req, MPI.Request):
        return req.Test()
    return req.test()


def wait(req) -> None:
    """Wait for ``req`` (mpicoll's or MPI's), advancing every outstanding
    mpicoll operation meanwhile (polling without pause)."""
    if req is None:
        return
    if isinstance(req, _engine.Request):
        req.wait()
        return
    polls = 0
    while not req.Test():
        _engine.progress()  # mpicoll's operations advance while an MPI request is waited for
        polls += 1
        if polls > _engine.SPIN_POLLS:
            time.sleep(0)


def drive(req) -> None:
    """What the waiter does with a request whose completion a callback
    reports: poll it without pause for up to ``SPIN_S``, then, if it is
    still outstanding, hand it over and move on: an mpicoll request to
    mpicoll's progress thread (engine.drive), which sleeps between polls
    when nothing moves, leaving the cores to a computing caller. An
    ``MPI.Request`` (a receive may wait long for its sender) is polled
    further with pauses, 10 us at first, doubling up to 200 us.

    The first millisecond covers a short operation, which then completes
    without a hand-over; a long one (a large bucket sent while the backward
    pass computes) is not polled hot for its whole length. Measured with 4
    ranks on this 2-core machine (test bed, 4.5 MB of gradients): polling
    hot to the end made DDP steps 10-60 % slower than the progress thread."""
    if isinstance(req, _engine.Request):
        _engine.drive(req, SPIN_S)
        return
    start = time.monotonic()
    pause = 0.0
    while not req.Test():
        _engine.progress()  # mpicoll's operations advance while an MPI request is waited for
        if pause or time.monotonic() - start > SPIN_S:
            pause = min(max(2 * pause, 10e-6), 200e-6)
            time.sleep(pause)


class _Waiter:
    """One daemon thread that waits for requests in the order they were
    handed over (and so drives progress); ``fn`` is called once a request
    completes, with its error or None."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, req, fn=None) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpicoll-torch-waiter", daemon=True)
                self._thread.start()
        self._queue.put((req, fn))

    def _run(self) -> None:
        while True:
            req, fn = self._queue.get()
            try:
                drive(req)
                if fn is not None:
                    wait(req)  # complete: raises its error, if any
                err = None
            except BaseException as exc:  # handed to the future, raised where it is waited for
                err = exc
            if fn is not None:
                fn(err)


_waiter = _Waiter()


def when_done(req, fn) -> None:
    """Call ``fn(error_or_None)`` once ``req`` is complete, on some thread
    (at once, on this one, if it already is)."""
    if req is None:
        fn(None)
        return
    if isinstance(req, _engine.Request):
        def done(r):
            try:
                r.wait()  # complete already: only raises its error, if any
            except BaseException as exc:
                fn(exc)
                return
            fn(None)
        # The waiter drives it (no need to wake the progress thread); the
        # callback reports completion, whichever thread gets there.
        req.add_done_callback(done, wake=False)
        _waiter.submit(req)
        return
    _waiter.submit(req, fn)
