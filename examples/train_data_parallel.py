"""Data-parallel training of a small MLP on scikit-learn's handwritten digits.

    mpiexec -n 4 python -m mpi4py examples/train_data_parallel.py [--compression fp16|bf16|topk|topk:0.05]
        [--sharded [--compare]] [--staleness K] [--slow-rank R --slow-ms M] [--algorithm ring]

The data set ships inside scikit-learn (``sklearn.datasets.load_digits``:
1797 8x8 images, 10 classes); nothing is downloaded. Install it with
``pip install mpicoll[examples]`` (``make install`` does).

How it is data-parallel:

* every rank builds the same model from the same seed and sees the same
  shuffled order of the training set, so all ranks agree on every global
  batch; rank r trains on its share ``np.array_split(batch, p)[r]``;
* each rank's gradient is the sum over its samples divided by the *global*
  batch size, so the all-reduced sum (``op="sum"``) is exactly the gradient
  of the global batch - what one process would compute - whatever p is;
* the backward pass writes each layer's gradients straight into the
  ``mpicoll.GradientBucketer``'s views (no copies) and marks them ready as
  they are produced, last layer first: a bucket's all-reduce starts while
  the earlier layers' gradients are still being computed;
* the same SGD update on the same reduced gradients keeps the weights
  identical on every rank; the run ends by printing each rank's checksum.

Per epoch it prints the mean training loss, the test accuracy, and the time
of the slowest rank split into compute (forward, backward, update) and
communication (time spent inside mark_ready and wait, i.e. the part of the
all-reduce that the computation did not hide). At the end it trains the same
model on one process (rank 0, in-process, uncompressed) and prints both test
accuracies.

``--sharded`` trains with ``mpicoll.ShardedOptimizer`` (each rank keeps the
momentum of 1/p of the weights; the all-gathers of step t's weights overlap
step t+1's forward, layer by layer); ``--compare`` also runs the all-reduce
path and says whether the weights are bit-identical (they are with
``--algorithm ring``). ``--staleness K`` reduces the gradients with
``mpicoll.StaleAllreduce``: step t applies the summed gradient of step t-K.
``--slow-rank R --slow-ms M``: rank R sleeps M ms per step.
"""
from __future__ import annotations

import os

# One BLAS thread per rank: p ranks already share the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpicoll  # noqa: E402


def load_digits_arrays():
    """(images as 1797 x 64 float64, labels) of scikit-learn's bundled digits.

    Reads the CSV that scikit-learn ships (what ``load_digits`` reads) with
    numpy, so that each rank does not import scikit-learn and SciPy (about
    1.5 s of CPU per rank, which on a small machine costs more than the
    training); falls back to ``load_digits`` if the file is not where
    scikit-learn 1.x keeps it."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None:
        raise SystemExit("scikit-learn is needed for the digits data set: pip install mpicoll[examples]")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if os.path.exists(path):
        table = np.loadtxt(path, delimiter=",")
        return table[:, :-1], table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.data, digits.target.astype(np.int64)


def load_data(seed=0, test_fraction=0.2):
    """Digits scaled to [0, 1], split into train and test by a fixed permutation."""
    data, target = load_digits_arrays()
    x = (data / 16.0).astype(np.float32)
    y = target
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = perm[:n_test], perm[n_test:]
    return x[train], y[train], x[test], y[test]


def init_params(sizes, seed=0):
    """[W1, b1, W2, b2, ...] float32, He initialisation; the same on every rank."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32))
        params.append(np.zeros(fan_out, np.float32))
    return params


def forward(params, x, wait=None):
    """Activations of every layer (ReLU hidden layers) and the logits.
    ``wait(indices)``, if given, is called before a layer's parameters are
    read (the sharded optimizer's all-gathers finish layer by layer)."""
    acts = [x]
    h = x
    nlayers = len(params) // 2
    for layer in range(nlayers):
        if wait is not None:
            wait((2 * layer, 2 * layer + 1))
        w, b = params[2 * layer], params[2 * layer + 1]
        h = h @ w + b
        if layer < nlayers - 1:
            h = np.maximum(h, 0.0)
        acts.append(h)
    return acts


def softmax_xent(logits, y):
    """Per-sample cross-entropy losses and d(loss)/d(logits), per sample."""
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    prob = e / e.sum(axis=1, keepdims=True)
    losses = -np.log(np.maximum(prob[np.arange(len(y)), y], 1e-30))
    dlogits = prob
    dlogits[np.arange(len(y)), y] -= 1.0
    return losses, dlogits


def backward(params, acts, dlogits, scale, grads, ready):
    """Backpropagation, last layer first. Writes d(sum of losses)*scale for
    parameter i into ``grads[i]`` and calls ``ready(i)`` as soon as it is final."""
    nlayers = len(params) // 2
    delta = dlogits * np.float32(scale)
    for layer in range(nlayers - 1, -1, -1):
        iw, ib = 2 * layer, 2 * layer + 1
        np.matmul(acts[layer].T, delta, out=grads[iw])
        np.sum(delta, axis=0, out=grads[ib])
        ready(ib)
        ready(iw)
        if layer:
            delta = (delta @ params[iw].T) * (acts[layer] > 0)


