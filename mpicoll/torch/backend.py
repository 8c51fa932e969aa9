"""The ``"mpicoll"`` backend of torch.distributed: a ProcessGroup in Python over mpicoll.

    import mpicoll.torch
    dist.init_process_group("mpicoll", init_method="mpi://")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    g = dist.new_group([0, 2])                          # an MPI sub-communicator of ranks 0 and 2

What it serves: all_reduce (SUM, PRODUCT, MIN, MAX, AVG, BAND, BOR, BXOR),
broadcast, all_gather, all_gather_into_tensor, reduce_scatter,
reduce_scatter_tensor, reduce, barrier, send/recv, gather, scatter,
all_to_all_single, the object collectives built on them, async_op=True, and
the functional collectives (torch.distributed._functional_collectives). CPU
tensors of the dtypes mpicoll reduces: int8..int64, uint8..uint64, float16,
bfloat16, float32, float64 (and bool for the logical ops); collectives that
only move data take any dtype.

Tensors are used in place: a contiguous tensor's memory is handed to
mpicoll as a numpy view (``t.numpy()``; bfloat16, which numpy lacks, as its
uint16 bits with ``dtype="bfloat16"``), so nothing is copied. A
non-contiguous tensor is copied to a contiguous one and back.

Synchronous calls (``async_op=False``) run mpicoll's blocking collective,
which has the widest choice of algorithms (shared memory on one node);
``async_op=True`` and DDP's bucket all-reduces run the nonblocking one and
return at once. See _compat.py for what happens while the nonblocking forms
other than all-reduce are missing.

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

import threading

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicoll

from . import _compat

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
    non-contiguous tensors) on whichever thread sees completion first."""

    def __init__(self, result, reqs=(), finish=None):
        super().__init__()
        self._result = result
        self._reqs = [r for r in reqs if r is not None]
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
        if not self._done:
            try:
                for r in list(self._reqs):
                    _compat.wait(r)
            except BaseException as exc:
                self._settle(exc)
            else:
                self._settle()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if not self._done and all(_compat.is_done(r) for r in list(self._reqs)):
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
        # Completion is noticed on another thread (see _compat.when_done).
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
            _compat.when_done(r, one_done)
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


# ---- the process group --------------------------------------------------------

