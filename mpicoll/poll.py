"""One way to wait without blocking inside MPI: poll a test until it holds.

mpicoll waits this way wherever MPI's own blocking wait will not do: a
deadline to keep, other outstanding operations to advance while waiting, a
request the progress thread may also touch. Every such wait follows one
policy, written here once:

* advance (``advance()``: the engine's progress, or nothing), then test;
* spin - test back to back - for ``spin_s`` seconds, as MPI's own blocking
  waits spin: a peer a few microseconds away costs no sleep, whose wake-up
  costs 50-100 us on an idle machine and a whole scheduler slice (ms) on a
  loaded one;
* then sleep between tests, doubling from 20 us up to ``max_pause``: a peer
  late by more than that is not hurried by polling, and on an
  oversubscribed node it may need this core (``max_pause=0``: only yield
  the core, ``time.sleep(0)``, for waits that must stay hot);
* at ``deadline`` (``time.monotonic()``) raise ``expired()``, or return
  False when no ``expired`` is given (the caller hands the wait on).

The waits that use it: the blocking driver's wait for a batch and for a
custom operation (schedule.py), a request's ``wait()`` driving the engine
(engine.py), a set-up step under a deadline (commstate.wait_until), a torch
``Work.wait`` (torch/work.py), and shared-memory flag syncs
(shmwindow.wait_flags, whose ``test`` is one round of the C wait: it spins
and backs off with the GIL released, so the rounds replace ``spin_s`` and
``max_pause``). The progress thread is not a wait: it sleeps on a condition
until there is work and then tests everything outstanding (engine._run).
"""
from __future__ import annotations

import time

# How long a wait spins before it starts to sleep. The first version slept
# after a few polls, and the wake-up latency made small and medium
# all-reduces several times slower on a loaded node; a wait longer than this
# is a late or missing peer.
SPIN_S = 0.1
MIN_PAUSE = 20e-6
MAX_PAUSE = 1e-3


def poll(test, deadline=None, expired=None, *, advance=None, spin_s: float = SPIN_S,
         max_pause: float = MAX_PAUSE) -> bool:
    """Call ``advance()`` (if given) and ``test()`` until the test is true:
    True. At ``deadline``: raise ``expired()``, or return False without
    ``expired``. See the module docstring for the spin and back-off."""
    spin_end = None
    pause = 0.0
    while True:
        if advance is not None:
            advance()
        if test():
            return True
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            if expired is None:
                return False
            raise expired()
        if spin_end is None:
            spin_end = now + spin_s
        if now < spin_end:
            continue
        if max_pause <= 0:
            time.sleep(0)
        else:
            pause = min(max(pause * 2, MIN_PAUSE), max_pause)
            time.sleep(pause)
