"""All-reduce sweep against MPI_Allreduce: ``mpiexec -n P python -m mpicoll.bench``.

For each message size, every algorithm (``auto``, each registered one, and
``MPI_Allreduce`` called directly through mpi4py as the baseline), out of
place and in place:

* warm-up and iteration counts scaled by the size (``iterations()``);
* every iteration is timed on every rank and the *slowest rank's* time is
  kept (as osu_allreduce reports); avg/min/max/median are over iterations
  of that slowest-rank time;
* ``time``: one figure per measurement, by ``--stat``: ``min`` (the
  default: the least disturbed iteration, the only figure that is stable on
  a shared, loaded machine, where most iterations lose time slices to other
  processes), ``median`` or ``avg`` (osu_allreduce's; use it on a quiet
  machine);
* algbw = bytes / time and busbw = algbw * 2(p-1)/p (the nccl-tests
  definitions; busbw is comparable across process counts);
* ``speed-up``: MPI_Allreduce's time over this one's, in the same run
  (> 1: faster than MPI; the JSON rows keep the inverse, ``t_over_native``); with ``--repeat R`` every measurement is taken R
  times, interleaved with the others, and the run with the lowest time
  kept, so a burst of load hurts less;
* ``wrong``: elements that differ from MPI_Allreduce's result on a fresh
  random input, beyond the rounding a different summation order may give
  (exact comparison for integers, min and max); the worst rank's count;
* ``% bound``: the physical lower bound over the time (100% is the
  best this node's memory could do; see ``stream()`` and ``lower_bound()``).

Output: an aligned table on stdout (rank 0), ``--json``, ``--csv`` and
``--plot FILE.png`` (needs matplotlib: ``pip install mpicoll[plot]``).
"""
from __future__ import annotations

import argparse
import platform
import sys
import time
from typing import Optional, Sequence

import numpy as np
from mpi4py import MPI

import mpicoll

from .. import dtypes as _dtypes
from .. import kernels as _kernels
from .. import ops as _ops
from .. import api as _api
from .. import profile as _profile
from ..commstate import state
from ..node import node_info
from ..algorithms.mpi import _typed
from ..kernels import Reduction

from .report import NATIVE, ROW_FIELDS  # noqa: E402
MODES = ("out", "in")
SCHEMA = "mpicoll-bench-allreduce/1"
STATS = {"min": np.min, "median": np.median, "avg": np.mean}


from .timing import (MAX_DEFAULT, default_sizes, iterations, lower_bound, measure, parse_bytes,  # noqa: F401,E402
                     parse_sizes, stream)


class _Case:
    """The call for one (algorithm, mode) at one size. All cases of a size
    share one input and one output buffer (a 256 MiB sweep would otherwise
    hold gigabytes per rank); each case refills them before it runs."""

    def __init__(self, comm, algorithm, mode, red, x, out, dtype_name):
        self.comm, self.algorithm, self.mode, self.red = comm, algorithm, mode, red
        self.x, self.out = x, out
        self.dtype_name = dtype_name
        # "ring@60": the same algorithm with timeout=60 (--timeout)
        name, _, tmo = algorithm.partition("@")
        self.name = name
        self.options = {"timeout": float(tmo)} if tmo else {}

    def fill(self, values: np.ndarray) -> None:
        self.x[...] = values
        self.out[...] = values

    def call(self) -> None:
        a, x, out, comm = self.name, self.x, self.out, self.comm
        if a == NATIVE:
            datatype, op = _typed(self.red)
            if self.mode == "in":
                comm.Allreduce(MPI.IN_PLACE, [out, datatype], op)
            else:
                comm.Allreduce([x, datatype], [out, datatype], op)
            self.red.finish(out, comm.Get_size())  # avg: MPI has no such op
        elif self.mode == "in":
            mpicoll.allreduce(out, self.red.op.name, comm=comm, out=out, algorithm=a, dtype=self.dtype_name,
                              **self.options)
        else:
            mpicoll.allreduce(x, self.red.op.name, comm=comm, out=out, algorithm=a, dtype=self.dtype_name,
                              **self.options)

    def result(self) -> np.ndarray:
        return self.out


# ---- inputs and validation ---------------------------------------------------

def _to_float64(dt: _dtypes.DType, storage: np.ndarray) -> np.ndarray:
    if dt.name == "float16":
        return _kernels.f16_to_f32(storage).astype(np.float64)
    if dt.name == "bfloat16":
        return _kernels.bf16_to_f32(storage).astype(np.float64)
    return storage.astype(np.float64)