class ProcessGroupMpicoll(dist.ProcessGroup):
    """torch.distributed ProcessGroup over an MPI communicator, run by mpicoll.

    ``algorithm`` (default "auto") goes to every mpicoll call that has one.
    """

    def __init__(self, comm: MPI.Intracomm, *, algorithm: str = "auto"):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self.p2p = comm.Dup()  # send/recv tags never meet the collectives' messages
        self.algorithm = algorithm
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
    def _start(self, opts, name, *args, **kwargs):
        """Run mpicoll collective ``name``: blocking unless asked for async work
        (no options, as from DDP's reducer, count as async)."""
        if opts is None or getattr(opts, "asyncOp", True):
            return _compat.start(name, *args, **kwargs)
        getattr(mpicoll, name)(*args, **kwargs)
        return None

    @staticmethod
    def _copy_back(pairs):
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
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            arr, dt = reducible(work)
            op = op_name(opts.reduceOp, t.dtype)
            reqs.append(self._start(opts, "allreduce", arr, op, comm=self.comm, out=arr, dtype=dt,
                                    algorithm=self.algorithm))
            pairs.append((work, orig))
        return Work(tensors, reqs, self._copy_back(pairs))

    def allreduce_coalesced(self, tensors, opts=None):
        o = dist.AllreduceOptions()
        if opts is not None:
            o.reduceOp = opts.reduceOp
        return self.allreduce(tensors, o)

    # -- broadcast --
    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        reqs, pairs = [], []
        for t in tensors:
            work, orig = _contiguous(t)
            reqs.append(self._start(opts, "bcast", as_bytes(work), opts.rootRank, comm=self.comm,
                                    algorithm=self.algorithm if self.algorithm in mpicoll.algorithms("bcast") else "auto"))
            pairs.append((work, orig))
        return Work(tensors, reqs, self._copy_back(pairs))

    # -- all-gather --
    def allgather(self, output_tensors, input_tensors, opts=None):
        """Into a list of p tensors: one gather into a staging buffer, then p copies."""
        reqs, finishers = [], []
        for outs, t in zip(output_tensors, input_tensors):
            work, _ = _contiguous(t)
            staging = torch.empty((self.size(),) + tuple(work.shape), dtype=work.dtype)
            reqs.append(self._start(opts, "allgather", as_bytes(work), comm=self.comm,
                                      out=as_bytes(staging).reshape(self.size(), -1)))
            finishers.append((outs, staging))

        def finish():
            for outs, staging in finishers:
                for i, o in enumerate(outs):
                    o.copy_(staging[i])
        return Work(output_tensors, reqs, finish)

    def all_gather_single(self, output, input, opts=None):  # noqa: A002 (torch's name)
        """all_gather_into_tensor: straight into the output's memory."""
        if output.numel() != input.numel() * self.size():
            raise ValueError(f"mpicoll backend: all_gather_into_tensor output has {output.numel()} elements, "
                             f"expected {input.numel()} x {self.size()}")
        work, orig = _contiguous(output)
        src, _ = _contiguous(input)
        req = self._start(opts, "allgather", as_bytes(src), comm=self.comm, out=as_bytes(work).reshape(self.size(), -1))
        return Work([output], [req], self._copy_back([(work, orig)]))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return _Joined(outputs, works)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

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
            reqs.append(self._start(opts, "reduce_scatter", arr, op_name(opts.reduceOp, out.dtype), comm=self.comm,
                                      counts=counts, out=oarr.reshape(-1), dtype=dt))
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
        req = self._start(opts, "reduce_scatter", arr.reshape(-1), op_name(opts.reduceOp, output.dtype), comm=self.comm,
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
            reqs.append(self._start(opts, "reduce", arr, op_name(opts.reduceOp, t.dtype), opts.rootRank, comm=self.comm,
                                      out=arr if is_root else None, dtype=dt))
            pairs.append((work, orig if is_root else None))
        return Work(tensors, reqs, self._copy_back(pairs))

    # -- barrier --
    def barrier(self, opts=None):
        return Work([], [self.comm.Ibarrier()])

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

    # -- rooted data movement and all-to-all (plain MPI on byte views) --
    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        src, _ = _contiguous(input_tensors[0])
        is_root = self.rank() == root
        staging = torch.empty((self.size(),) + tuple(src.shape), dtype=src.dtype) if is_root else None
        self.comm.Gather([as_bytes(src), MPI.BYTE], [as_bytes(staging), MPI.BYTE] if is_root else None, root=root)
        if is_root:
            for i, o in enumerate(output_tensors[0]):
                o.copy_(staging[i])
        return Work(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        work, orig = _contiguous(output_tensors[0])
        sendbuf = None
        if self.rank() == root:
            joined = torch.stack([i.detach() for i in input_tensors[0]]).contiguous()
            sendbuf = [as_bytes(joined), MPI.BYTE]
        self.comm.Scatter(sendbuf, [as_bytes(work), MPI.BYTE], root=root)
        return Work(output_tensors, (), self._copy_back([(work, orig)]))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        work, orig = _contiguous(output)
        src, _ = _contiguous(input)
        p = self.size()
        row_in = src.numel() // max(src.shape[0], 1) * src.element_size() if src.dim() else src.element_size()
        row_out = work.numel() // max(work.shape[0], 1) * work.element_size() if work.dim() else work.element_size()
        sc = [s * row_in for s in input_split_sizes] if input_split_sizes else [src.numel() * src.element_size() // p] * p
        rc = [s * row_out for s in output_split_sizes] if output_split_sizes else [work.numel() * work.element_size() // p] * p
        sd, rd = np.concatenate([[0], np.cumsum(sc)[:-1]]).tolist(), np.concatenate([[0], np.cumsum(rc)[:-1]]).tolist()
        self.comm.Alltoallv([as_bytes(src), (sc, sd), MPI.BYTE], [as_bytes(work), (rc, rd), MPI.BYTE])
        return Work([output], (), self._copy_back([(work, orig)]))

    all_to_all_single = alltoall_base

    def __repr__(self):
        return f"<mpicoll.torch.ProcessGroupMpicoll rank {self.rank()} of {self.size()}>"


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


def _create(backend_opts, pg_options=None):
    comm = _comm_for(backend_opts.group_rank, backend_opts.group_size, backend_opts.global_ranks_in_group)
    return ProcessGroupMpicoll(comm)


_registered = False


def register_backend() -> None:
    """Register ``"mpicoll"`` with torch.distributed (idempotent; importing mpicoll.torch does it)."""
    global _registered
    if not _registered:
        # devices as a list: what torch 2.13 documents for a CPU-only backend.
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
        _registered = True
