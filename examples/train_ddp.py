"""PyTorch DistributedDataParallel on MPI: an MLP on scikit-learn's bundled digits.

    mpiexec -n 4 python -m mpi4py examples/train_ddp.py --backend mpicoll|gloo --hook none|allreduce|fp16|bf16|topk

Rank and world size come from MPI (``init_method="mpi://"``), so nothing
else needs setting; ``--backend gloo`` runs torch's own gloo backend over
the same rendezvous. ``--hook`` registers one of mpicoll.torch.hooks (with
gloo too: the hooks then run mpicoll on MPI.COMM_WORLD).

The data ship inside scikit-learn (1797 8x8 images, nothing downloaded;
``pip install mpicoll[examples]``), read as examples/train_data_parallel.py
reads them. How it is data-parallel:

* every rank builds the same model from the same seed (DDP also broadcasts
  rank 0's weights) and walks the same shuffled order, so all ranks agree on
  every global batch; rank r takes ``np.array_split(batch, p)[r]``;
* each rank's loss is its samples' summed loss times p / (global batch
  size): DDP averages the gradients over the p ranks, so the result is the
  gradient of the global batch's mean loss - what one process computes -
  whatever p is, even when the shares are unequal;
* the same SGD update on the same all-reduced gradients keeps the weights
  bit-identical on every rank: the run ends with each rank's weight
  sha256, and trains the same model on one process (rank 0, no DDP) to
  compare test accuracies.
"""
import os

# One BLAS/OpenMP thread per rank: p ranks already share the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from mpi4py import MPI  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mpicoll.torch  # noqa: E402,F401  (registers mpi:// and the "mpicoll" backend)
from mpicoll.bench.torch import mlp as make_model  # noqa: E402  (the model `make bench-torch` times)
from mpicoll.torch import hooks  # noqa: E402
from train_data_parallel import load_data  # noqa: E402  (the digits, as the numpy example reads them)


def weights_sha256(model) -> str:
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def accuracy(model, x, y) -> float:
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def train(model, data, *, p=1, rank=0, epochs=20, batch=64, lr=0.1, momentum=0.9, seed=0, log=None):
    """SGD with momentum; ``model`` is a DDP module for p > 1. Returns the last test accuracy."""
    xtr, ytr, xte, yte = (torch.from_numpy(a) for a in data)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    acc = 0.0
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(ytr))  # same on every rank
        t0 = time.perf_counter()
        loss_sum = 0.0
        for start in range(0, len(order), batch):
            global_batch = order[start:start + batch]
            mine = torch.from_numpy(np.array_split(global_batch, p)[rank])
            opt.zero_grad(set_to_none=False)
            losses = torch.nn.functional.cross_entropy(model(xtr[mine]), ytr[mine], reduction="sum")
            (losses * (p / len(global_batch))).backward()
            opt.step()
            loss_sum += float(losses)
        elapsed = time.perf_counter() - t0
        acc = accuracy(model, xte, yte)
        if log is not None:
            log(epoch + 1, loss_sum, elapsed, acc)
    return acc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="mpicoll", choices=["mpicoll", "gloo"])
    ap.add_argument("--hook", default="none", choices=["none", *hooks.HOOKS])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--no-single", action="store_true", help="skip the 1-process reference run")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    dist.init_process_group(args.backend, init_method="mpi://")
    p, rank = dist.get_world_size(), dist.get_rank()
    comm = MPI.COMM_WORLD
    data = load_data()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"digits: {len(data[1])} train / {len(data[3])} test samples, p={p}, backend {args.backend}, "
        f"hook {args.hook}, global batch {args.batch}")

    def log(epoch, loss_sum, elapsed, acc):
        total = comm.allreduce(loss_sum, op=MPI.SUM)
        slowest = comm.allreduce(elapsed, op=MPI.MAX)
        say(f"epoch {epoch:>3}  loss {total / len(data[1]):.4f}  test acc {acc:.4f}  {slowest:.3f} s")

    model = DDP(make_model())
    if args.hook != "none":
        model.register_comm_hook(hooks.State(), hooks.HOOKS[args.hook])
    kw = dict(epochs=args.epochs, batch=args.batch, lr=args.lr)
    acc = train(model, data, p=p, rank=rank, log=log, **kw)
    sums = comm.gather(weights_sha256(model.module), root=0)
    if rank == 0:
        for r, s in enumerate(sums):
            print(f"rank {r} weights sha256 {s}")
        print(f"weights identical on all ranks: {'yes' if len(set(sums)) == 1 else 'NO'}")
    if not args.no_single:
        if rank == 0:
            acc1 = train(make_model(), data, **kw)
            print(f"test accuracy: p={p} {acc:.4f} ({args.backend}, hook {args.hook}), 1 process {acc1:.4f}, "
                  f"difference {100 * (acc - acc1):+.2f} points")
        # The others wait without spinning in MPI, which would take rank 0's core.
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.01)
    else:
        say(f"test accuracy: p={p} {acc:.4f}")
    # Free DDP before its process group, then give torch's worker threads a
    # moment. With gloo, a collective started during backward() holds a Python
    # object, and a gloo worker thread that drops the last reference to it
    # takes the GIL; the process group's destructor joins those threads while
    # holding the GIL. If DDP's reducer took the group with it, a worker still
    # finishing its last all-reduce and the destructor would wait for each
    # other for ever (seen once in a few runs under CI's load, Open MPI p = 2).
    # Freed in this order, the workers are done by the time the group goes.
    del model
    time.sleep(0.1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