def accuracy(params, x, y):
    return float(np.mean(np.argmax(forward(params, x)[-1], axis=1) == y))


def checksum(params) -> str:
    h = hashlib.sha256()
    for p in params:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()[:16]


def train(comm, data, *, hidden=(256, 128), epochs=20, batch=64, lr=0.1, momentum=0.9, seed=0,
          compression=None, bucket_bytes=64 << 10, first_bucket_bytes=16 << 10, log=None, sharded=False,
          staleness=None, slow_rank=None, slow_ms=0.0, algorithm="auto"):
    """Train on ``comm``'s ranks; returns (params, history, reducer). ``log(row)`` is
    called on every rank with each epoch's row (dict).

    The reducer is a GradientBucketer (default), a ShardedOptimizer
    (``sharded``) or a StaleAllreduce (``staleness`` not None: one flat
    gradient, step t applies step t-staleness's sum). ``slow_rank`` sleeps
    ``slow_ms`` per step (a straggler)."""
    xtr, ytr, xte, yte = data
    p, rank = comm.Get_size(), comm.Get_rank()
    sizes = [xtr.shape[1], *hidden, int(ytr.max()) + 1]
    params = init_params(sizes, seed)
    wait = None

    def sgd(w, g, state):  # the update, elementwise: the same on whole arrays and on shards
        v = state["v"]
        v *= momentum
        v += g
        w -= lr * v

    if sharded:
        if compression is not None or staleness is not None:
            raise SystemExit("--sharded takes no --compression or --staleness")
        reducer = mpicoll.ShardedOptimizer(params, sgd, init_state=lambda w: {"v": np.zeros_like(w)}, comm=comm,
                                           op="sum", bucket_bytes=bucket_bytes,
                                           first_bucket_bytes=first_bucket_bytes, algorithm=algorithm)
        params, grads = reducer.params, reducer.grads
        state_nbytes = reducer.state_nbytes()
    else:
        velocity = [np.zeros_like(w) for w in params]
        state_nbytes = sum(v.nbytes for v in velocity)
        if staleness is not None:
            if compression is not None:
                raise SystemExit("--staleness takes no --compression")
            flat = np.zeros(sum(w.size for w in params), np.float32)
            offsets = np.cumsum([0] + [w.size for w in params])
            grads = [flat[a:b].reshape(w.shape) for a, b, w in zip(offsets[:-1], offsets[1:], params)]
            reducer = mpicoll.StaleAllreduce(flat.shape, flat.dtype, staleness=staleness, comm=comm, op="sum",
                                             algorithm=algorithm)
        else:
            reducer = mpicoll.GradientBucketer([(w.shape, w.dtype) for w in params], comm=comm, op="sum",
                                               bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                                               compression=compression, algorithm=algorithm)
            grads = reducer.views  # the backward pass writes here: zero-copy
    history = []
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(ytr))  # same on every rank
        t_compute = t_comm = 0.0
        loss_sum = 0.0
        steps = 0
        comm.Barrier()
        t_epoch = time.perf_counter()
        for start in range(0, len(order), batch):
            global_batch = order[start:start + batch]
            mine = np.array_split(global_batch, p)[rank]
            t0 = time.perf_counter()
            comm_in_step = 0.0

            def timed(fn):
                def call(*a):
                    nonlocal comm_in_step
                    t = time.perf_counter()
                    fn(*a)
                    comm_in_step += time.perf_counter() - t
                return call

            if sharded:
                wait = timed(reducer.wait_params)
            acts = forward(params, xtr[mine], wait)
            losses, dlogits = softmax_xent(acts[-1], ytr[mine])
            loss_sum += float(losses.sum())
            ready = (lambda i: None) if staleness is not None else timed(reducer.mark_ready)
            backward(params, acts, dlogits, 1.0 / len(global_batch), grads, ready)
            if rank == slow_rank and slow_ms > 0:
                time.sleep(slow_ms / 1000.0)
            t1 = time.perf_counter()
            if sharded:
                reducer.step()  # waits for the reduce-scatters, updates the shards, starts the all-gathers
                t2 = t3 = time.perf_counter()
                t_compute += (t1 - t0 - comm_in_step)
                t_comm += comm_in_step + (t2 - t1)
                steps += 1
                continue
            if staleness is not None:
                avg = reducer.step(flat)
                t2 = time.perf_counter()
                if avg is not None:
                    offs = zip(offsets[:-1], offsets[1:])
                    for w, v, (a, b) in zip(params, velocity, offs):
                        sgd(w, avg[a:b].reshape(w.shape), {"v": v})
            else:
                reducer.wait()
                t2 = time.perf_counter()
                for w, v, g in zip(params, velocity, grads):
                    sgd(w, g, {"v": v})
            t3 = time.perf_counter()
            t_comm += comm_in_step + (t2 - t1)
            t_compute += (t1 - t0 - comm_in_step) + (t3 - t2)
            steps += 1
        if sharded:
            reducer.wait_params()
        t_epoch = time.perf_counter() - t_epoch
        stats = np.array([loss_sum, t_compute, t_comm])
        total_loss = comm.allreduce(stats[0], op=MPI.SUM)
        t_compute, t_comm = comm.allreduce(stats[1], op=MPI.MAX), comm.allreduce(stats[2], op=MPI.MAX)
        t_epoch = comm.allreduce(t_epoch, op=MPI.MAX)
        row = {"epoch": epoch + 1, "loss": total_loss / len(ytr), "test_acc": accuracy(params, xte, yte),
               "compute_s": t_compute, "comm_s": t_comm, "step_ms": 1e3 * t_epoch / max(steps, 1),
               "state_bytes": state_nbytes}
        history.append(row)
        if log is not None:
            log(row)
    if staleness is not None:
        reducer.drain()  # the last sums in flight: completed, not applied
    return params, history, reducer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compression", default=None, help="fp16, bf16, topk or topk:RATIO (default: none)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="global batch size (default 64)")
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    ap.add_argument("--bucket-kib", type=int, default=64, help="bucket size in KiB (default 64)")
    ap.add_argument("--first-bucket-kib", type=int, default=16)
    ap.add_argument("--no-single", action="store_true", help="skip the 1-process reference run")
    ap.add_argument("--sharded", action="store_true",
                    help="mpicoll.ShardedOptimizer: reduce-scatter, 1/p of the update per rank, all-gather")
    ap.add_argument("--compare", action="store_true",
                    help="with --sharded: also train with the bucketed all-reduce and compare the weights")
    ap.add_argument("--staleness", type=int, default=None,
                    help="mpicoll.StaleAllreduce: step t applies step t-K's gradient sum (0: synchronous)")
    ap.add_argument("--slow-rank", type=int, default=None, help="this rank sleeps --slow-ms per step")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--algorithm", default="auto", help="collective algorithm (ring: sharded == all-reduce bits)")
    args = ap.parse_args(argv)

    comm = MPI.COMM_WORLD
    p, rank = comm.size, comm.rank
    data = load_data()
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"digits: {len(data[1])} train / {len(data[3])} test samples, MLP {[64, *args.hidden, 10]}, "
        f"p={p}, global batch {args.batch}, compression={args.compression}, sharded={args.sharded}, "
        f"staleness={args.staleness}, slow rank {args.slow_rank} +{args.slow_ms:g} ms/step, "
        f"algorithm={args.algorithm}")

    def log(row):
        say(f"epoch {row['epoch']:>3}  loss {row['loss']:.4f}  test acc {row['test_acc']:.4f}  "
            f"compute {row['compute_s']:.3f} s  comm {row['comm_s']:.3f} s  step {row['step_ms']:.2f} ms")

    kw = dict(hidden=tuple(args.hidden), epochs=args.epochs, batch=args.batch, lr=args.lr, momentum=args.momentum,
              bucket_bytes=args.bucket_kib << 10, first_bucket_bytes=args.first_bucket_kib << 10,
              algorithm=args.algorithm)
    params, history, bucketer = train(comm, data, compression=args.compression, log=log, sharded=args.sharded,
                                      staleness=args.staleness, slow_rank=args.slow_rank, slow_ms=args.slow_ms,
                                      **kw)
    if args.staleness is None:
        say(f"buckets (gradient indices, launch order): {bucketer.buckets}")
    states = comm.gather(history[-1]["state_bytes"], root=0)
    median_step = float(np.median([row["step_ms"] for row in history]))
    say(f"optimizer state per rank: {states} bytes; step time {median_step:.2f} ms "
        f"(slowest rank, median over epochs)")
    if args.sharded and args.compare:
        ref, ref_hist, _ = train(comm, data, **kw)
        same = all(np.array_equal(a, b) for a, b in zip(params, ref))
        diff = max(float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(params, ref))
        say(f"all-reduce path: test acc {ref_hist[-1]['test_acc']:.4f}, state per rank "
            f"{ref_hist[-1]['state_bytes']} bytes, step "
            f"{float(np.median([r['step_ms'] for r in ref_hist])):.2f} ms; sharded weights bit-identical: "
            f"{'yes' if comm.allreduce(same, op=MPI.LAND) else 'no'} (max |difference| {diff:.3g})")
    sums = comm.gather(checksum(params), root=0)
    if rank == 0:
        for r, s in enumerate(sums):
            print(f"rank {r} weights sha256 {s}")
        print(f"weights identical on all ranks: {'yes' if len(set(sums)) == 1 else 'NO'}")
    acc = history[-1]["test_acc"]
    if not args.no_single:
        if rank == 0:
            _, single, _ = train(MPI.COMM_SELF, data, compression=None, **kw)
            acc1 = single[-1]["test_acc"]
            print(f"test accuracy: p={p} {acc:.4f} ({args.compression or 'uncompressed'}), "
                  f"1 process {acc1:.4f} (uncompressed), difference {100 * (acc - acc1):+.2f} points")
        # Other ranks wait without spinning in MPI (which would take rank 0's core).
        req = comm.Ibarrier()
        while not req.Test():
            time.sleep(0.01)
    else:
        say(f"test accuracy: p={p} {acc:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
