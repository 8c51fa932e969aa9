"""DDP communication hooks that run on mpicoll.

    from mpicoll.torch import hooks
    model = DistributedDataParallel(net)                       # backend "mpicoll" or "gloo"
    model.register_comm_hook(hooks.State(), hooks.allreduce_hook)
    model.register_comm_hook(hooks.State(algorithm="ring"), hooks.allreduce_hook)
    model.register_comm_hook(hooks.State(reproducible=True), hooks.allreduce_hook)
    model.register_comm_hook(hooks.State(), hooks.fp16_hook)   # or bf16_hook
    model.register_comm_hook(hooks.State(topk_ratio=0.01), hooks.topk_hook)

Every hook averages the bucket over the ranks, like DDP's own all-reduce.
``State(comm=None)`` takes the MPI communicator from the process group when
it is an mpicoll one, else MPI.COMM_WORLD (gloo launched with mpi://, whose
ranks are MPI's); it duplicates it, so the hooks' messages never meet
anything else. Create the State on every rank at the same point (it is
collective) and keep one per model.

How each one runs:

* ``allreduce_hook``: mpicoll's nonblocking all-reduce on the bucket's
  memory, in place; it returns at once and the backward pass goes on. The
  future is completed from mpicoll's progress thread (or, without it, from
  a waiter thread that advances the request - DDP waits on the future in
  C++, where no Python test()/wait() would ever make progress; see
  _completion.py). ``reproducible=True``: bit-identical results for any p
  and algorithm (mpicoll's nonblocking reproducible all-reduce).
* ``fp16_hook`` / ``bf16_hook``: the bucket, divided by the world size, plus
  this rank's carried rounding error, is cast to 16 bits *in the hook*; the
  plain nonblocking all-reduce sums the 16-bit buffer (half the bytes);
  the completion callback widens it back into the bucket. What the cast
  lost is kept per bucket and added to the next iteration's bucket (error
  feedback), so rounding errors are delayed, not dropped.
* ``topk_hook``: ``mpicoll.iallreduce(..., compression=TopK)`` - each rank
  sends its k largest entries, the rest stays in a per-bucket residual
  (error feedback, see mpicoll/compression.py); nonblocking too.

The hook's second parameter must be named ``bucket``: torch 2.13 checks the
signature of a Python hook, and the return annotation too, so this module
keeps real annotations (no ``from __future__ import annotations``, which
would turn them into strings that fail that check).
"""

import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll

from . import _completion
from .backend import ProcessGroupMpicoll
from .tensors import reducible


class State:
    """What the hooks keep between iterations: communicator, options, residuals."""

    def __init__(self, process_group=None, *, comm=None, algorithm="auto", reproducible=False, topk_ratio=0.01):
        if comm is None:
            pg = process_group if process_group is not None else dist.group.WORLD
            comm = pg.comm if isinstance(pg, ProcessGroupMpicoll) else MPI.COMM_WORLD
        self.comm = comm.Dup()
        self.size = self.comm.Get_size()
        self.algorithm = algorithm
        self.reproducible = reproducible
        self.topk_ratio = topk_ratio
        self.residuals = {}  # bucket index -> float32 tensor (fp16/bf16 error feedback)
        self.topk = {}  # bucket index -> mpicoll.TopK
        self.pending = []  # this iteration's requests of earlier buckets

    def residual(self, index: int, like: torch.Tensor) -> torch.Tensor:
        r = self.residuals.get(index)
        if r is None or r.shape != like.shape:  # DDP rebuilds its buckets after the first iteration
            r = self.residuals[index] = torch.zeros_like(like)
        return r


def _launch(state: State, bucket: dist.GradBucket, run, finish) -> torch.futures.Future[torch.Tensor]:
    """Run a bucket's collective: ``run(nonblocking)`` starts it (returns a
    request) or, with False, runs it to completion; the future is completed
    with ``finish()`` afterwards.

    Every bucket but the last is started nonblocking, and its future is
    completed from another thread (_completion.when_done). The last bucket
    runs blocking, on the thread that runs the hook, once this State's
    earlier buckets are complete (waiting for them drives every outstanding
    operation, see engine.wait): the backward pass is over when DDP hands
    over its last bucket, so there is nothing left to overlap, DDP would
    only block on the future at once, and a future completed from the
    progress thread costs two hand-overs between threads (measured at p=2
    on this 2-core machine: 0.3-1 ms, more than a blocking 200 KB
    all-reduce). Waiting for the earlier buckets first keeps one operation
    at a time on the shared-memory window and lets the blocking call block
    in MPI without starving a nonblocking one."""
    fut = torch.futures.Future()

    def done(err):
        if err is None:
            try:
                fut.set_result(finish())
                return
            except BaseException as exc:
                err = exc
        fut.set_exception(err)

    if bucket.is_last():
        try:
            pending, state.pending = state.pending, []
            for req in pending:
                req.wait()  # their own futures are completed by their callbacks
            run(False)
        except BaseException as exc:
            done(exc)
        else:
            done(None)
        return fut
    req = run(True)
    state.pending.append(req)
    _completion.when_done(req, done)
    return fut


def _allreduce(nonblocking: bool, *args, **kwargs):
    """mpicoll's all-reduce: started (a request) or run to completion (None)."""
    if nonblocking:
        return mpicoll.iallreduce(*args, **kwargs)
    mpicoll.allreduce(*args, **kwargs)
    return None


def allreduce_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket with mpicoll's all-reduce (in place)."""
    buf = bucket.buffer()
    arr, dt = reducible(buf)
    return _launch(state, bucket,
                   lambda nb: _allreduce(nb, arr, "avg", comm=state.comm, out=arr, dtype=dt,
                                         algorithm=state.algorithm, reproducible=state.reproducible),
                   lambda: buf)


def _half_hook(state: State, bucket: dist.GradBucket, dtype: torch.dtype) -> torch.futures.Future[torch.Tensor]:
    buf = bucket.buffer()
    # Divided first, so a float16 sum of p ranks cannot overflow where the average would not.
    scaled = buf / state.size
    if buf.dtype in (torch.float32, torch.float64):
        res = state.residual(bucket.index(), buf)
        scaled += res
        half = scaled.to(dtype)
        torch.sub(scaled, half.to(buf.dtype), out=res)  # what the cast lost, carried to the next iteration
    else:
        half = scaled.to(dtype)
    arr, dt = reducible(half)

    def finish():
        buf.copy_(half)
        return buf
    return _launch(state, bucket,
                   lambda nb: _allreduce(nb, arr, "sum", comm=state.comm, out=arr, dtype=dt, algorithm=state.algorithm),
                   finish)


def fp16_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket sent as float16, with error feedback."""
    return _half_hook(state, bucket, torch.float16)


def bf16_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket sent as bfloat16, with error feedback."""
    return _half_hook(state, bucket, torch.bfloat16)


def topk_hook(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's top-k entries, the rest carried over (error feedback)."""
    buf = bucket.buffer()
    index = bucket.index()
    if buf.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"mpicoll topk_hook: float32/float64 buckets only, got {buf.dtype}")
    topk = state.topk.get(index)
    if topk is None or (topk.residual is not None and topk.residual.size != buf.numel()):  # buckets rebuilt
        topk = state.topk[index] = mpicoll.TopK(state.topk_ratio)
    arr = buf.numpy()
    return _launch(state, bucket, lambda nb: _allreduce(nb, arr, "avg", comm=state.comm, out=arr, compression=topk),
                   lambda: buf)


HOOKS = {"allreduce": allreduce_hook, "fp16": fp16_hook, "bf16": bf16_hook, "topk": topk_hook}
