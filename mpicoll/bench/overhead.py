"""Per-call cost of every front door against the same call through mpi4py.

    mpiexec -n 2 python -m mpi4py -m mpicoll.bench overhead [--sizes 8,1K,64K] [--rounds 5] [--iters 300]
        [--doors functions,i,init,comm,forced] [--torch] [--budget-ms 250] [--json FILE]

A program that swaps in mpicoll keeps making the calls it made through
mpi4py: what matters is what each door adds to (or saves on) the MPI call it
replaces. Every row of the table pairs a door with the SAME call through
mpi4py on the plain communicator (for torch: ``dist.all_reduce`` on a gloo
group), timed in the same run and interleaved: each round times a batch of
calls of every callable (both sides of every row) in a shuffled order, the
same order on every rank, so that a burst of load from elsewhere hits both
sides alike. A figure is the median over the rounds of the slowest rank's
time per call, and

    ratio = reference time / mpicoll time      (> 1: mpicoll is faster)

The doors, in groups (``--doors`` selects; torch also with ``--torch``):

- ``functions``: ``mpicoll.allreduce`` (the same arrays with ``out=``, and a
  new array every call, as most code calls it), ``reduce_scatter``,
  ``allgather``, ``bcast``, ``reduce``, ``scatter``, ``gather``,
  ``allgatherv``, ``alltoall``, ``alltoallv``;
- ``i``: their nonblocking forms, ``.wait()`` vs the I-call's ``.Wait()``;
- ``init``: their persistent forms, start and wait vs MPI-4's ``*_init``
  (rows the MPI library lacks are left out);
- ``comm``: every collective method of ``mpicoll.Comm`` (blocking, I-form
  and ``_init`` form) vs the same method of the plain ``MPI.Intracomm``;
- ``forced``: ``allreduce(algorithm=A)`` for every all-reduce algorithm, and
  ``allreduce_init(algorithm=A)``, vs native ``Allreduce`` /
  ``Allreduce_init``; only at sizes up to 4 KiB (where latency, the
  overhead being measured, dominates);
- ``torch``: ``dist.all_reduce`` on the mpicoll backend vs gloo.

A size is the bytes of one rank's block (float32, sum): the whole vector of
allreduce, bcast and reduce; one block of the others (scatter's root sends
p of them, an alltoall sends one to each rank, reduce_scatter's input holds p).
Root 0; the v-forms take equal counts.

A batch is ``--iters`` calls, or fewer when the warm-up says the row's slower
side would take longer than ``--budget-ms`` (at least 3): at p > cores a
nonblocking door can take milliseconds per call, and the run must still end.
Both sides of a row always get the same count. Times are never asserted
anywhere; the figures depend on the machine and its load, printed with them.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from typing import Callable, List, NamedTuple, Optional

import numpy as np
from mpi4py import MPI

import mpicoll
from mpicoll import kernels
from mpicoll.bench.timing import parse_sizes

GROUPS = ("functions", "i", "init", "comm", "forced", "torch")
DEFAULT_GROUPS = ("functions", "i", "init", "comm", "forced")  # torch is opt-in: importing it costs seconds
FORCED_MAX_BYTES = 4096
SCHEMA = "mpicoll-overhead/1"


class Door(NamedTuple):
    """One row: a door through mpicoll and the call it is compared with."""
    group: str
    name: str         # a short key, unique within a size: "allreduce", "Comm.Iallreduce", "forced/ring", ...
    label: str        # the mpicoll call as a program writes it
    reference: str    # the reference call as a program writes it
    ours: Callable[[], object]
    theirs: Callable[[], object]


def _start_wait(req) -> Callable[[], None]:
    """Start and complete a persistent request (mpicoll's and mpi4py's share the spelling)."""
    def run():
        req.Start()
        req.Wait()
    return run


class _Buffers:
    """The arrays of one size, shared by both sides of every row (calls run
    one at a time). Inputs are ones and are never written, except bcast's
    buffer, which root 0 sends unchanged: every call moves the same values."""

    def __init__(self, p: int, nbytes: int):
        k = max(1, nbytes // 4)
        self.k = k
        self.x = np.ones(k, np.float32)           # one rank's vector / block
        self.y = np.empty(k, np.float32)          # its result
        self.rows = np.ones((p, k), np.float32)   # p blocks: scatter's root, alltoall's send, reduce_scatter's input
        self.flat = self.rows.reshape(-1)
        self.gathered = np.empty((p, k), np.float32)   # gather/allgather/alltoall results
        self.gathered_flat = self.gathered.reshape(-1)
        self.counts = [k] * p
        # mpi4py buffer specs, built once as a program in a loop would.
        self.rows_v = [self.flat, self.counts]
        self.gathered_v = [self.gathered_flat, self.counts]


def _function_doors(comm, b: _Buffers, rank: int) -> List[Door]:
    """``mpicoll.<collective>`` vs the same blocking mpi4py call."""
    k, y = b.k, b.y
    root_rows = b.rows if rank == 0 else None
    return [
        Door("functions", "allreduce", "mpicoll.allreduce(x, out=y)", "comm.Allreduce(x, y)",
             lambda: mpicoll.allreduce(b.x, out=y, comm=comm), lambda: comm.Allreduce(b.x, y, MPI.SUM)),
        Door("functions", "allreduce/new", "mpicoll.allreduce(np.full(n, 1.0))",
             "comm.Allreduce(np.full(n, 1.0), y)",
             lambda: mpicoll.allreduce(np.full(k, 1.0, np.float32), comm=comm),
             lambda: comm.Allreduce(np.full(k, 1.0, np.float32), y, MPI.SUM)),
        Door("functions", "reduce_scatter", "mpicoll.reduce_scatter(xs, out=y)", "comm.Reduce_scatter_block(xs, y)",
             lambda: mpicoll.reduce_scatter(b.flat, out=y, comm=comm),
             lambda: comm.Reduce_scatter_block(b.flat, y, MPI.SUM)),
        Door("functions", "allgather", "mpicoll.allgather(x, out=g)", "comm.Allgather(x, g)",
             lambda: mpicoll.allgather(b.x, out=b.gathered, comm=comm), lambda: comm.Allgather(b.x, b.gathered)),
        Door("functions", "bcast", "mpicoll.bcast(x, 0)", "comm.Bcast(x, 0)",
             lambda: mpicoll.bcast(b.x, 0, comm=comm), lambda: comm.Bcast(b.x, 0)),
        Door("functions", "reduce", "mpicoll.reduce(x, root=0, out=y)", "comm.Reduce(x, y, root=0)",
             lambda: mpicoll.reduce(b.x, root=0, out=y, comm=comm), lambda: comm.Reduce(b.x, y, MPI.SUM, 0)),
        Door("functions", "scatter", "mpicoll.scatter(xs, 0, out=y)", "comm.Scatter(xs, y, 0)",
             lambda: mpicoll.scatter(root_rows, 0, out=y, comm=comm), lambda: comm.Scatter(b.rows, y, 0)),
        Door("functions", "gather", "mpicoll.gather(x, 0, out=g)", "comm.Gather(x, g, 0)",
             lambda: mpicoll.gather(b.x, 0, out=b.gathered, comm=comm), lambda: comm.Gather(b.x, b.gathered, 0)),
        Door("functions", "allgatherv", "mpicoll.allgatherv(x, counts, out=g)", "comm.Allgatherv(x, [g, counts])",
             lambda: mpicoll.allgatherv(b.x, b.counts, out=b.gathered_flat, comm=comm),
             lambda: comm.Allgatherv(b.x, b.gathered_v)),
        Door("functions", "alltoall", "mpicoll.alltoall(xs, out=g)", "comm.Alltoall(xs, g)",
             lambda: mpicoll.alltoall(b.rows, out=b.gathered, comm=comm), lambda: comm.Alltoall(b.rows, b.gathered)),
        Door("functions", "alltoallv", "mpicoll.alltoallv(xs, counts, counts, out=g)",
             "comm.Alltoallv([xs, counts], [g, counts])",
             lambda: mpicoll.alltoallv(b.flat, b.counts, b.counts, out=b.gathered_flat, comm=comm),
             lambda: comm.Alltoallv(b.rows_v, b.gathered_v)),
    ]


# (mpicoll's function, mpi4py's method, how the i-/init-function is called,
# the method's arguments) for the ten collectives, each with a nonblocking
# and a persistent form; the same arguments serve both forms.
# reduce_scatter's input holds p equal blocks, so its mpi4py twin is
# Reduce_scatter_block (Comm.Reduce_scatter, counts given, is its own row).
def _nonblocking_args(comm, b: _Buffers, rank: int):
    root_rows = b.rows if rank == 0 else None
    return [
        ("allreduce", "Allreduce", lambda f: f(b.x, out=b.y, comm=comm), (b.x, b.y, MPI.SUM)),
        ("reduce_scatter", "Reduce_scatter_block", lambda f: f(b.flat, out=b.y, comm=comm), (b.flat, b.y, MPI.SUM)),
        ("allgather", "Allgather", lambda f: f(b.x, out=b.gathered, comm=comm), (b.x, b.gathered)),
        ("bcast", "Bcast", lambda f: f(b.x, 0, comm=comm), (b.x, 0)),
        ("reduce", "Reduce", lambda f: f(b.x, root=0, out=b.y, comm=comm), (b.x, b.y, MPI.SUM, 0)),
        ("scatter", "Scatter", lambda f: f(root_rows, 0, out=b.y, comm=comm), (b.rows, b.y, 0)),
        ("gather", "Gather", lambda f: f(b.x, 0, out=b.gathered, comm=comm), (b.x, b.gathered, 0)),
        ("allgatherv", "Allgatherv", lambda f: f(b.x, b.counts, out=b.gathered_flat, comm=comm),
         (b.x, b.gathered_v)),
        ("alltoall", "Alltoall", lambda f: f(b.rows, out=b.gathered, comm=comm), (b.rows, b.gathered)),
        ("alltoallv", "Alltoallv", lambda f: f(b.flat, b.counts, b.counts, out=b.gathered_flat, comm=comm),
         (b.rows_v, b.gathered_v)),
    ]


def _i_doors(comm, b: _Buffers, rank: int) -> List[Door]:
    """``mpicoll.i<collective>(...).wait()`` vs mpi4py's ``comm.I<Method>(...).Wait()``."""
    doors = []
    for fn, method, call, args in _nonblocking_args(comm, b, rank):
        ours = getattr(mpicoll, "i" + fn)
        theirs = getattr(comm, "I" + method[0].lower() + method[1:])
        doors.append(Door("i", "i" + fn, f"mpicoll.i{fn}(..).wait()", f"comm.{theirs.__name__}(..).Wait()",
                          lambda call=call, ours=ours: call(ours).wait(),
                          lambda theirs=theirs, args=args: theirs(*args).Wait()))
    return doors


