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
* ``t/native``: time over MPI_Allreduce's time in the same run (< 1:
  faster than MPI); with ``--repeat R`` every measurement is taken R
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
import csv
import json
import math
import platform
import sys
import time
from typing import Callable, List, Optional, Sequence

import numpy as np
from mpi4py import MPI

import mpicoll

from .. import dtypes as _dtypes
from .. import kernels as _kernels
from .. import ops as _ops
from .. import api as _api
from .. import profile as _profile
from ..comm import state
from ..node import node_info
from ..algorithms.mpi import _typed
from ..kernels import Reduction

NATIVE = "MPI_Allreduce"
MODES = ("out", "in")
MAX_DEFAULT = 256 << 20
SCHEMA = "mpicoll-bench-allreduce/1"
STATS = {"min": np.min, "median": np.median, "avg": np.mean}
ROW_FIELDS = ("bytes", "count", "algorithm", "mode", "chosen", "iters", "avg_us", "min_us", "max_us",
              "median_us", "time_us", "algbw_gbs", "busbw_gbs", "t_over_native", "wrong", "bound_us", "pct_of_bound")


# ---- sizes and iteration counts ----------------------------------------------

def default_sizes(lo: int = 8, hi: int = MAX_DEFAULT, factor: int = 4) -> List[int]:
    """lo, lo*factor, ... up to hi, and hi itself (8 B .. 256 MiB by 4x:
    the powers of 4 times 8 stop at 128 MiB, so 256 MiB is added)."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    if out[-1] != hi:
        out.append(hi)
    return out


def _parse_bytes(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix):
            s, mult = s[:-1], m
            break
    try:
        v = int(s) * mult
    except ValueError:
        raise ValueError(f"not a size in bytes: {s!r} (examples: 8, 4K, 16M)") from None
    if v <= 0:
        raise ValueError(f"sizes must be positive, got {v}")
    return v


def parse_sizes(spec: str) -> List[int]:
    """"8,4K,1M" (a list) or "8:64M" (8 B to 64 MiB by 4x) or "8:64M:2" (by 2x)."""
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) not in (2, 3):
            raise ValueError(f"bad size range {spec!r}: use MIN:MAX or MIN:MAX:FACTOR")
        lo, hi = _parse_bytes(parts[0]), _parse_bytes(parts[1])
        factor = int(parts[2]) if len(parts) == 3 else 4
        if factor < 2 or hi < lo:
            raise ValueError(f"bad size range {spec!r}")
        return default_sizes(lo, hi, factor)
    return sorted({_parse_bytes(s) for s in spec.split(",") if s.strip()})


def iterations(nbytes: int, scale: float = 1.0) -> tuple:
    """(warm-up, timed iterations): about 64 MiB of traffic per measurement,
    at least 5 and at most 1000 iterations; small messages need many
    iterations to rise above timer and scheduling noise, large ones few.
    ``measure()`` cuts the count further to a time budget."""
    iters = int(scale * (64 << 20) / max(nbytes, 32 << 10))
    iters = max(5, min(1000, iters))
    return max(2, min(20, iters // 10)), iters


# ---- the physical reference --------------------------------------------------

def stream(comm, nbytes: int = 64 << 20, repeat: int = 5) -> dict:
    """STREAM-style node memory bandwidth, every rank at once.

    Each rank runs STREAM's Copy (c = a) and Add (c = a + b, float64) on
    arrays of ``nbytes`` (larger than the caches), all ranks started
    together by a barrier; the node's bandwidth is the bytes all ranks moved
    (STREAM's counting: 2 arrays for Copy, 3 for Add, no write-allocate)
    over the time until the last rank finished, best of ``repeat``. Ranks share the
    node's memory controllers and cores exactly as they do in an all-reduce.
    """
    n = max(1, nbytes // 8)
    a = np.full(n, 1.0)
    b = np.full(n, 2.0)
    c = np.zeros(n)
    p = comm.Get_size()
    out = {}
    for name, fn, arrays in (("copy", lambda: np.copyto(c, a), 2), ("add", lambda: np.add(a, b, out=c), 3)):
        best = math.inf
        fn()
        for _ in range(repeat):
            # From one barrier to the next: the time the node needed for
            # all ranks' work. (Each rank timing only its own kernel would
            # overstate the bandwidth when ranks outnumber cores and run
            # one after another.)
            comm.Barrier()
            t = time.perf_counter()
            fn()
            comm.Barrier()
            best = min(best, comm.allreduce(time.perf_counter() - t, op=MPI.MAX))
        out[f"{name}_gbs"] = p * arrays * n * 8 / best / 1e9
    out["array_bytes"] = n * 8
    out["node_gbs"] = max(out["copy_gbs"], out["add_gbs"])
    return out


def lower_bound(p: int, nbytes: int, node_gbs: float) -> float:
    """Seconds no all-reduce of ``nbytes`` on ``p`` ranks of this node can beat.

    Every rank must read its own input once and write the result once: at
    least 2 p n bytes cross the node's memory system, whatever the
    algorithm (a shared-memory all-reduce that reads each input in place
    and writes each output directly reaches it; message passing copies
    more). At the node's measured STREAM bandwidth B:

        T_bound = 2 p n / B

    Only a bandwidth bound, and only for messages larger than the caches:
    for short messages, where latency dominates, it is far below anything
    achievable ("% of bound" is small); for messages that stay in the
    last-level cache (up to a few MiB) the all-reduce does not touch DRAM
    at all and "% of bound" can exceed 100%.
    """
    return 2.0 * p * nbytes / (node_gbs * 1e9)


# ---- one measurement ---------------------------------------------------------

def measure(comm, fn: Callable[[], object], iters: int, warmup: int,
            budget_s: Optional[float] = None) -> np.ndarray:
    """The slowest rank's time of each of ``iters`` calls of ``fn``, in
    seconds; with ``budget_s``, fewer calls (at least 5) when the warm-up
    says ``iters`` would take longer (oversubscribed ranks can take
    milliseconds per short message)."""
    comm.Barrier()
    t = time.perf_counter()
    for _ in range(warmup):
        fn()
    if budget_s is not None:
        per_call = comm.allreduce((time.perf_counter() - t) / max(warmup, 1), op=MPI.MAX)  # same on every rank
        iters = max(5, min(iters, int(budget_s / max(per_call, 1e-9))))
    comm.Barrier()
    ts = np.empty(iters)
    clock = time.perf_counter
    t0 = clock()
    for i in range(iters):
        fn()
        t1 = clock()
        ts[i] = t1 - t0
        t0 = t1
    slowest = np.empty_like(ts)
    comm.Allreduce(ts, slowest, MPI.MAX)
    return slowest


class _Case:
    """The call for one (algorithm, mode) at one size. All cases of a size
    share one input and one output buffer (a 256 MiB sweep would otherwise
    hold gigabytes per rank); each case refills them before it runs."""

    def __init__(self, comm, algorithm, mode, red, x, out, dtype_name):
        self.comm, self.algorithm, self.mode, self.red = comm, algorithm, mode, red
        self.x, self.out = x, out
        self.dtype_name = dtype_name

    def fill(self, values: np.ndarray) -> None:
        self.x[...] = values
        self.out[...] = values

    def call(self) -> None:
        a, x, out, comm = self.algorithm, self.x, self.out, self.comm
        if a == NATIVE:
            datatype, op = _typed(self.red)
            if self.mode == "in":
                comm.Allreduce(MPI.IN_PLACE, [out, datatype], op)
            else:
                comm.Allreduce([x, datatype], [out, datatype], op)
            self.red.finish(out, comm.Get_size())  # avg: MPI has no such op
        elif self.mode == "in":
            mpicoll.allreduce(out, self.red.op.name, comm=comm, out=out, algorithm=a, dtype=self.dtype_name)
        else:
            mpicoll.allreduce(x, self.red.op.name, comm=comm, out=out, algorithm=a, dtype=self.dtype_name)

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
        stream_bytes: int = 64 << 20, stat: str = "min", budget_s: float = 0.25) -> dict:
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

def _fmt_bytes(n: int) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B"


def table(result: dict, explain: bool = False) -> str:
    meta, bw = result["meta"], result["stream"]
    lines = [f"mpicoll {meta['mpicoll']} all-reduce, {meta['op']} {meta['dtype']}, p={meta['p']}, {meta['mpi']}",
             f"node memory bandwidth (STREAM copy {bw['copy_gbs']:.1f} GB/s, add {bw['add_gbs']:.1f} GB/s, all ranks "
             f"at once); bound = 2 p n / {bw['node_gbs']:.1f} GB/s; times are the slowest rank's, per call; "
             f"time = {meta['stat']} over iterations; best of {meta['repeat']} interleaved run(s)"]
    if meta.get("profile"):
        lines.append(f"tuning profile: {meta['profile']}")
    head = (f"{'size':>9} {'algorithm':<22} {'mode':<4} {'iters':>5} {'avg us':>10} {'min us':>10} {'max us':>10} "
            f"{'time us':>10} {'algbw GB/s':>10} {'busbw GB/s':>10} {'t/native':>8} {'% bound':>7} {'wrong':>5}")
    lines += [head, "-" * len(head)]
    for r in result["rows"]:
        label = r["algorithm"] if r["algorithm"] != "auto" else f"auto ({r['chosen']})"
        wrong = "-" if r["wrong"] is None else str(r["wrong"])
        lines.append(f"{_fmt_bytes(r['bytes']):>9} {label:<22.22} {r['mode']:<4} {r['iters']:>5} {r['avg_us']:>10.1f} "
                     f"{r['min_us']:>10.1f} {r['max_us']:>10.1f} {r['time_us']:>10.1f} {r['algbw_gbs']:>10.3f} {r['busbw_gbs']:>10.3f} "
                     f"{r['t_over_native']:>8.2f} {r['pct_of_bound']:>6.1f}% {wrong:>5}")
    lines.append(summary(result))
    if explain:
        lines.append("auto's choices:")
        for e in result["explain"]:
            lines.append(f"  {_fmt_bytes(e['bytes']):>9}: {e['algorithm']} - {e['reason']}")
    return "\n".join(lines)


def summary(result: dict) -> str:
    """auto vs MPI_Allreduce against the issue's targets (out of place)."""
    small = [r["t_over_native"] for r in result["rows"]
             if r["algorithm"] == "auto" and r["mode"] == "out" and r["bytes"] <= 4096]
    large = [r["t_over_native"] for r in result["rows"]
             if r["algorithm"] == "auto" and r["mode"] == "out" and r["bytes"] >= 4 << 20]
    parts = []
    if small:
        parts.append(f"auto/native <= 4 KiB: geomean {math.exp(np.mean(np.log(small))):.2f} (target <= 1.25)")
    if large:
        parts.append(f">= 4 MiB: worst {max(large):.2f}, geomean {math.exp(np.mean(np.log(large))):.2f} "
                     f"(target <= 1.00)")
    return "summary (out of place): " + ("; ".join(parts) if parts else "no auto rows")


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


def write_csv(result: dict, path: str) -> None:
    meta = result["meta"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=("p", "op", "dtype") + ROW_FIELDS)
        w.writeheader()
        for r in result["rows"]:
            w.writerow({"p": meta["p"], "op": meta["op"], "dtype": meta["dtype"], **{k: r[k] for k in ROW_FIELDS}})


def plot(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("bench: --plot needs matplotlib (pip install 'mpicoll[plot]')") from None
    meta = result["meta"]
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5))
    for mode, style in (("out", "-"), ("in", ":")):
        for a in meta["algorithms"]:
            rs = [r for r in result["rows"] if r["algorithm"] == a and r["mode"] == mode]
            if not rs:
                continue
            xs = [r["bytes"] for r in rs]
            label = f"{a} ({'in place' if mode == 'in' else 'out of place'})"
            color = None if a != NATIVE else "black"
            line, = ax_t.plot(xs, [r["time_us"] for r in rs], style, marker=".", label=label, color=color)
            ax_b.plot(xs, [r["busbw_gbs"] for r in rs], style, marker=".", label=label, color=line.get_color())
    rs = [r for r in result["rows"] if r["algorithm"] == NATIVE and r["mode"] == meta["modes"][0]]
    ax_t.plot([r["bytes"] for r in rs], [r["bound_us"] for r in rs], "--", color="grey", label="memory bound")
    lowest = min(r["time_us"] for r in result["rows"])
    ax_t.set_ylim(bottom=lowest / 3)  # the bound falls far below at small sizes: do not let it set the scale
    ax_t.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel=f"latency ({meta['stat']}), slowest rank (us)")
    ax_b.set(xscale="log", xlabel="message size (bytes)", ylabel="busbw (GB/s)")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
    ax_b.legend(fontsize=7, ncol=2)
    fig.suptitle(f"mpicoll all-reduce, {meta['op']} {meta['dtype']}, p={meta['p']} ({meta['mpi']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
                 not args.no_validate, stat=args.stat, stream_bytes=max(8, int(args.stream_mib * (1 << 20))))
    if comm.Get_rank() == 0:
        print(table(result, args.explain), flush=True)
        if args.json:
            write_json(result, args.json)
        if args.csv:
            write_csv(result, args.csv)
        if args.plot:
            plot(result, args.plot)
    bad = sum(r["wrong"] or 0 for r in result["rows"])
    return 1 if bad else 0
