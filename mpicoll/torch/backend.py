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

This module is the ProcessGroup and its registration; the tensor views and
op tables are in tensors.py, the Work handles in work.py, each group's MPI
communicator in communicators.py, the futures' completion in _completion.py.
"""
from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll

from .communicators import _comm_for, deadline_of
from .tensors import _RED, _contiguous, _split_bytes, as_bytes, as_bytes_tensor, op_name, reducible, rows
from .work import Work, _Joined, _RecvAny, _StatusRequest

BACKEND_NAME = "mpicoll"


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
