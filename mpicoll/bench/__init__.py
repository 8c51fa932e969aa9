"""mpicoll's benchmarks.

    mpiexec -n 4 python -m mpicoll.bench [allreduce] [--sizes 8:64M] [--json F] [--csv F] [--plot F.png] [--explain]
                                                   # every all-reduce algorithm vs MPI_Allreduce (the default)
    python -m mpicoll.bench kernels [--mib 16]     # C kernels vs numpy, no MPI needed
    mpiexec -n 4 python -m mpi4py -m mpicoll.bench compression   # fp16/bf16/top-k: time and bytes sent
    mpiexec -n 4 python -m mpi4py -m mpicoll.bench bucketing     # fused buckets vs one all-reduce per array
    mpiexec -n 2 python -m mpi4py -m mpicoll.bench torch         # torch.distributed: mpicoll backend vs gloo
    mpiexec -n 2 python -m mpi4py -m mpicoll.bench overhead      # per-call cost of every door vs the same mpi4py call
    mpiexec -n 2 python -m mpi4py -m mpicoll.bench overlap       # nonblocking overlap, every algorithm
    mpiexec -n 4 python -m mpi4py -m mpicoll.bench family        # scatter ... alltoallv vs native MPI

``python -m mpicoll.bench allreduce --help`` lists every option.
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if argv and argv[0] == "kernels":
        from .kernels import main as kernels_main

        return kernels_main(argv[1:])
    elif argv and argv[0] == "compression":
        from .compression import main as compression_main

        return compression_main(argv[1:])
    elif argv and argv[0] == "bucketing":
        from .bucketing import main as bucketing_main

        return bucketing_main(argv[1:])
    elif argv and argv[0] == "torch":  # torch.distributed: backend "mpicoll" vs gloo, DDP hooks
        from .torch import main as torch_main

        return torch_main(argv[1:])
    elif argv and argv[0] == "overhead":  # mpiexec -n 2 python -m mpi4py -m mpicoll.bench overhead
        from .overhead import main as overhead_main

        return overhead_main(argv[1:])
    elif argv and argv[0] == "family":  # mpiexec -n 4 python -m mpi4py -m mpicoll.bench family
        return __import__("mpicoll.bench.family", fromlist=["main"]).main(argv[1:])
    elif argv and argv[0] == "overlap":  # mpiexec -n 2 python -m mpi4py -m mpicoll.bench overlap
        from .overlap import main as overlap_main

        return overlap_main(argv[1:])
    if argv and argv[0] == "allreduce":
        argv = argv[1:]
    elif argv and not argv[0].startswith("-"):
        print(__doc__.strip())
        return 2
    from .allreduce import main as allreduce_main

    return allreduce_main(argv)
