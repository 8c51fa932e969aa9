"""The ``"mpicoll"`` backend of torch.distributed: a ProcessGroup in Python over mpicoll.

    import mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    g = dist.new_group([0, 2])                          # an MPI sub-communicator of ranks 0 and 2

What it serves: all_reduce (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR;
sparse COO tensors: SUM), broadcast, all_gather, all_gather_coalesced,
all_gather_into_tensor, reduce_scatter, reduce_scatter_tensor, reduce,
gather, scatter, all_to_all, all_to_all_single, barrier, send/recv (recv
from any source too), the object collectives built on them, async_op=True, and the functional collectives
(torch.distributed._functional_collectives). CPU tensors of the dtypes
mpicoll reduces: int8..int64, uint8..uint64, float16, bfloat16, float32, float64
(and bool, reduced as 0/1 bytes); collectives that only move data take any
dtype (they move bytes).

Tensors are used in place: a contiguous tensor's memory is handed to
mpicoll as a numpy view (``t.numpy()``; bfloat16, which numpy lacks, as its
uint16 bits with ``dtype="bfloat16"``), so nothing is copied. A
non-contiguous tensor is copied to a contiguous one and back.

Synchronous calls (``async_op=False``) run mpicoll's blocking collective,
which has the widest choice of algorithms (shared memory on one node);
``async_op=True`` and DDP's bucket all-reduces run the nonblocking one
(``iallreduce``, ``ibcast``, ...) and return at once; the Work's future is
completed from another thread (see _completion.py).

Small synchronous all-reduces (the latency-bound ones: loss averages,
norms, flags) call ``mpicoll.allreduce`` on the tensor's numpy view, whose
decision the communicator keeps by the call's signature (mpicoll's
plancache.py): a repeated call is served without building a plan.

Deadlines: a ``timeout=`` given to ``init_process_group``/``new_group``
(anything but torch's 30-minute default, which stands for "none given")
becomes mpicoll's deadline for every collective of the group, barrier
included (``dist.barrier(timeout=)`` sets that call's own): a collective
that has not completed by then raises ``mpicoll.CollectiveTimeout`` on that
rank (MPICOLL_TIMEOUT sets one for every collective instead). It is not
applied by default because a deadline costs every call: mpicoll then polls
instead of blocking in MPI (measured at p=2: 4 -> 15 us at 8 B, 143 -> 279
us at 1 MiB).

Ranks: the process group's ranks are MPI.COMM_WORLD's when the rendezvous
is ``mpi://``; with another rendezvous the world group is re-ordered to
torch's ranks (one MPI_Comm_split). A subgroup is an MPI communicator made
with MPI_Comm_create_group over its members alone (torch calls the creator
on members only), a group of one included.

torch 2.13 quirks met on the way: ``register_backend`` needs
``devices=["cpu"]`` (a list, not a string); the functional collectives find
a group by name, so a Python ProcessGroup must define ``setGroupName`` /
``getGroupName`` (and the ``group_name`` property) or they fail with
"ProcessGroup name not set"; the Python API of 2.13 calls
``all_gather_single`` / ``reduce_scatter_single`` for the *_tensor forms and
the functional collectives call the ``*_tensor_coalesced`` methods.
"""
from __future__ import annotations

import math
import threading
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll
from mpicoll import engine as _engine

from . import _completion

BACKEND_NAME = "mpicoll"

_RED = dist.ReduceOp.RedOpType
# Keyed by the op's int value: hashing the pybind enum itself costs more.
OPS = {int(_RED.SUM): "sum", int(_RED.PRODUCT): "prod", int(_RED.MIN): "min", int(_RED.MAX): "max",
       int(_RED.AVG): "avg", int(_RED.BAND): "band", int(_RED.BOR): "bor", int(_RED.BXOR): "bxor"}
# bool tensors are reduced as uint8 0/1: sum is "any", product is "all" (NCCL's choice too).
BOOL_OPS = {int(_RED.SUM): "max", int(_RED.PRODUCT): "min", int(_RED.MIN): "min", int(_RED.MAX): "max",
            int(_RED.BAND): "band", int(_RED.BOR): "bor", int(_RED.BXOR): "bxor"}