def _library_init(comm, method: str, args, keep: list):
    """mpi4py's persistent collective ``method`` on ``args``, or None where the
    MPI library has none (the same answer on every rank: one library)."""
    try:
        req = getattr(comm, method)(*args)
    except (AttributeError, NotImplementedError):
        return None
    keep.append(req)
    return req


def _init_doors(comm, b: _Buffers, rank: int, keep: list) -> List[Door]:
    """``mpicoll.<collective>_init`` vs mpi4py's ``comm.<Method>_init``: start and wait."""
    doors = []
    for fn, method, call, args in _nonblocking_args(comm, b, rank):
        theirs = _library_init(comm, method + "_init", args, keep)
        if theirs is None:
            continue
        ours = call(getattr(mpicoll, fn + "_init"))
        keep.append(ours)
        doors.append(Door("init", fn + "_init", f"mpicoll.{fn}_init(..): start+wait",
                          f"comm.{method}_init(..): Start+Wait", _start_wait(ours), _start_wait(theirs)))
    return doors


def _comm_methods(b: _Buffers):
    """(method, its arguments) for every collective method mpicoll.Comm serves."""
    return [
        ("Allreduce", (b.x, b.y, MPI.SUM)),
        ("Reduce", (b.x, b.y, MPI.SUM, 0)),
        ("Reduce_scatter_block", (b.flat, b.y, MPI.SUM)),
        ("Reduce_scatter", (b.flat, b.y, b.counts, MPI.SUM)),
        ("Allgather", (b.x, b.gathered)),
        ("Allgatherv", (b.x, b.gathered_v)),
        ("Bcast", (b.x, 0)),
        ("Scatter", (b.rows, b.y, 0)),
        ("Scatterv", (b.rows_v, b.y, 0)),
        ("Gather", (b.x, b.gathered, 0)),
        ("Gatherv", (b.x, b.gathered_v, 0)),
        ("Alltoall", (b.rows, b.gathered)),
        ("Alltoallv", (b.rows_v, b.gathered_v)),
    ]


