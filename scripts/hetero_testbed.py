"""hetero_ring against the plain ring on the namespace test bed, one host's link slower.

Run inside scripts/testbed.sh (one rank per host), which removes every
namespace and qdisc it made on exit:

    scripts/testbed.sh --hosts 4 --ppn 1 --mpiexec .venv/bin/mpiexec -- \\
        .venv/bin/python -m mpi4py scripts/hetero_testbed.py --slow h2 --slow-rate 1gbit --fast-rate 10gbit

Each host shapes its own veth (tb0, inside its namespace: the test bed's
ranks run as root there) with a token bucket: the host named by --slow to
--slow-rate, the others to --fast-rate. Then every algorithm runs --reps
times per size, and rank 0 prints the median of the slowest rank's times.
"""
from __future__ import annotations

import argparse
import socket
import subprocess
import time

import numpy as np
from mpi4py import MPI

from mpicoll import commstate as _comm
from mpicoll import plan as _plan
from mpicoll.algorithms.hetero_ring import weights_for_links


def shape(rate: str) -> None:
    subprocess.run(["tc", "qdisc", "replace", "dev", "tb0", "root", "tbf", "rate", rate, "burst", "256kb",
                    "latency", "100ms"], check=True)


def rate_bits(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f
    return float(rate)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slow", default="h2")
    ap.add_argument("--slow-rate", default="1gbit")
    ap.add_argument("--fast-rate", default="10gbit")
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    host = socket.gethostname()
    slow = host == args.slow
    shape(args.slow_rate if slow else args.fast_rate)
    comm.Barrier()
    # Known link speeds, the same list everywhere: what weights= would be told.
    seconds = comm.allgather(1 / rate_bits(args.slow_rate if slow else args.fast_rate))
    known = weights_for_links(seconds)
    cases = [("ring", {}), ("hetero_ring", {"weights": known}), ("hetero_ring", {"weights": "measure"})]
    if comm.rank == 0:
        print(f"p={comm.size}, host of each rank: {comm.allgather(host)}; slow {args.slow} at {args.slow_rate}, "
              f"others {args.fast_rate}; weights from the rates: {known}")
    else:
        comm.allgather(host)
    for size in args.sizes.split(","):
        nbytes = int(size[:-1]) << {"K": 10, "M": 20}[size[-1]]
        x = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(x)
        for name, knobs in cases:
            times = []
            for _ in range(args.reps + 1):  # the first run warms up (and measures, for "measure")
                comm.Barrier()
                t0 = time.perf_counter()
                _plan.allreduce(x, comm=comm, out=out, algorithm=name, knobs=dict(knobs)).run()
                times.append(comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
            assert float(out[0]) == comm.size
            label = name + ("" if not knobs else f"({'measured' if knobs['weights'] == 'measure' else 'rates'})")
            if knobs.get("weights") == "measure" and comm.rank == 0 and size == args.sizes.split(",")[0]:
                print(f"measured weights: {list(_comm.state(comm).extra['hetero_ring'])}")
            if comm.rank == 0:
                print(f"{size:>5} {label:<24} median {np.median(times[1:]) * 1e3:8.1f} ms  "
                      f"min {min(times[1:]) * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
