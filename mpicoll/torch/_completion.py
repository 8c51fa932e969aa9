"""Completing torch futures from mpicoll and MPI requests.

DDP's reducer waits for a bucket's ``torch.futures.Future`` in C++, and a
``Work``'s future is waited on the same way: nobody comes back to Python to
call ``test()``/``wait()``, so the requests must be driven to completion by
some other thread, and their completion reported to the future.

Both are the engine's job (mpicoll.engine, the single owner of progress):

* an ``MPI.Request`` (barrier, send, recv) is handed to the engine as soon
  as the Work is made (``adopt``), so from then on only the engine tests it
  (two threads must not test one MPI request);
* a future's completion is a done-callback (``Request.add_done_callback``),
  which runs on whichever thread completes the request, so a later request
  that completes first is not held back by an earlier one; adding it wakes
  the engine's progress thread, which then drives the request.

Without a progress thread (MPI without ``MPI_THREAD_MULTIPLE``, or
``MPICOLL_PROGRESS_THREAD=0``) nothing would drive a request that is waited
for in C++, so ``when_done`` waits for it at once, on the caller's thread:
the future is returned complete (correct, without overlap).

Requests are None when the work ran blocking and is already complete.
"""
from __future__ import annotations

from mpi4py import MPI

from .. import engine as _engine


def adopt(req):
    """``req`` as something the engine drives: mpicoll's requests as they
    are, an ``MPI.Request`` wrapped (engine.watch); None stays None."""
    if isinstance(req, MPI.Request):
        return _engine.watch(req)
    return req


def is_done(req) -> bool:
    return req is None or req.test()


def wait(req) -> None:
    """Wait for ``req``, advancing every outstanding mpicoll operation meanwhile."""
    if req is not None:
        req.wait()


def when_done(req, fn) -> None:
    """Call ``fn(error_or_None)`` once ``req`` (adopted) is complete, on some
    thread (at once, on this one, if it already is or if no progress
    thread would complete it)."""
    if req is None:
        fn(None)
        return
    if not _engine.progress_thread_active():
        try:
            req.wait()
        except BaseException as exc:  # handed to the future, raised where it is waited for
            fn(exc)
            return
        fn(None)
        return

    def done(r):
        try:
            r.wait()  # complete already: only raises its error, if any
        except BaseException as exc:
            fn(exc)
            return
        fn(None)

    req.add_done_callback(done)  # wakes the progress thread, which drives it