def _comm_doors(comm, mc, b: _Buffers, keep: list) -> List[Door]:
    """Every collective method of ``mpicoll.Comm`` vs the same method of the
    plain communicator: blocking, the I-form (``.Wait()``) and the
    ``_init`` form (Start+Wait), with identical arguments."""
    doors = []
    for method, args in _comm_methods(b):
        ours, theirs = getattr(mc, method), getattr(comm, method)
        doors.append(Door("comm", f"Comm.{method}", f"mpicoll.Comm.{method}", f"comm.{method}",
                          lambda ours=ours, args=args: ours(*args), lambda theirs=theirs, args=args: theirs(*args)))
    for method, args in _comm_methods(b):
        im = "I" + method[0].lower() + method[1:]
        ours, theirs = getattr(mc, im), getattr(comm, im)
        doors.append(Door("comm", f"Comm.{im}", f"mpicoll.Comm.{im}(..).Wait()", f"comm.{im}(..).Wait()",
                          lambda ours=ours, args=args: ours(*args).Wait(),
                          lambda theirs=theirs, args=args: theirs(*args).Wait()))
    for method, args in _comm_methods(b):
        theirs = _library_init(comm, method + "_init", args, keep)
        if theirs is None:
            continue
        ours = getattr(mc, method + "_init")(*args)
        keep.append(ours)
        doors.append(Door("comm", f"Comm.{method}_init", f"mpicoll.Comm.{method}_init: Start+Wait",
                          f"comm.{method}_init: Start+Wait", _start_wait(ours), _start_wait(theirs)))
    return doors