# ---- tensors as numpy views ---------------------------------------------------

def _contiguous(t: torch.Tensor):
    """(tensor to work on, tensor to copy the result back into or None)."""
    if not t.is_cpu:
        raise ValueError(f"mpicoll backend: CPU tensors only, got a tensor on {t.device}")
    t = t.detach()
    if t.is_contiguous():
        return t, None
    return t.contiguous(), t


def reducible(t: torch.Tensor):
    """(numpy view of contiguous ``t``'s memory, mpicoll dtype= argument)."""
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    if t.dtype is torch.bool:
        return t.view(torch.uint8).numpy(), None
    return t.numpy(), None


def as_bytes(t: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of contiguous ``t`` (any dtype)."""
    if t.numel() == 0:
        return np.empty(0, np.uint8)
    return t.reshape(-1).view(torch.uint8).numpy()


def op_name(opts_op, dtype: torch.dtype) -> str:
    red = opts_op.op if isinstance(opts_op, dist.ReduceOp) else opts_op
    table = BOOL_OPS if dtype is torch.bool else OPS
    try:
        return table[int(red)]
    except KeyError:
        raise ValueError(f"mpicoll backend: reduce op {red} is not supported for {dtype}; "
                         f"supported: {', '.join(sorted(table.values()))}") from None


# ---- work ---------------------------------------------------------------------

class Work(dist._Work):
    """One collective's handle: ``wait()``, ``is_completed()``, ``get_future()``.

    ``reqs`` are mpicoll or MPI requests (None: already complete);
    ``finish()`` runs once after they complete (copy-backs of
    non-contiguous tensors, the list forms' copies) on whichever thread sees
    completion first. ``deadline`` (seconds from now, None: none) bounds
    ``wait()`` for work whose requests are MPI's own (mpicoll's requests
    carry their deadline themselves); ``what`` names the work in the
    ``CollectiveTimeout`` raised when it passes."""

    def __init__(self, result, reqs=(), finish=None, deadline=None, what="torch work"):
        super().__init__()
        self._deadline = None if deadline is None else time.monotonic() + deadline
        self._deadline_s = deadline
        self._what = what
        self._result = result
        # MPI requests are handed to the engine here: only it tests them from now on.
        self._reqs = [_completion.adopt(r) for r in reqs if r is not None]
        self._finish = finish
        self._lock = threading.Lock()
        self._done = not self._reqs
        self._error = None
        self._future = None
        if self._done and finish is not None:
            finish()

    def _settle(self, error=None) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
            self._reqs = []
            if error is None and self._finish is not None:
                try:
                    self._finish()
                except BaseException as exc:
                    error = exc
            self._error = error
        fut = self._future
        if fut is not None:
            if error is None:
                fut.set_result(self._result)
            else:
                fut.set_exception(error)

    def wait(self, timeout=None) -> bool:
        """Wait for completion; ``timeout`` (a timedelta, as torch passes it;
        zero means none) raises ``mpicoll.CollectiveTimeout`` if the work has
        not completed by then. The collective then stays outstanding: as with
        torch's own backends, the group is broken (end the job)."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else (timeout or 0)
        own = self._deadline is not None and (seconds <= 0 or self._deadline <= time.monotonic() + seconds)
        if not self._done and (seconds > 0 or own):
            deadline = self._deadline if own else time.monotonic() + seconds
            polls = 0
            while not self.is_completed():
                if time.monotonic() > deadline:
                    if own:
                        raise self._expired()
                    raise mpicoll.CollectiveTimeout(
                        f"mpicoll backend: work not completed within Work.wait(timeout={seconds:g} s); "
                        "the collective is still outstanding", collective="torch work")
                _engine.progress()  # mpicoll's operations advance while this work is waited for
                polls += 1
                if polls > 1000:
                    time.sleep(0)
        if not self._done:
            try:
                for r in list(self._reqs):
                    _completion.wait(r)
            except BaseException as exc:
                self._settle(exc)
            else:
                self._settle()
        if self._error is not None:
            raise self._error
        return True

    def _expired(self) -> mpicoll.CollectiveTimeout:
        rank = MPI.COMM_WORLD.Get_rank()
        return mpicoll.CollectiveTimeout(
            f"mpicoll backend: {self._what} timed out on rank {rank}: it passed its timeout of "
            f"{self._deadline_s:g} s and is still outstanding", collective=self._what, rank=rank)

    def is_completed(self) -> bool:
        if not self._done and all(_completion.is_done(r) for r in list(self._reqs)):
            self._settle()
        return self._done

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        return self._result

    def get_future(self) -> torch.futures.Future:
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if self._done:
                    if self._error is None:
                        self._future.set_result(self._result)
                    else:
                        self._future.set_exception(self._error)
                    return self._future
                pending = list(self._reqs)
            else:
                return self._future
        remaining = [len(pending)]
        count_lock = threading.Lock()

        def one_done(err):
            if err is not None:
                self._settle(err)
                return
            with count_lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last:
                self._settle()

        for r in pending:
            _completion.when_done(r, one_done)
        if self._deadline is not None:  # nobody may call wait(): the future fails at the deadline itself
            timer = threading.Timer(max(0.0, self._deadline - time.monotonic()),
                                    lambda: self._done or self._settle(self._expired()))
            timer.daemon = True
            timer.start()
        return self._future


class _RecvAny(Work):
    """A receive from any source: ``_source_rank()`` (what ``dist.recv``
    asks once the work is complete) is the sender's rank in the group."""

    def __init__(self, result, req, finish):
        super().__init__(result, [req], finish)
        self._req = req

    def _source_rank(self) -> int:
        return self._req.status.Get_source()


class _Joined(Work):
    """Several works completed as one (the coalesced forms)."""

    def __init__(self, result, works):
        dist._Work.__init__(self)
        self._result = result
        self._works = works
        self._future = None

    def wait(self, timeout=None) -> bool:
        for w in self._works:
            w.wait()
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def get_future(self):
        if self._future is None:
            futs = [w.get_future() for w in self._works]
            self._future = torch.futures.collect_all(futs).then(lambda _: self._result)
        return self._future


# ---- communicators ------------------------------------------------------------

_world_comm = None  # MPI.COMM_WORLD, or a split of it in torch's rank order


def _comm_for(group_rank: int, group_size: int, global_ranks) -> MPI.Intracomm:
    """The MPI communicator of a new process group (collective over its members)."""
    global _world_comm
    world = MPI.COMM_WORLD
    ranks = list(global_ranks or [])
    default = dist.GroupMember.WORLD is None  # the default group is being created
    if default or not ranks:
        if group_size != world.Get_size():
            raise ValueError(f"mpicoll backend: the world group has {group_size} ranks but MPI.COMM_WORLD "
                             f"{world.Get_size()}; launch every rank with mpiexec")
        in_order = world.allreduce(int(group_rank != world.Get_rank()), op=MPI.SUM) == 0
        base = world if in_order else world.Split(0, key=group_rank)
        if default:
            _world_comm = base
        return base.Dup()
    base = _world_comm if _world_comm is not None else world
    if base is world and dist.get_rank() != world.Get_rank():
        raise RuntimeError("mpicoll backend: a subgroup under a non-mpicoll default group needs torch's ranks "
                           "to be MPI's: initialise with init_method='mpi://'")
    group = base.Get_group().Incl(ranks)
    try:
        comm = base.Create_group(group, tag=0)
    finally:
        group.Free()
    return comm


def deadline_of(timeout) -> float | None:
    """A process group's timeout as mpicoll's ``timeout=`` (seconds), None for
    torch's default (see the module docstring)."""
    if timeout is None or not isinstance(timeout, timedelta):
        return None
    from torch.distributed.constants import default_pg_timeout

    if timeout == default_pg_timeout or timeout <= timedelta(0):
        return None
    return timeout.total_seconds()


# ---- the process group --------------------------------------------------------

def _is_async(opts) -> bool:
    """Options without ``asyncOp`` (as from DDP's reducer, which passes none)
    count as asynchronous: the caller waits on the Work or its future."""
    return opts is None or getattr(opts, "asyncOp", True)


class ProcessGroupMpicoll(dist.ProcessGroup):
    """torch.distributed ProcessGroup over an MPI communicator, run by mpicoll.

    ``algorithm`` (default "auto") goes to every mpicoll all-reduce, and to
    the other collectives where they have an algorithm of that name;
    ``timeout`` (seconds or None) is the deadline of every collective.
    """

    def __init__(self, comm: MPI.Intracomm, *, algorithm: str = "auto", timeout: float | None = None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self.p2p = comm.Dup()  # send/recv tags never meet the collectives' messages
        self.algorithm = algorithm
        self.timeout = timeout
        # Every keyword an mpicoll call of this group takes, per collective.
        self._kw = {name: dict(comm=comm, **({"algorithm": algorithm} if algorithm in mpicoll.algorithms(name) else {}),
                               **({"timeout": timeout} if timeout is not None else {}))
                    for name in ("allreduce", "bcast", "allgather", "reduce_scatter", "reduce", "gather", "scatter",
                                 "alltoallv")}
        self._group_name = None

    # -- names (the functional collectives resolve groups by name) --
    def getBackendName(self) -> str:  # noqa: N802 (torch's spelling)
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    @property
    def group_name(self) -> str:
        return self._group_name

    # -- helpers --
    def _run(self, opts, name, *args, **kwargs):
        """Run mpicoll collective ``name``: a request when asynchronous, else
        the blocking call and None (the work is complete)."""
        kw = self._kw[name]
        if _is_async(opts):
            return getattr(mpicoll, "i" + name)(*args, **kw, **kwargs)
        getattr(mpicoll, name)(*args, **kw, **kwargs)
        return None

    @staticmethod
    def _copy_back(pairs):
        """Work's finish(): copy each ``work`` into its ``orig`` (a
        non-contiguous tensor's contiguous copy back into it, a staging row
        into an output tensor of a list form); None when nothing is to copy."""
        pairs = [(w, orig) for w, orig in pairs if orig is not None]
        if not pairs:
            return None

        def finish():
            for work, orig in pairs:
                orig.copy_(work)
        return finish

    # -- all-reduce --
    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        if any(t.layout is torch.sparse_coo for t in tensors):
            return self._sparse_allreduce(tensors, opts)
        if not opts.asyncOp and len(tensors) == 1 and self.timeout is None:
            # The latency-bound case: one small tensor, waited for at once.
            t = tensors[0]
            if t.is_cpu and t.is_contiguous() and not t.requires_grad:
                # A new numpy view on every call: mpicoll keeps the decision
                # by the call's signature, not by the array (plancache.py).
                arr, dt = reducible(t)
                op = op_name(opts.reduceOp, t.dtype)
                # dtype= only where needed: mpicoll's cached short path is
                # quickest with no keyword options at all.
                if dt is None:
                    mpicoll.allreduce(arr, op, comm=self.comm, out=arr, algorithm=self.algorithm)
                else:
                    mpicoll.allreduce(arr, op, comm=self.comm, out=arr, algorithm=self.algorithm, dtype=dt)
                return Work(tensors)
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            arr, dt = reducible(work)
            op = op_name(opts.reduceOp, t.dtype)
            reqs.append(self._run(opts, "allreduce", arr, op, out=arr, dtype=dt))
            pairs.append((work, orig))
        return Work(tensors, reqs, self._copy_back(pairs))

    def _sparse_allreduce(self, tensors, opts):
        """Sparse COO tensors, summed (gloo's one sparse op): every rank's
        indices and values are gathered (allgatherv of their bytes), joined in
        rank order and coalesced, the same sums on every rank; the result
        replaces each tensor's contents. Blocking, also for async_op=True."""
        if int(opts.reduceOp.op if isinstance(opts.reduceOp, dist.ReduceOp) else opts.reduceOp) != int(_RED.SUM):
            raise ValueError(f"mpicoll backend: sparse all_reduce sums only, got {opts.reduceOp}")
        if not all(t.layout is torch.sparse_coo and t.is_cpu for t in tensors):
            raise ValueError("mpicoll backend: sparse all_reduce takes sparse COO CPU tensors only, not mixed ones")
        kw = {"comm": self.comm, **({"timeout": self.timeout} if self.timeout is not None else {})}
        for t in tensors:
            local = t.detach().coalesce()
            # (nnz, sparse_dim) and (nnz, dense...): one rank's block is whole rows.
            idx, val = local.indices().t().contiguous(), local.values().contiguous()
            nnz = mpicoll.allgather(np.array([idx.shape[0]], np.int64), **kw).reshape(-1).tolist()
            all_idx = torch.empty((sum(nnz), idx.shape[1]), dtype=idx.dtype)
            all_val = torch.empty((sum(nnz),) + tuple(val.shape[1:]), dtype=val.dtype)
            for mine, out in ((idx, all_idx), (val, all_val)):
                row = math.prod(mine.shape[1:]) * mine.element_size()  # bytes per nonzero
                mpicoll.allgatherv(as_bytes(mine), [n * row for n in nnz], out=as_bytes(out), **kw)
            t.copy_(torch.sparse_coo_tensor(all_idx.t(), all_val, t.shape).coalesce())
        return Work(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
            o.asyncOp = opts.asyncOp
        return self.allreduce(tensors, o)

    # -- broadcast --
    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            reqs.append(self._run(opts, "bcast", as_bytes(work), opts.rootRank))
            pairs.append((work, orig))
        return Work(tensors, reqs, self._copy_back(pairs))

    # -- all-gather --
    def allgather(self, output_tensors, input_tensors, opts=None):
        """Into a list of p tensors: one gather into a staging buffer, then p copies."""
        reqs, pairs = [], []
        for outs, t in zip(output_tensors, input_tensors):
            work, _ = _contiguous(t)
            staging = torch.empty((self.size(),) + tuple(work.shape), dtype=work.dtype)
            reqs.append(self._run(opts, "allgather", as_bytes(work), out=rows(staging, self.size())))
            pairs += [(staging[i], o) for i, o in enumerate(outs)]
        return Work(output_tensors, reqs, self._copy_back(pairs))

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's name)
        """all_gather_into_tensor: straight into the output's memory."""
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"mpicoll backend: all_gather_into_tensor output has {output.numel()} elements, "
                             f"expected {input.numel()} x {self.size()}")
        work, orig = _contiguous(output)
        src, _ = _contiguous(input)
        req = self._run(opts, "allgather", as_bytes(src), out=rows(work, self.size()))
        return Work([output], [req], self._copy_back([(work, orig)]))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Joined(outputs, works)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """all_gather_coalesced: ``output_lists[r][j]`` receives rank r's
        ``input_list[j]`` (rank-major, where ``allgather``'s lists are
        tensor-major): one all-gather per input tensor, each of its own shape."""
        p = self.size()
        if len(output_lists) != p or any(len(outs) != len(input_list) for outs in output_lists):
            raise ValueError(f"mpicoll backend: all_gather_coalesced needs {p} output lists (one per rank) of "
                             f"{len(input_list)} tensors each (one per input), got "
                             f"{[len(outs) for outs in output_lists]}")
        for outs in output_lists:
            for o, t in zip(outs, input_list):
                if o.numel() != t.numel() or o.dtype != t.dtype:
                    raise ValueError(f"mpicoll backend: all_gather_coalesced output {tuple(o.shape)} {o.dtype} "
                                     f"does not match its input {tuple(t.shape)} {t.dtype}")
        per_tensor = [[output_lists[r][j] for r in range(p)] for j in range(len(input_list))]
        work = self.allgather(per_tensor, input_list, opts)
        work._result = output_lists  # what the work hands back: the caller's rank-major lists
        return work

    # -- reduce-scatter --
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        """From a list of p tensors: they are joined into one buffer first (one copy)."""
        opts = opts or dist.ReduceScatterOptions()
        reqs, pairs = [], []
        for out, ins in zip(output_tensors, input_tensors):
            work, orig = _contiguous(out)
            joined = torch.cat([i.detach().reshape(-1) for i in ins])
            arr, dt = reducible(joined)
            oarr, _ = reducible(work)
            counts = [i.numel() for i in ins]
            reqs.append(self._run(opts, "reduce_scatter", arr, op_name(opts.reduceOp, out.dtype), counts=counts,
                                  out=oarr.reshape(-1), dtype=dt))
            pairs.append((work, orig))
        return Work(output_tensors, reqs, self._copy_back(pairs))

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        """reduce_scatter_tensor: from the input's memory straight into the output's."""
        opts = opts or dist.ReduceScatterOptions()
        n = output.numel()
        if input.numel() != n * self.size():
            raise ValueError(f"mpicoll backend: reduce_scatter_tensor input has {input.numel()} elements, "
                             f"expected {n} x {self.size()}")
        work, orig = _contiguous(output)
        src, _ = _contiguous(input)
        arr, dt = reducible(src)
        oarr, _ = reducible(work)
        req = self._run(opts, "reduce_scatter", arr.reshape(-1), op_name(opts.reduceOp, output.dtype),
                        counts=[n] * self.size(), out=oarr.reshape(-1), dtype=dt)
        return Work([output], [req], self._copy_back([(work, orig)]))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Joined(outputs, works)

    # -- reduce --
    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            arr, dt = reducible(work)
            is_root = self.rank() == opts.rootRank
            reqs.append(self._run(opts, "reduce", arr, op_name(opts.reduceOp, t.dtype), opts.rootRank,
                                  out=arr if is_root else None, dtype=dt))
            pairs.append((work, orig if is_root else None))
        return Work(tensors, reqs, self._copy_back(pairs))

    # -- rooted data movement (bytes, any dtype) --
    def gather(self, output_tensors, input_tensors, opts=None):
        """Into root's list of p tensors: a staging buffer, then p copies."""
        root = opts.rootRank if opts is not None else 0
        src, _ = _contiguous(input_tensors[0])
        staging = None
        if self.rank() == root:
            staging = torch.empty((self.size(),) + tuple(src.shape), dtype=src.dtype)
        req = self._run(opts, "gather", as_bytes(src), root,
                        out=None if staging is None else rows(staging, self.size()))
        pairs = [] if staging is None else [(staging[i], o) for i, o in enumerate(output_tensors[0])]
        return Work(output_tensors, [req], self._copy_back(pairs))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """From root's list of p tensors, joined into one buffer first (one copy)."""
        root = opts.rootRank if opts is not None else 0
        work, orig = _contiguous(output_tensors[0])
        x = None
        if self.rank() == root:
            joined = torch.stack([i.detach() for i in input_tensors[0]]).contiguous()
            x = rows(joined, self.size())
        req = self._run(opts, "scatter", x, root, out=as_bytes(work))
        return Work(output_tensors, [req], self._copy_back([(work, orig)]))

    # -- all-to-all (bytes, any dtype) --
    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        """all_to_all_single: split sizes count rows of the first dimension
        (equal splits when none are given), sent as bytes."""
        work, orig = _contiguous(output)
        src, _ = _contiguous(input)
        sc = _split_bytes(src, input_split_sizes, self.size(), "input")
        rc = _split_bytes(work, output_split_sizes, self.size(), "output")
        req = self._run(opts, "alltoallv", as_bytes(src), sc, rc, out=as_bytes(work))
        return Work([output], [req], self._copy_back([(work, orig)]))

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all over lists: the inputs joined, one alltoallv, the outputs copied out."""
        if len(input_tensors) != self.size() or len(output_tensors) != self.size():
            raise ValueError(f"mpicoll backend: all_to_all takes {self.size()} input and output tensors")
        ins = [i.detach().contiguous() for i in input_tensors]
        joined = torch.cat([as_bytes_tensor(i) for i in ins]) if ins else torch.empty(0, dtype=torch.uint8)
        rc = [o.numel() * o.element_size() for o in output_tensors]
        staging = torch.empty(sum(rc), dtype=torch.uint8)
        req = self._run(opts, "alltoallv", as_bytes(joined), [i.numel() * i.element_size() for i in ins], rc,
                        out=as_bytes(staging))

        def finish():
            at = 0
            for o, n in zip(output_tensors, rc):
                block = staging[at:at + n]
                if at % o.element_size():  # outputs of mixed dtypes: view() needs an aligned offset
                    block = block.clone()
                o.copy_(block.view(o.dtype).reshape(o.shape))
                at += n
        return Work(output_tensors, [req], finish)

    # -- barrier --
    def barrier(self, opts=None):
        """MPI_Ibarrier; its deadline is the call's ``timeout=`` if given, else
        the group's: waited for (at once unless async) by polling, since
        MPI's barrier has no deadline of its own."""
        deadline = self.timeout
        given = getattr(opts, "timeout", None)
        if isinstance(given, timedelta) and given > timedelta(0):
            deadline = given.total_seconds()
        work = Work([], [self.comm.Ibarrier()], deadline=deadline,
                    what=f"barrier of {self.size()} ranks")
        if not _is_async(opts):
            work.wait()
        return work

    # -- point to point --
    def send(self, tensors, dst, tag=0):
        works = []
        for t in tensors:
            work, _ = _contiguous(t)
            works.append(self.p2p.Isend([as_bytes(work), MPI.BYTE], dst, tag))
        return Work(tensors, works)

    def recv(self, tensors, src, tag=0):
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            reqs.append(self.p2p.Irecv([as_bytes(work), MPI.BYTE], src, tag))
            pairs.append((work, orig))
        return Work(tensors, reqs, self._copy_back(pairs))

    def recv_anysource(self, tensors, tag=0):
        """recv from any rank (``dist.recv(t)`` without ``src``): the Work's
        ``_source_rank()`` is the sender's rank in this group."""
        if len(tensors) != 1:
            raise ValueError(f"mpicoll backend: recv from any source takes one tensor, got {len(tensors)}")
        work, orig = _contiguous(tensors[0])
        req = _StatusRequest(self.p2p.Irecv([as_bytes(work), MPI.BYTE], MPI.ANY_SOURCE, tag))
        return _RecvAny(tensors, req, self._copy_back([(work, orig)]))

    def __repr__(self):
        return f"<mpicoll.torch.ProcessGroupMpicoll rank {self.rank()} of {self.size()}>"


class _StatusRequest(MPI.Request):
    """An MPI request that keeps its completion's status (``status``: the
    sender of a receive from any source), whichever thread completes it and
    however (``Test``/``Wait``, as _completion calls them)."""

    def __new__(cls, req: MPI.Request):
        self = super().__new__(cls, req)
        self.status = MPI.Status()
        return self

    def Test(self, status=None):  # noqa: N802 (mpi4py's spelling)
        return super().Test(self.status)

    def Wait(self, status=None):  # noqa: N802
        return super().Wait(self.status)


def as_bytes_tensor(t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``t`` as a flat uint8 tensor over the same memory."""
    return t.reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


def rows(t: torch.Tensor, p: int) -> np.ndarray:
    """Contiguous ``t``'s bytes as p equal rows (also when ``t`` is empty)."""
    return as_bytes(t).reshape(p, t.numel() * t.element_size() // p)


def _split_bytes(t: torch.Tensor, split_sizes, p: int, what: str) -> list:
    """all_to_all_single's per-rank block lengths in bytes: ``split_sizes``
    rows of ``t``'s first dimension each, or p equal blocks."""
    row = t.element_size() * (t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1)
    if split_sizes:
        if len(split_sizes) != p:
            raise ValueError(f"mpicoll backend: all_to_all_single {what} splits must give {p} sizes, "
                             f"got {list(split_sizes)}")
        if sum(split_sizes) != (t.shape[0] if t.dim() else 1):
            raise ValueError(f"mpicoll backend: all_to_all_single {what} splits add up to {sum(split_sizes)}, "
                             f"but the {what} has {t.shape[0] if t.dim() else 1} rows")
        return [int(s) * row for s in split_sizes]
    nbytes = t.numel() * t.element_size()
    if t.dim() == 0 or t.shape[0] % p:
        raise ValueError(f"mpicoll backend: all_to_all_single without splits needs the {what}'s first "
                         f"dimension to divide by {p}, got shape {tuple(t.shape)}")
    return [nbytes // p] * p


def _create(backend_opts, pg_options=None):
    comm = _comm_for(backend_opts.group_rank, backend_opts.group_size, backend_opts.global_ranks_in_group)
    return ProcessGroupMpicoll(comm, timeout=deadline_of(getattr(backend_opts, "timeout", None)))


_registered = False


def register_backend() -> None:
    """Register ``"mpicoll"`` with torch.distributed (idempotent; importing mpicoll.torch does it)."""
    global _registered
    if not _registered:
        # devices as a list: what torch 2.13 documents for a CPU-only backend.
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
        _registered = True
