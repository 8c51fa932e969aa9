"""Bucketed gradient all-reduce against one all-reduce per gradient.

    mpiexec -n 4 python -m mpi4py -m mpicoll.bench bucketing [--mib 50] [--repeat 5]

The gradient set imitates a convolutional network's: 64 small arrays (biases
and normalisation parameters, 64-2048 floats), 64 medium ones (convolution
weights, 16K-256K floats, log-uniform) and as many 2M-float arrays as it
takes to reach ``--mib`` MiB in all; float32, sum.

Timed (slowest rank, best of ``--repeat``; the machine may be shared):

  per-array            mpicoll.allreduce on each gradient in turn (blocking)
  per-array nonblock   mpicoll.iallreduce on each gradient, then waitall
  bucketed (copy)      GradientBucketer over the arrays: copy in, fused
                       iallreduce per 25 MiB bucket, copy out
  bucketed (views)     the same with the gradients living in the buckets
  one buffer           a single all-reduce of all the bytes (the floor)

Then the overlap: a stand-in backward pass (memory-bound numpy work
proportional to each gradient's size, last gradient first) run alone, the
bucketed all-reduce alone, and the two together with ``mark_ready`` after
each gradient; ``hidden`` is the share of the all-reduce time that the
combined run did not add to the compute time.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import mpicoll


def gradient_sizes(total_mib=50.0, seed=0):
    rng = np.random.default_rng(seed)
    small = rng.integers(64, 2049, 64)
    medium = np.exp(rng.uniform(np.log(1 << 14), np.log(1 << 18), 64)).astype(np.int64)
    sizes = [int(s) for s in np.concatenate([small, medium])]
    left = int(total_mib * (1 << 20)) // 4 - sum(sizes)
    while left > 0:
        sizes.append(min(left, 1 << 21))
        left -= sizes[-1]
    order = rng.permutation(len(sizes))  # layers of all sizes interleaved, as in a network
    return [sizes[i] for i in order]


def _best(comm, fn, repeat):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
    return best


def run(comm, total_mib, repeat, work):
    sizes = gradient_sizes(total_mib)
    rng = np.random.default_rng(comm.rank)
    grads = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    flat = np.concatenate(grads)
    copied = mpicoll.GradientBucketer(grads, comm=comm, op="sum")
    viewed = mpicoll.GradientBucketer([(g.shape, g.dtype) for g in grads], comm=comm, op="sum")
    for v, g in zip(viewed.views, grads):
        v[...] = g

    def per_array():
        for g in grads:
            mpicoll.allreduce(g, comm=comm, out=g)

    def per_array_nb():
        mpicoll.waitall([mpicoll.iallreduce(g, comm=comm, out=g) for g in grads])

    rows = [("per-array", _best(comm, per_array, repeat)),
            ("per-array nonblock", _best(comm, per_array_nb, repeat)),
            ("bucketed (copy)", _best(comm, copied.allreduce, repeat)),
            ("bucketed (views)", _best(comm, viewed.allreduce, repeat)),
            ("one buffer", _best(comm, lambda: mpicoll.allreduce(flat, comm=comm, out=flat), repeat))]

    # Overlap: a stand-in backward pass that writes each gradient in reverse order.
    sources = [g.copy() for g in grads]

    def backward(mark):
        for i in range(len(grads) - 1, -1, -1):
            view = viewed.views[i]
            np.multiply(sources[i], 0.5, out=view)
            for _ in range(work - 1):
                np.multiply(view, 1.0, out=view)
            if mark:
                viewed.mark_ready(i)
        if mark:
            viewed.wait()

    t_compute = _best(comm, lambda: backward(False), repeat)
    t_comm = _best(comm, viewed.allreduce, repeat)
    t_both = _best(comm, lambda: backward(True), repeat)
    overlap = {"compute": t_compute, "comm": t_comm, "both": t_both,
               "hidden": (t_compute + t_comm - t_both) / t_comm if t_comm > 0 else 0.0}
    return sizes, rows, viewed, overlap


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench bucketing", description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=float, default=50.0, help="total gradient MiB (default 50)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--work", type=int, default=4, help="passes over each gradient in the stand-in backward")
    args = ap.parse_args(argv)
    comm = MPI.COMM_WORLD
    sizes, rows, bucketer, ov = run(comm, args.mib, args.repeat, args.work)
    if comm.rank == 0:
        print(f"{len(sizes)} float32 gradients, {sum(sizes) * 4 / 2**20:.1f} MiB, p={comm.size}, best of "
              f"{args.repeat}; progress thread: {mpicoll.progress_thread_active()}")
        print(f"buckets: {len(bucketer.buckets)} of {[round(b / 2**20, 2) for b in bucketer.bucket_nbytes()]} MiB")
        base = rows[0][1]
        print(f"{'method':<20} {'ms':>9} {'speed-up vs per-array':>22}")
        for name, t in rows:
            print(f"{name:<20} {t * 1e3:>9.1f} {base / t:>21.2f}x")
        print(f"overlap: backward alone {ov['compute'] * 1e3:.1f} ms, bucketed all-reduce alone "
              f"{ov['comm'] * 1e3:.1f} ms, together {ov['both'] * 1e3:.1f} ms: "
              f"{100 * ov['hidden']:.0f}% of the all-reduce hidden")
    return 0