def _forced_doors(comm, b: _Buffers, keep: list) -> List[Door]:
    """Every all-reduce algorithm forced, blocking and persistent, vs native
    ``Allreduce`` and ``Allreduce_init``."""
    algs = [a for a in mpicoll.algorithms("allreduce") if a != "auto"]
    doors = []
    for alg in algs:
        doors.append(Door("forced", f"forced/{alg}", f"mpicoll.allreduce(x, out=y, algorithm={alg!r})",
                          "comm.Allreduce(x, y)",
                          lambda alg=alg: mpicoll.allreduce(b.x, out=b.y, comm=comm, algorithm=alg),
                          lambda: comm.Allreduce(b.x, b.y, MPI.SUM)))
    native = _library_init(comm, "Allreduce_init", (b.x, b.y, MPI.SUM), keep)
    if native is not None:
        for alg in algs:
            ours = mpicoll.allreduce_init(b.x, out=b.y, comm=comm, algorithm=alg)
            keep.append(ours)
            doors.append(Door("forced", f"forced_init/{alg}", f"mpicoll.allreduce_init(.., algorithm={alg!r})",
                              "comm.Allreduce_init(x, y)", _start_wait(ours), _start_wait(native)))
    return doors


class _TorchGroups:
    """torch.distributed's default group on the mpicoll backend and a gloo
    group over the same ranks (as ``bench torch`` sets them up)."""

    def __init__(self):
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch
        import torch.distributed as dist

        import mpicoll.torch  # noqa: F401  (registers mpi:// and the backend)

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        dist.init_process_group("mpicoll", init_method="mpi://")
        self.gloo = dist.new_group(backend="gloo")

    def doors(self, b: _Buffers) -> List[Door]:
        # zeros: all_reduce works in place, and sums of zeros stay zero (ones
        # would grow to inf over the run).
        t = self.torch.zeros(b.k, dtype=self.torch.float32)
        dist, gloo = self.dist, self.gloo
        return [Door("torch", "torch/all_reduce", "dist.all_reduce(t) [backend mpicoll]",
                     "dist.all_reduce(t, group=gloo)",
                     lambda: dist.all_reduce(t), lambda: dist.all_reduce(t, group=gloo))]

    def close(self):
        self.dist.destroy_process_group()