def _from_float32(dt: _dtypes.DType, v: np.ndarray) -> np.ndarray:
    # Storage arrays (uint16 bits for the 16-bit floats), never numpy float16:
    # assigning those into uint16 buffers would convert the values.
    if dt.name == "float16":
        return _kernels.f32_to_f16(v).view(dt.storage)
    if dt.name == "bfloat16":
        return _kernels.f32_to_bf16(v).view(dt.storage)
    return v.astype(dt.storage)


def inputs(dt: _dtypes.DType, op: str, count: int, seed: int, timing: bool) -> np.ndarray:
    """Random storage values. Timing inputs are reduced over and over in
    place, so they must stay tame: ones for prod (no underflow to slow
    denormals), small integers otherwise."""
    rng = np.random.default_rng(seed)
    if dt.kind != "float":
        hi = 2 if op in ("prod", "band", "bor", "bxor", "land", "lor", "lxor") else 100
        return rng.integers(0, hi, count).astype(dt.storage)
    if timing:
        v = np.ones(count, np.float32) if op == "prod" else rng.integers(-4, 5, count).astype(np.float32)
    else:
        v = rng.standard_normal(count).astype(np.float32)
    return _from_float32(dt, v)


def count_wrong(comm, dt: _dtypes.DType, op: str, got: np.ndarray, ref: np.ndarray, abs_sum) -> int:
    """Elements of ``got`` that differ from MPI's ``ref`` by more than a
    different summation order can explain (worst rank)."""
    if got.size == 0:
        return int(comm.allreduce(0, op=MPI.MAX))
    if dt.kind != "float" or op in ("min", "max"):
        wrong = int(np.count_nonzero(got != ref))
    else:
        g, r = _to_float64(dt, got), _to_float64(dt, ref)
        eps = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}.get(dt.name, 2.0 ** -52)
        p = comm.Get_size()
        if op == "prod":
            tol = 4 * p * eps * np.abs(r) + np.finfo(np.float64).tiny
        else:  # sum and avg: the rounding of any order is within p eps sum|x_i|
            tol = 4 * p * eps * abs_sum / (p if op == "avg" else 1) + 4 * eps * np.abs(r)
        bad = ~(np.abs(g - r) <= tol)
        bad &= ~(np.isnan(g) & np.isnan(r))
        wrong = int(np.count_nonzero(bad))
    return int(comm.allreduce(wrong, op=MPI.MAX))


def _validate(comm, case: _Case, dt, op, count, red, abs_sum_of):
    rank = comm.Get_rank()
    vals = inputs(dt, op, count, 1000 + rank, timing=False)
    ref = np.empty_like(vals)
    datatype, mop = _typed(red)
    comm.Allreduce([vals, datatype], [ref, datatype], mop)
    red.finish(ref, comm.Get_size())
    case.fill(vals)
    case.call()
    return count_wrong(comm, dt, op, case.result(), ref, abs_sum_of(vals))


# ---- the sweep ---------------------------------------------------------------

