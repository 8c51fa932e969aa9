"""DeepSpeed's CPU shared-memory all-reduce, timed as mpicoll.bench.shm times
its rows: the anchor issue 18 compares `auto` with (`make bench-deepspeed-anchor`).

DeepSpeed's op (csrc/cpu/comm/shm.cpp: every rank copies in, each reduces
its slice from all ranks' buffers, all copy out, spin flags) is reached
through its public call, ``deepspeed.comm.inference_all_reduce``, which
runs it once DeepSpeed has built the op (``ShareMemCommBuilder``, on first
use) and the environment says every rank is on this node (``LOCAL_SIZE``
equal to the world size: scripts/deepspeed_anchor.sh sets it). The script
checks the op is the one that ran (loaded, vector kernel level >= 1, sums
right) and also times gloo's ``all_reduce`` as a sanity reference.

Two figures per row, float32 sum, both of the slowest rank:
* best single call: the least of 60 calls each between barriers (what
  mpicoll.bench.shm reports);
* loop median: N calls back to back (~0.1 s), median of 7 repetitions.

Runs in a venv of its own (torch==2.13.0, a CPU build; deepspeed; ninja):
the Makefile target makes it. Arguments: sizes (8K 64K 1M).
"""
import statistics
import sys
import time

import torch

torch.set_num_threads(1)  # one core per rank, as mpicoll's ranks
import deepspeed  # noqa: E402
import deepspeed.comm as dist  # noqa: E402
import torch.distributed as tdist  # noqa: E402

dist.init_distributed(dist_backend="gloo")
rank, ws = tdist.get_rank(), tdist.get_world_size()
cdb = deepspeed.comm.comm.cdb
shm_loaded = hasattr(torch.ops, "deepspeed") and hasattr(torch.ops.deepspeed, "inference_all_reduce_")
level = getattr(cdb, "shm_vector_kernel_level", None)
if rank == 0:
    print(f"# torch {torch.__version__} deepspeed {deepspeed.__version__} world size {ws} "
          f"backend {type(cdb).__name__} shm op loaded {shm_loaded} vector kernel level {level}", flush=True)
assert shm_loaded and level is not None and level >= 1, "DeepSpeed's shm op is not active (LOCAL_SIZE set?)"

for n in (2048, 16384, 262144):  # through the public call: 1 + 2 = 3 on two ranks
    x = torch.full((n,), float(rank + 1))
    dist.inference_all_reduce(x)
    assert torch.all(x == ws * (ws + 1) / 2), (n, x[:4])


def parse(s: str) -> int:
    return int(s[:-1]) * {"K": 1 << 10, "M": 1 << 20}[s[-1]] if s[-1] in "KM" else int(s)


def slowest(v: float) -> float:
    t = torch.tensor([v], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t.item()


def bench(fn):
    for _ in range(20):
        fn()
    t0 = time.perf_counter()
    for _ in range(50):
        fn()
    # the same N on every rank: the calls are collective
    n = max(10, int(0.1 / slowest((time.perf_counter() - t0) / 50)))
    loop = []
    for _ in range(7):
        tdist.barrier()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        loop.append(slowest((time.perf_counter() - t) / n))
    single = []
    for _ in range(60):
        tdist.barrier()
        t = time.perf_counter()
        fn()
        single.append(time.perf_counter() - t)
    single_t = torch.tensor(single, dtype=torch.float64)
    tdist.all_reduce(single_t, op=tdist.ReduceOp.MAX)
    return single_t.min().item() * 1e6, statistics.median(loop) * 1e6


if rank == 0:
    print(f"{'bytes':>9} {'implementation':<36} {'best single (us)':>17} {'loop median (us)':>17}", flush=True)
for size in sys.argv[1:] or ["8K", "64K", "1M"]:
    nbytes = parse(size)
    x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(rank))
    y = x.clone()
    for name, fn in (("deepspeed shm inference_all_reduce", lambda: dist.inference_all_reduce(x)),
                     ("gloo torch.distributed.all_reduce", lambda: tdist.all_reduce(y))):
        best, med = bench(fn)
        if rank == 0:
            print(f"{nbytes:>9} {name:<36} {best:>17.1f} {med:>17.1f}", flush=True)
tdist.barrier()
tdist.destroy_process_group()
