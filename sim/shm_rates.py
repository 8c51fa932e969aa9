"""One rank's copy rate beyond the caches: the platform files' mpicoll.copy_Bps.

    python sim/shm_rates.py        # prints bytes copied per second (best of 20) at 1, 8, 64 MiB

The shm pipeline copies each chunk into the window and the result out of
it (numpy slice assignment); 64 MiB float32 is beyond this machine's
caches, as the reduction rate (mpicoll.reduce_Bps, make bench-kernels
--mib 64) is.
"""
import time

import numpy as np


def copy_rate(mib: int, repeat: int = 20) -> float:
    a = np.ones(mib * (1 << 20) // 4, np.float32)
    b = np.empty_like(a)
    b[...] = a  # first touch
    best = min(_timed(a, b) for _ in range(repeat))
    return a.nbytes / best


def _timed(a, b) -> float:
    t = time.perf_counter()
    b[...] = a
    return time.perf_counter() - t


if __name__ == "__main__":
    for mib in (1, 8, 64):
        print(f"{mib:>3} MiB: {copy_rate(mib) / 1e9:.2f} GB/s copied by one rank")