def _progress(done: int, total: int, label: str, t0: float, enabled: bool) -> None:
    if not enabled:
        return
    width = 30
    filled = int(width * done / max(total, 1))
    elapsed = time.perf_counter() - t0
    eta = elapsed / done * (total - done) if done else 0.0
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} "
                     f"{elapsed:5.0f}s, ~{eta:4.0f}s left  {label:<36.36}")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def run(comm=None, sizes: Optional[Sequence[int]] = None, algorithms: Optional[Sequence[str]] = None,
        op: str = "sum", dtype: str = "float32", modes: Sequence[str] = MODES, scale: float = 1.0,
        repeat: int = 1, progress: Optional[bool] = None, validate: bool = True,
        stream_bytes: int = 64 << 20, stat: str = "min", budget_s: float = 0.25, timeout=None) -> dict:
    """Run the sweep; every rank returns the same result dict (rank 0 prints).

    ``algorithms`` defaults to auto, every registered algorithm and
    MPI_Allreduce (always added: it is the reference for ratios and
    validation).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    p, rank = comm.Get_size(), comm.Get_rank()
    if dtype not in _dtypes.BY_NAME:
        raise ValueError(f"bench: unknown dtype {dtype!r}; known: {', '.join(_dtypes.names())}")
    dt = _dtypes.BY_NAME[dtype]
    o = _ops.resolve(op)
    red = Reduction(o, dt)  # TypeError if op does not apply to dtype
    known = mpicoll.algorithms("allreduce")
    algs = list(known) if algorithms is None else list(algorithms)
    for a in algs:
        if a != NATIVE and a not in known:
            raise ValueError(f"bench: unknown algorithm {a!r}; known: {', '.join(known + [NATIVE])}")
    if NATIVE not in algs:
        algs.append(NATIVE)
    if timeout is not None:
        # Each mpicoll algorithm once more with a deadline, interleaved with
        # the plain one: what waiting with a deadline costs.
        algs += [f"{a}@{timeout:g}" for a in algs if a != NATIVE]
    for m in modes:
        if m not in MODES:
            raise ValueError(f"bench: mode must be one of {MODES}, got {m!r}")
    sizes = default_sizes() if sizes is None else list(sizes)
    if repeat < 1:
        raise ValueError("bench: repeat must be >= 1")
    if stat not in STATS:
        raise ValueError(f"bench: stat must be one of {sorted(STATS)}, got {stat!r}")
    figure = STATS[stat]

    bw = stream(comm, stream_bytes)
    itemsize = dt.itemsize
    total = len(sizes) * len(algs) * len(modes) * repeat
    show = (rank == 0 and sys.stderr.isatty()) if progress is None else (rank == 0 and progress)
    t_start = time.perf_counter()
    done = 0
    rows, explain = [], {}
    # auto looks at the node layout (shm/hierarchical); find it now, so that
    # explain() below reports the choice auto really makes.
    node_info(state(comm))
    for nbytes in sizes:
        count = max(1, nbytes // itemsize)
        nb = count * itemsize
        warmup, iters = iterations(nb, scale)
        choice = _api.explain(nb, comm=comm, op=o.name, dtype=dt.name)
        explain[nb] = choice
        xbuf, outbuf = np.empty(count, dt.storage), np.empty(count, dt.storage)
        cases = {(a, m): _Case(comm, a, m, red, xbuf, outbuf, dt.name) for a in algs for m in modes}
        timing_vals = inputs(dt, o.name, count, rank, timing=True)
        best = {}
        for _ in range(repeat):  # interleaved repetitions: all cases see the same background load
            for key, case in cases.items():
                case.fill(timing_vals)
                ts = measure(comm, case.call, iters, warmup, budget_s * scale)
                if key not in best or figure(ts) < figure(best[key]):
                    best[key] = ts
                done += 1
                _progress(done, total, f"{nb} B {key[0]} ({key[1]})", t_start, show)
        wrong = {}
        if validate:
            abs_cache = {}

            def abs_sum_of(vals):
                if "v" not in abs_cache:
                    a64 = np.abs(_to_float64(dt, vals)) if dt.kind == "float" else np.zeros(0)
                    out = np.empty_like(a64)
                    comm.Allreduce(a64, out, MPI.SUM)
                    abs_cache["v"] = out
                return abs_cache["v"]

            for key, case in cases.items():
                wrong[key] = _validate(comm, case, dt, o.name, count, red, abs_sum_of)
        for (a, m), ts in best.items():
            t = float(figure(ts))
            native = float(figure(best[(NATIVE, m)]))
            algbw = nb / t / 1e9
            rows.append({
                "bytes": nb, "count": count, "algorithm": a, "mode": m,
                "chosen": choice.name if a == "auto" else a,
                "iters": len(ts), "avg_us": float(ts.mean()) * 1e6, "min_us": float(ts.min()) * 1e6,
                "max_us": float(ts.max()) * 1e6, "median_us": float(np.median(ts)) * 1e6, "time_us": t * 1e6,
                "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (p - 1) / p if p > 1 else 0.0,
                "t_over_native": t / native, "wrong": wrong.get((a, m)),
            })
        del cases, xbuf, outbuf
    # STREAM again at the end: the better of the two figures sets the bound
    # (on a shared machine either may have run during a burst of load).
    end = stream(comm, stream_bytes)
    bw = {k: max(v, end[k]) for k, v in bw.items()}
    for r in rows:
        bound = lower_bound(p, r["bytes"], bw["node_gbs"])
        r["bound_us"] = bound * 1e6
        r["pct_of_bound"] = 100.0 * bound / (r["time_us"] * 1e-6)
    meta = {
        "schema": SCHEMA, "p": p, "op": o.name, "dtype": dt.name, "itemsize": itemsize, "modes": list(modes),
        "algorithms": algs, "repeat": repeat, "scale": scale, "stat": stat,
        "mpi": " ".join(MPI.Get_library_version().splitlines()[0].split()), "mpicoll": mpicoll.__version__,
        "host": platform.node(), "kernels": _kernels.isa(),
        "profile": None if _profile.current() is None else _profile.current().path,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "bound_formula": "T_bound = 2 p n / B_node (B_node: STREAM copy/add, all ranks at once)",
        "wall_s": time.perf_counter() - t_start,
    }
    return {"meta": meta, "stream": bw, "rows": rows,
            "explain": [{"bytes": nb, "algorithm": c.name, "reason": c.reason,
                         "segment_bytes": c.segment_bytes} for nb, c in explain.items()]}


# ---- output ------------------------------------------------------------------

from .report import plot, summary, table, write_csv, write_json  # noqa: E402,F401


def timeout_ratios(result) -> str:
    """Markdown table: time with a deadline / time without, per size and algorithm."""
    t = {(r["bytes"], r["algorithm"], r["mode"]): r["time_us"] for r in result["rows"]}
    algs = [a for a in result["meta"]["algorithms"] if "@" in a]
    lines = ["| bytes | mode | " + " | ".join(algs) + " |", "|---|---|" + "---|" * len(algs)]
    for nb, m in dict.fromkeys((k[0], k[2]) for k in t):
        cells = [f"{t[(nb, a, m)] / t[(nb, a.partition('@')[0], m)]:.3f}" for a in algs]
        lines.append(f"| {nb} | {m} | " + " | ".join(cells) + " |")
    return "time with timeout / time without (same run, interleaved):\n" + "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mpiexec -n P python -m mpicoll.bench [allreduce]",
                                 description="All-reduce sweep: every algorithm against MPI_Allreduce.")
    ap.add_argument("--sizes", default=None,
                    help="comma list (8,4K,16M) or range MIN:MAX[:FACTOR] (default 8:256M, x4)")
    ap.add_argument("--algorithms", default=None,
                    help=f"comma list (default: auto, every registered one, {NATIVE})")
    ap.add_argument("--op", default="sum", choices=_ops.names())
    ap.add_argument("--dtype", default="float32", choices=_dtypes.names())
    ap.add_argument("--mode", default="both", choices=("both", "out", "in"), help="out of place, in place, or both")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply iteration counts (default 1)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved repetitions, best kept (default 1)")
    ap.add_argument("--stat", default="min", choices=sorted(STATS),
                    help="the per-measurement figure for ratios and bandwidths (default min: see the docstring)")
    ap.add_argument("--stream-mib", type=float, default=64,
                    help="array size of the STREAM measurement per rank, MiB (default 64: beyond the caches)")
    ap.add_argument("--no-validate", action="store_true", help="skip the comparison with MPI_Allreduce's result")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--csv", help="write the rows as CSV")
    ap.add_argument("--plot", help="write latency and busbw plots (PNG; needs matplotlib)")
    ap.add_argument("--explain", action="store_true", help="print auto's choice and reason for each size")
    ap.add_argument("--timeout", type=float, default=None,
                    help="also run every algorithm with timeout=SECONDS, interleaved, and print the time ratios")
    prog = ap.add_mutually_exclusive_group()
    prog.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="progress bar on stderr (default: when stderr is a terminal)")
    prog.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    try:
        sizes = None if args.sizes is None else parse_sizes(args.sizes)
    except ValueError as e:
        ap.error(str(e))
    algs = None if args.algorithms is None else [a.strip() for a in args.algorithms.split(",") if a.strip()]
    modes = MODES if args.mode == "both" else (args.mode,)
    comm = MPI.COMM_WORLD
    result = run(comm, sizes, algs, args.op, args.dtype, modes, args.scale, args.repeat, args.progress,
                 not args.no_validate, stat=args.stat, stream_bytes=max(8, int(args.stream_mib * (1 << 20))),
                 timeout=args.timeout)
    if comm.Get_rank() == 0:
        print(table(result, args.explain), flush=True)
        if args.timeout is not None:
            print(timeout_ratios(result), flush=True)
        if args.json:
            write_json(result, args.json)
        if args.csv:
            write_csv(result, args.csv)
        if args.plot:
            plot(result, args.plot)
    bad = sum(r["wrong"] or 0 for r in result["rows"])
    return 1 if bad else 0
