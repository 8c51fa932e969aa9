"""Completing torch futures from mpicoll and MPI requests.

DDP's reducer waits for a communication hook's ``torch.futures.Future`` in
C++, and a ``Work``'s future is waited on the same way: nobody comes back to
Python to call ``test()``/``wait()``, so completion must be noticed on some
other thread:

* an ``mpicoll.Request`` while mpicoll's progress thread runs: its
  ``add_done_callback``; the progress thread advances the operation and
  calls back once it is complete (it wakes for this even for a short
  operation, see engine.Request.add_done_callback);
* otherwise (an ``MPI.Request`` from Ibarrier/Isend/Irecv, or the progress
  thread turned off): one waiter thread per process, which ``wait()``s for
  the requests in the order they were handed to it. mpicoll's ``wait()``
  advances every outstanding operation, so requests complete even without
  the progress thread.

Requests are None when the work ran blocking and is already complete.
"""
from __future__ import annotations

import queue
import threading

from mpi4py import MPI

from .. import engine as _engine


def is_done(req) -> bool:
    if req is None:
        return True
    if isinstance(req, MPI.Request):
        return req.Test()
    return req.test()


def wait(req) -> None:
    if req is None:
        return
    if isinstance(req, MPI.Request):
        req.Wait()
    else:
        req.wait()


class _Waiter:
    """One daemon thread that waits for requests in the order they were
    handed over and then runs their callbacks."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, req, fn) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="mpicoll-torch-waiter", daemon=True)
                self._thread.start()
        self._queue.put((req, fn))

    def _run(self) -> None:
        while True:
            req, fn = self._queue.get()
            try:
                wait(req)
                err = None
            except BaseException as exc:  # handed to the future, raised where it is waited for
                err = exc
            fn(err)


_waiter = _Waiter()


def when_done(req, fn) -> None:
    """Call ``fn(error_or_None)`` once ``req`` is complete, on some thread
    (at once, on this one, if it already is)."""
    if req is None:
        fn(None)
        return
    if isinstance(req, _engine.Request) and _engine.progress_thread_active():
        def done(r):
            try:
                r.wait()  # complete already: only raises its error, if any
            except BaseException as exc:
                fn(exc)
                return
            fn(None)
        req.add_done_callback(done)
        return
    _waiter.submit(req, fn)
