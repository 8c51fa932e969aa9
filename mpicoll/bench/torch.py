"""torch.distributed on the "mpicoll" backend against gloo, in one run:
``mpiexec -n 2 python -m mpi4py -m mpicoll.bench torch``.

Two process groups over the same ranks: the default one on the mpicoll
backend (``init_method="mpi://"``) and ``new_group(backend="gloo")``. For
each size (float32, 8 B to 64 MiB by default) ``dist.all_reduce`` (sum,
synchronous) runs on each group in turn, interleaved, so that both see the
same machine load; each figure is the best of ``--repeat`` timed runs of
several calls (the slowest rank's time per call). speed-up = gloo time /
mpicoll time. The bare ``mpicoll.allreduce`` on the same numpy memory is
printed for reference (what the backend's Python layer costs on top).

Then DDP step time (forward, backward with the gradient all-reduce, SGD
step) of an MLP like examples/train_ddp.py's (64 inputs, hidden widths
``--ddp-hidden``, 10 outputs) on a batch of 64 split over the ranks: DDP on
gloo (plain, and with torch's own fp16_compress_hook), DDP on mpicoll
without a hook, and mpicoll with each hook of mpicoll.torch.hooks.
``make bench-torch-testbed`` runs it across two network-namespace hosts
joined by a 1 Gbit/s link, where the gradients' bytes, not the ranks'
CPU, set the step time (wider layers: more gradient per step).
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
from mpi4py import MPI


def _sizes(spec: str) -> list:
    def parse(s):
        s = s.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
        return int(s[:-1] if s[-1:] in "KMG" else s) * mult
    lo, hi = (parse(x) for x in spec.split(":"))
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 8 if n < (1 << 20) else 4
    if out[-1] != hi:
        out.append(hi)
    return out


def _fmt(n: int) -> str:
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def _time(comm, fn, calls: int, repeat: int) -> float:
    """Best over ``repeat`` runs of the slowest rank's seconds per call."""
    best = float("inf")
    for _ in range(repeat):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / calls
        best = min(best, dt)
    return best


def allreduce_table(comm, gloo, sizes, repeat):
    import torch
    import torch.distributed as dist

    import mpicoll

    rows = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        calls = max(3, min(2000, (32 << 20) // max(nbytes, 1) // 8))
        for _ in range(2):  # warm-up: first-call set-up (communicator state, scratch)
            dist.all_reduce(t)
            dist.all_reduce(t, group=gloo)
        arr = t.numpy()
        res = {"mpicoll": [], "gloo": [], "bare": []}
        for _ in range(repeat):  # interleaved, so both meet the same load
            res["mpicoll"].append(_time(comm, lambda: dist.all_reduce(t), calls, 1))
            res["gloo"].append(_time(comm, lambda: dist.all_reduce(t, group=gloo), calls, 1))
            res["bare"].append(_time(comm, lambda: mpicoll.allreduce(arr, out=arr, comm=comm), calls, 1))
        m, g, b = min(res["mpicoll"]), min(res["gloo"]), min(res["bare"])
        rows.append((nbytes, m, g, b))
    return rows


def mlp(hidden=(256, 128), seed=0):
    """The DDP example's model (examples/train_ddp.py imports it from here, so
    that the bench times exactly what the example trains): 64 inputs (8x8
    digits), ReLU layers of the ``hidden`` widths, 10 classes; the weights
    drawn from ``seed``, the same on every rank."""
    import torch

    torch.manual_seed(seed)
    sizes = [64, *hidden, 10]
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def ddp_table(comm, gloo, repeat, steps, hidden=(256, 128)):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ..torch import hooks

    p, rank = comm.Get_size(), comm.Get_rank()
    torch.manual_seed(0)
    x = torch.rand(64, 64)[rank::p].contiguous()
    y = torch.randint(0, 10, (64,))[rank::p].contiguous()
    cases = [("gloo", "none"), ("gloo", "torch-fp16"), ("mpicoll", "none")] + [("mpicoll", h) for h in hooks.HOOKS]
    steppers = []
    for backend, hook in cases:
        model = DDP(mlp(hidden), process_group=gloo if backend == "gloo" else None)
        if hook == "torch-fp16":  # PyTorch's own fp16 hook, on the gloo group (the reference)
            model.register_comm_hook(gloo, default_hooks.fp16_compress_hook)
        elif hook != "none":
            model.register_comm_hook(hooks.State(), hooks.HOOKS[hook])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def step(model=model, opt=opt):
            opt.zero_grad(set_to_none=False)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        for _ in range(3):  # DDP rebuilds its buckets after the first iteration
            step()
        steppers.append(step)
    best = [float("inf")] * len(cases)
    for _ in range(repeat):  # the cases interleaved, so that all meet the same machine load
        for i, step in enumerate(steppers):
            best[i] = min(best[i], _time(comm, step, steps, 1))
    return [(backend, hook, t) for (backend, hook), t in zip(cases, best)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mpicoll.bench torch", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8:64M", help="LO:HI in bytes (K/M suffixes), default 8:64M")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ddp-steps", type=int, default=30)
    ap.add_argument("--ddp-hidden", default="256,128",
                    help="the DDP model's hidden layer widths (default 256,128: 203 KB of gradients)")
    ap.add_argument("--no-ddp", action="store_true")
    ap.add_argument("--no-allreduce", action="store_true", help="only the DDP table")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import mpicoll.torch  # noqa: F401  (registers mpi:// and the backend)

    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    dist.init_process_group("mpicoll", init_method="mpi://")
    gloo = dist.new_group(backend="gloo")
    p = comm.Get_size()
    out = comm.Get_rank() == 0
    rows = [] if args.no_allreduce else allreduce_table(comm, gloo, _sizes(args.sizes), args.repeat)
    if out and rows:
        print(f"dist.all_reduce, float32 sum, p={p}: time per call (best of {args.repeat}), speed-up = gloo / mpicoll")
        print(f"{'size':>9} {'mpicoll us':>11} {'gloo us':>11} {'speed-up':>9} {'bare mpicoll us':>16} {'GB/s mpicoll':>13}")
        for nbytes, m, g, b in rows:
            print(f"{_fmt(nbytes):>9} {m * 1e6:11.1f} {g * 1e6:11.1f} {g / m:8.1f}x {b * 1e6:16.1f} {nbytes / m / 1e9:13.2f}")
    if not args.no_ddp:
        hidden = [int(w) for w in args.ddp_hidden.split(",")]
        drows = ddp_table(comm, gloo, args.repeat, args.ddp_steps, hidden)
        if out:
            shape = "-".join(str(w) for w in [64, *hidden, 10])
            nparams = sum(a * b + b for a, b in zip([64, *hidden], [*hidden, 10]))
            print(f"\nDDP step (MLP {shape}, {nparams * 4 / 1e6:.2f} MB of float32 gradients, batch 64 over {p} "
                  f"ranks), best of {args.repeat} x {args.ddp_steps} steps; speed-up = gloo (no hook) / this")
            print(f"{'backend':>8} {'hook':>10} {'ms/step':>8} {'speed-up':>9}")
            base = drows[0][2]
            for backend, hook, t in drows:
                print(f"{backend:>8} {hook:>10} {t * 1e3:8.3f} {base / t:8.2f}x")
    dist.destroy_process_group()
    return 0