def check_args(groups, rounds: int, iters: int, budget_s: float) -> None:
    """Bad arguments end the run before anything collective, on every rank alike."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown door group(s) {sorted(unknown)}; the groups: {', '.join(GROUPS)}")
    if rounds < 1 or iters < 1 or not budget_s > 0:
        raise ValueError(f"rounds and iters must be >= 1 and the budget positive (got {rounds}, {iters}, {budget_s})")


def doors(comm, nbytes: int, groups, keep: list, torch_groups: Optional[_TorchGroups] = None) -> List[Door]:
    """Every selected row at one size, the same list in the same order on
    every rank (building the persistent ones is collective). Persistent
    requests go to ``keep``, to be freed after the size."""
    p, rank = comm.Get_size(), comm.Get_rank()
    b = _Buffers(p, nbytes)
    out = []
    if "functions" in groups:
        out += _function_doors(comm, b, rank)
    if "i" in groups:
        out += _i_doors(comm, b, rank)
    if "init" in groups:
        out += _init_doors(comm, b, rank, keep)
    if "comm" in groups:
        out += _comm_doors(comm, mpicoll.Comm(comm), b, keep)
    if "forced" in groups and nbytes <= FORCED_MAX_BYTES:
        out += _forced_doors(comm, b, keep)
    if "torch" in groups and torch_groups is not None:
        out += torch_groups.doors(b)
    return out


def _batch(comm, fn, iters: int) -> float:
    """The slowest rank's seconds per call over ``iters`` calls of ``fn``."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def measure(comm, rows: List[Door], rounds: int, iters: int, budget_s: float, warmup: int, rng) -> list:
    """[(ours, theirs, calls per batch)] per row, ours and theirs the
    slowest rank's seconds per call in each of the ``rounds``, every callable
    interleaved in an order ``rng`` shuffles each round (seeded alike on
    every rank)."""
    row_iters = []
    for d in rows:
        # Warm-up: the first calls build states, plans and caches; the
        # last few also say how many calls fit in the budget.
        slowest = 0.0
        for fn in (d.ours, d.theirs):
            for _ in range(max(0, warmup - 3)):
                fn()
            slowest = max(slowest, _batch(comm, fn, 3))
        row_iters.append(min(iters, max(3, int(budget_s / max(slowest, 1e-9)))))
    times = [([], []) for _ in rows]
    for _ in range(rounds):
        for i in rng.permutation(2 * len(rows)):
            r, side = divmod(int(i), 2)
            fn = rows[r].ours if side == 0 else rows[r].theirs
            times[r][side].append(_batch(comm, fn, row_iters[r]))
    return [(o, t, n) for (o, t), n in zip(times, row_iters)]


def run(comm, sizes, groups, rounds: int = 5, iters: int = 300, budget_s: float = 0.25, warmup: int = 20,
        seed: int = 0, torch_groups: Optional[_TorchGroups] = None) -> dict:
    """The whole measurement: {"meta": ..., "rows": [...]}, the same on every rank."""
    check_args(groups, rounds, iters, budget_s)
    started, load_before = time.gmtime(), os.getloadavg()
    rng = np.random.default_rng(seed)  # same seed everywhere: the same shuffles on every rank
    rows = []
    for nbytes in sizes:
        keep = []
        table = doors(comm, nbytes, groups, keep, torch_groups)
        for d, (ours, theirs, n) in zip(table, measure(comm, table, rounds, iters, budget_s, warmup, rng)):
            o, t = float(np.median(ours)), float(np.median(theirs))
            # Every round kept too: on a shared machine their spread says
            # how far a median can be trusted.
            rows.append({"group": d.group, "name": d.name, "door": d.label, "reference": d.reference,
                         "bytes": nbytes, "ours_us": o * 1e6, "reference_us": t * 1e6, "ratio": t / o,
                         "calls_per_batch": n, "ours_rounds_us": [v * 1e6 for v in ours],
                         "reference_rounds_us": [v * 1e6 for v in theirs]})
        for req in keep:
            req.Free()
    meta = {
        "schema": SCHEMA, "p": comm.Get_size(), "sizes": list(sizes), "groups": list(groups), "rounds": rounds,
        "iters": iters, "budget_ms": budget_s * 1e3, "warmup": warmup,
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", started), "host": platform.node(),
        "cpus": os.cpu_count(), "kernels_isa": kernels.isa(),
        "mpi_library": " ".join(MPI.Get_library_version().splitlines()[0].split()),
        "mpi_version": "%d.%d" % MPI.Get_version(), "mpi4py": __import__("mpi4py").__version__,
        "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
    }
    return {"meta": meta, "rows": rows}


