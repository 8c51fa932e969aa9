"""Run by tests/test_testbed.py on scripts/testbed.sh's hosts (not collected
by pytest): node discovery, every all-reduce algorithm and reproducible=True
across real network namespaces, and the bytes each algorithm sends across
hosts, from the links' counters. Prints "TESTBED OK" on rank 0."""
import socket
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import mpicoll  # noqa: E402
from conftest import exact_values, reference  # noqa: E402
from mpicoll.bench.shm import link_tx_bytes  # noqa: E402
from mpicoll.commstate import state  # noqa: E402
from mpicoll.node import node_info  # noqa: E402

comm = MPI.COMM_WORLD
p, rank = comm.size, comm.rank
expect = [int(k) for k in sys.argv[1].split(",")]  # ranks per host, as testbed.sh --ppn

info = node_info(state(comm))
hosts = comm.allgather(socket.gethostname())
assert info.nodes == len(expect), (info.nodes, expect, hosts)
assert [len(r) for r in info.node_ranks] == expect
assert all(len({hosts[r] for r in rs}) == 1 for rs in info.node_ranks), hosts
assert len(set(hosts)) == len(expect)

for alg in mpicoll.algorithms("allreduce"):
    for name, op in (("float32", "sum"), ("float16", "sum"), ("int64", "prod")):
        for n in (0, 1, p + 1, 70001):
            inputs = [exact_values(name, op, n, 3 + r) for r in range(p)]
            got = mpicoll.allreduce(inputs[rank], op=op, algorithm=alg)
            assert np.array_equal(got.astype(np.float64), reference(inputs, op, p).astype(np.float64)), (alg, name, n)
            assert all(d == got.tobytes() for d in comm.allgather(got.tobytes()))
    floats = [np.random.default_rng(r).standard_normal(5001).astype(np.float32) * (r + 1) for r in range(p)]
    got = mpicoll.allreduce(floats[rank], algorithm=alg, reproducible=True)
    assert got.tobytes() == reference(floats, "sum", p).tobytes(), alg

# Bytes across hosts per call (the host's tb0 counter over its ranks): the
# two-level algorithm sends each node's data across once per slice; a flat
# ring sends 2(p-1)/p n from every rank on a host boundary.
x = np.ones(1 << 18, np.float32)
sent = {}
for alg in ("hierarchical", "ring"):
    mpicoll.allreduce(x, algorithm=alg)
    comm.Barrier()
    before = link_tx_bytes() if info.local_rank == 0 else 0
    for _ in range(3):
        mpicoll.allreduce(x, algorithm=alg)
    comm.Barrier()
    mine = link_tx_bytes() - before if info.local_rank == 0 else 0
    sent[alg] = comm.allreduce(mine) / 3 / p
if info.uniform:
    assert sent["hierarchical"] < sent["ring"], sent
if rank == 0:
    print("bytes across hosts per rank per call:", {k: round(v / x.nbytes, 2) for k, v in sent.items()}, "x n")
    print("TESTBED OK", flush=True)