def _fmt_size(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def table(res: dict) -> str:
    """The result as markdown: a header, then one table per group, a row per
    door, a column per size: ``ratio (mpicoll us / reference us)``."""
    m = res["meta"]
    load = lambda v: " ".join(f"{x:.2f}" for x in v)  # noqa: E731
    lines = [
        f"# mpicoll overhead, p={m['p']}, float32 sum, {m['date_utc']}, host {m['host']} ({m['cpus']} CPUs)",
        f"# {m['mpi_library']} (MPI {m['mpi_version']}), mpi4py {m['mpi4py']}, kernels: {m['kernels_isa']}",
        f"# load average (1/5/15 min) before {load(m['loadavg_before'])}, after {load(m['loadavg_after'])}",
        f"# median of {m['rounds']} interleaved rounds of the slowest rank's time per call; a batch is "
        f"{m['iters']} calls, fewer (>= 3) where {m['budget_ms']:.0f} ms would not fit them",
        "# cell: ratio = reference time / mpicoll time (> 1: mpicoll faster), then (mpicoll us / reference us)",
    ]
    sizes = m["sizes"]
    for group in m["groups"]:
        rows = [r for r in res["rows"] if r["group"] == group]
        if not rows:
            continue
        names = list(dict.fromkeys(r["name"] for r in rows))
        cell = {(r["name"], r["bytes"]): r for r in rows}
        lines += ["", f"## {group}", "",
                  "| door | reference | " + " | ".join(_fmt_size(n) for n in sizes) + " |",
                  "|---|---|" + "---:|" * len(sizes)]
        for name in names:
            first = next(r for r in rows if r["name"] == name)
            cells = []
            for n in sizes:
                r = cell.get((name, n))
                cells.append("-" if r is None else
                             f"{r['ratio']:.2f} ({r['ours_us']:.1f} / {r['reference_us']:.1f})")
            lines.append(f"| `{first['door']}` | `{first['reference']}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8,1K,64K", help="bytes per rank's block, comma-separated (K/M suffixes)")
    ap.add_argument("--doors", default=",".join(DEFAULT_GROUPS),
                    help=f"door groups, comma-separated, from {','.join(GROUPS)} (default: all but torch)")
    ap.add_argument("--torch", action="store_true", help="add the torch group (dist.all_reduce, mpicoll vs gloo)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=300, help="calls per timed batch (at most)")
    ap.add_argument("--budget-ms", type=float, default=250.0,
                    help="fewer calls per batch where the slower side of a row would take longer")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls of each callable first")
    ap.add_argument("--json", metavar="FILE", help="write the rows and the run's facts (rank 0)")
    args = ap.parse_args(argv)
    groups = [g for g in args.doors.split(",") if g]
    if args.torch and "torch" not in groups:
        groups.append("torch")
    check_args(groups, args.rounds, args.iters, args.budget_ms / 1e3)
    sizes = parse_sizes(args.sizes)
    comm = MPI.COMM_WORLD
    torch_groups = None
    if "torch" in groups:
        try:
            torch_groups = _TorchGroups()
        except ImportError:
            groups.remove("torch")
            if comm.Get_rank() == 0:
                print("# torch does not import: the torch group is left out")
    try:
        res = run(comm, sizes, groups, args.rounds, args.iters, args.budget_ms / 1e3,
                  args.warmup, torch_groups=torch_groups)
    finally:
        if torch_groups is not None:
            torch_groups.close()
    if comm.Get_rank() == 0:
        print(table(res))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
