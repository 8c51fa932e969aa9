"""The "mpicoll" torch.distributed backend against numpy/torch references and gloo."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from mpi4py import MPI

from torch_helpers import skip_if_too_many_ranks, torch  # noqa: F401  (skips without torch)

import torch.distributed as dist  # noqa: E402

pytestmark = pytest.mark.mpi

R = dist.ReduceOp
REDUCIBLE = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16,
             torch.float32, torch.float64]
INTS = [d for d in REDUCIBLE if not d.is_floating_point]
OPS = {R.SUM: lambda s: s.sum(0), R.PRODUCT: lambda s: s.prod(0), R.MIN: lambda s: s.amin(0),
       R.MAX: lambda s: s.amax(0)}
BITOPS = {R.BAND: np.bitwise_and, R.BOR: np.bitwise_or, R.BXOR: np.bitwise_xor}


@pytest.fixture(scope="module")
def pg():
    skip_if_too_many_ranks()
    import mpicoll.torch  # noqa: F401

    dist.init_process_group("mpicoll", init_method="mpi://")
    gloo = dist.new_group(backend="gloo")
    yield gloo
    dist.destroy_process_group()


def values(dtype, rank, n=13, op=None, seed=0):
    """Small exact values (any reduction order gives the same result); powers of two for products."""
    g = np.random.default_rng([seed, rank])
    if op == R.PRODUCT:
        v = g.choice([1, 2] if dtype in (torch.uint8,) else [-1, 1, 2], n)
    elif dtype is torch.uint8:
        v = g.integers(0, 8, n)
    else:
        v = g.integers(-8, 8, n)
    return torch.from_numpy(v).to(dtype)


def everyone(fn, p):
    return torch.stack([fn(r) for r in range(p)])


@pytest.mark.parametrize("dtype", REDUCIBLE, ids=str)
@pytest.mark.parametrize("op", list(OPS), ids=lambda o: str(o).split(".")[-1])
def test_all_reduce_every_dtype_and_op(pg, dtype, op):
    p, r = dist.get_world_size(), dist.get_rank()
    t = values(dtype, r, op=op)
    dist.all_reduce(t, op=op)
    want = OPS[op](everyone(lambda q: values(dtype, q, op=op).to(torch.float64 if dtype.is_floating_point
                                                                   else torch.int64), p)).to(dtype)
    assert torch.equal(t, want)


@pytest.mark.parametrize("dtype", INTS, ids=str)
@pytest.mark.parametrize("op", list(BITOPS), ids=lambda o: str(o).split(".")[-1])
def test_all_reduce_bitwise(pg, dtype, op):
    p, r = dist.get_world_size(), dist.get_rank()
    t = values(dtype, r)
    dist.all_reduce(t, op=op)
    want = BITOPS[op].reduce(np.stack([values(dtype, q).numpy() for q in range(p)]), axis=0)
    assert np.array_equal(t.numpy(), want)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_all_reduce_avg(pg, dtype):
    p, r = dist.get_world_size(), dist.get_rank()
    t = values(dtype, r)
    dist.all_reduce(t, op=R.AVG)
    want = everyone(lambda q: values(dtype, q).double(), p).mean(0)
    torch.testing.assert_close(t.double(), want, atol=0.05, rtol=0.01)


def test_all_reduce_bool(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    t = torch.tensor([r == 0, True, False, r % 2 == 1])
    dist.all_reduce(t)  # sum of bools: "any"
    assert t.tolist() == [True, True, False, p > 1]
    t = torch.tensor([r == 0, True])
    dist.all_reduce(t, op=R.MIN)
    assert t.tolist() == [p == 1, True]


def test_all_reduce_noncontiguous_and_zero_dim(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    base = torch.zeros(6, 4)
    view = base[:, 1]  # strided
    view.fill_(r + 1)
    dist.all_reduce(view)
    assert (base[:, 1] == p * (p + 1) / 2).all() and (base[:, 0] == 0).all()
    s = torch.tensor(float(r))
    dist.all_reduce(s, op=R.MAX)
    assert s.item() == p - 1
    e = torch.empty(0)
    dist.all_reduce(e)


def test_all_reduce_matches_gloo(pg):
    r = dist.get_rank()
    x = torch.from_numpy(np.random.default_rng([7, r]).standard_normal(10_000).astype(np.float32))
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)
    dist.all_reduce(b, group=pg)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_all_reduce_is_in_place_without_copies(pg):
    t = torch.ones(1000)
    ptr = t.data_ptr()
    dist.all_reduce(t)
    assert t.data_ptr() == ptr and (t == dist.get_world_size()).all()


def test_async_work_wait_and_future(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    ts = [torch.full((1 << 16,), float(r + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works[:2]]
    for w in works[2:]:
        assert w.wait()
    for i, f in enumerate(futs):
        out = f.wait()
        assert (out[0] == ts[i]).all()
    for i, t in enumerate(ts):
        assert (t == sum(q + i for q in range(p))).all()
    assert all(w.is_completed() for w in works)
    w = dist.broadcast(torch.zeros(3), 0, async_op=True)
    w.wait()


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.bfloat16, torch.float16, torch.float64,
                                   torch.complex64], ids=str)
def test_broadcast_every_root(pg, dtype):
    p, r = dist.get_world_size(), dist.get_rank()
    for root in range(p):
        src = (torch.arange(7) % 2 + root).to(dtype)
        t = src.clone() if r == root else torch.zeros(7, dtype=dtype)
        dist.broadcast(t, root)
        assert torch.equal(t, src)


def test_all_gather_forms(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    mine = torch.arange(3, dtype=torch.bfloat16) + r
    outs = [torch.empty(3, dtype=torch.bfloat16) for _ in range(p)]
    dist.all_gather(outs, mine)
    for q, o in enumerate(outs):
        assert torch.equal(o, torch.arange(3, dtype=torch.bfloat16) + q)
    flat = torch.empty(3 * p, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(flat, mine)
    assert torch.equal(flat, torch.cat(outs))
    obj = [None] * p
    dist.all_gather_object(obj, {"rank": r, "s": "x" * r})
    assert obj == [{"rank": q, "s": "x" * q} for q in range(p)]
    lst = [r, "b"] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, 0)
    assert lst == [0, "b"]


def test_all_gather_coalesced(pg):
    """output_lists[q][j] is rank q's input j (rank-major), for inputs of equal
    shapes (where a transposed result has the right shapes and is silently
    wrong) and of unequal shapes (torch wants one dtype); gloo too."""
    p, r = dist.get_world_size(), dist.get_rank()

    def inputs(q):
        return [torch.full((2, 3), 10.0 * q + 1), torch.full((2, 3), 10.0 * q + 2),
                torch.arange(q + 4.0, q + 9.0), torch.tensor([-q / 2])]

    for group in (None, pg):
        outs = [[torch.empty_like(t) for t in inputs(0)] for _ in range(p)]
        dist.all_gather_coalesced(outs, inputs(r), group=group)
        for q in range(p):
            for got, want in zip(outs[q], inputs(q)):
                assert torch.equal(got, want), (group, q, got, want)


def test_all_gather_coalesced_bad_lists_raise_before_sending(pg):
    p = dist.get_world_size()
    with pytest.raises(ValueError, match="all_gather_coalesced"):
        dist.all_gather_coalesced([[torch.empty(2)] for _ in range(p + 1)], [torch.ones(2)])
    with pytest.raises(ValueError, match="all_gather_coalesced"):
        dist.all_gather_coalesced([[torch.empty(3)] for _ in range(p)], [torch.ones(2)])
    dist.barrier()  # nothing was sent: the group still works


@pytest.mark.parametrize("dense_dims", [0, 2])
def test_sparse_all_reduce(pg, dense_dims):
    """Sparse COO tensors sum like their dense forms, on mpicoll as on gloo;
    rank r has r + 1 nonzeros (rank 0's overlap everyone's), one rank none at all."""
    p, r = dist.get_world_size(), dist.get_rank()

    def mine(q, dtype=torch.float32):
        nnz = 0 if q == p - 1 and p > 1 else q + 1
        idx = torch.stack([torch.arange(nnz) * 2 % (2 * p), torch.full((nnz,), q % 3)])
        return torch.sparse_coo_tensor(idx, torch.full((nnz,) + (3,) * dense_dims, q + 1.0, dtype=dtype),
                                       (2 * p, 3) + (3,) * dense_dims)

    want = sum(mine(q).to_dense() for q in range(p))
    for group in (None, pg):
        t = mine(r)
        dist.all_reduce(t, group=group)
        assert t.is_sparse and torch.equal(t.to_dense(), want)
    with pytest.raises(ValueError, match="sums only"):
        dist.all_reduce(mine(r), op=R.MAX)


def test_recv_from_any_source_returns_the_sender(pg):
    """dist.recv without src: every other rank sends to rank 0 (in turn, so
    that the order is known), which receives from any source."""
    p, r = dist.get_world_size(), dist.get_rank()
    if p < 2:
        pytest.skip("needs two ranks")
    for sender in range(1, p):
        if r == sender:
            dist.send(torch.full((3,), 10.0 * r), 0, tag=7)
        elif r == 0:
            got = torch.empty(3)
            assert dist.recv(got, tag=7) == sender
            assert (got == 10.0 * sender).all()
        dist.barrier()
    if p > 2:  # in a subgroup that leaves rank 0 out: dist.recv returns the global rank
        sub = dist.new_group(list(range(1, p)))
        if r == p - 1:
            dist.send(torch.full((2,), 5.0), 1, group=sub)
        elif r == 1:
            got = torch.empty(2)
            assert dist.recv(got, group=sub) == p - 1
            assert (got == 5.0).all()
    if r == 1:  # irecv without src: the async form too
        dist.send(torch.ones(2, dtype=torch.int64), 0, tag=8)
    elif r == 0:
        got = torch.zeros(2, dtype=torch.int64)
        w = dist.irecv(got, tag=8)
        w.wait()
        assert w._source_rank() == 1 and (got == 1).all()
    dist.barrier()


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_reduce_scatter_forms(pg, dtype):
    p, r = dist.get_world_size(), dist.get_rank()
    inputs = [values(dtype, r * p + q, n=5) for q in range(p)]
    out = torch.empty(5, dtype=dtype)
    dist.reduce_scatter(out, inputs)
    want = sum(values(dtype, q * p + r, n=5).double() for q in range(p)).to(dtype)
    assert torch.equal(out, want)
    out2 = torch.empty(5, dtype=dtype)
    dist.reduce_scatter_tensor(out2, torch.cat(inputs), op=R.MAX)
    want2 = torch.stack([values(dtype, q * p + r, n=5) for q in range(p)]).double().amax(0).to(dtype)
    assert torch.equal(out2, want2)


def test_reduce_every_root(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    for root in range(p):
        t = torch.full((4,), float(r + 1), dtype=torch.bfloat16)
        dist.reduce(t, root, op=R.SUM)
        if r == root:
            assert (t == p * (p + 1) / 2).all()
        else:
            assert (t == r + 1).all()  # non-roots keep their input


def test_barrier_send_recv_gather_scatter(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    dist.barrier()
    if p > 1:
        right, left = (r + 1) % p, (r - 1) % p
        got = torch.empty(3, dtype=torch.int64)
        w = dist.isend(torch.full((3,), r), right, tag=5)
        dist.recv(got, left, tag=5)
        w.wait()
        assert (got == left).all()
    g = [torch.empty(2) for _ in range(p)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), g, dst=0)
    if r == 0:
        assert [x[0].item() for x in g] == list(range(p))
    out = torch.empty(2)
    dist.scatter(out, [torch.full((2,), float(q)) for q in range(p)] if r == 0 else None, src=0)
    assert (out == r).all()
    src = torch.arange(2 * p, dtype=torch.float32) + 100 * r
    dst = torch.empty(2 * p)
    dist.all_to_all_single(dst, src)
    assert dst.tolist() == [100 * q + 2 * r + i for q in range(p) for i in range(2)]


def test_isend_of_a_non_contiguous_tensor_sends_its_values(pg):
    """isend of a column (non-contiguous) sends its values, from the
    contiguous copy the backend makes, with the send outstanding while other
    memory is allocated (mpi4py keeps a point-to-point send's buffer alive,
    unlike a nonblocking collective's: see test_user_buffers.py)."""
    p, r = dist.get_world_size(), dist.get_rank()
    if p == 1:
        return
    n = 100_000
    right, left = (r + 1) % p, (r - 1) % p
    got = torch.empty(n)
    w = dist.isend((torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + r)[:, 0], right, tag=6)
    junk = [torch.full((n,), 7.0) for _ in range(8)]  # reuses whatever was freed
    dist.recv(got, left, tag=6)
    w.wait()
    del junk
    assert torch.equal(got, torch.arange(0, 2 * n, 2, dtype=torch.float32) + left)


def test_functional_collectives(pg):
    import torch.distributed._functional_collectives as fc

    p, r = dist.get_world_size(), dist.get_rank()
    t = torch.full((4,), float(r))
    y = fc.wait_tensor(fc.all_reduce(t, "sum", dist.group.WORLD))
    assert (y == sum(range(p))).all()
    g = fc.wait_tensor(fc.all_gather_tensor(t, 0, dist.group.WORLD))
    assert g.shape == (4 * p,) and g[::4].tolist() == [float(q) for q in range(p)]
    s = fc.wait_tensor(fc.reduce_scatter_tensor(torch.ones(2 * p), "sum", 0, dist.group.WORLD))
    assert s.tolist() == [float(p)] * 2


def test_subgroups_and_group_of_one(pg):
    p, r = dist.get_world_size(), dist.get_rank()
    singles = [dist.new_group([q]) for q in range(p)]  # every rank creates every group, in the same order
    t = torch.full((3,), float(r))
    dist.all_reduce(t, group=singles[r])
    assert (t == r).all()
    evens = list(range(0, p, 2))
    g = dist.new_group(evens)
    gl = dist.new_group(evens, backend="gloo")
    if r in evens:
        a, b = torch.full((5,), r + 1.0), torch.full((5,), r + 1.0)
        dist.all_reduce(a, group=g)
        dist.all_reduce(b, group=gl)
        assert torch.equal(a, b) and a[0].item() == sum(q + 1 for q in evens)
        assert dist.get_rank(g) == evens.index(r) and dist.get_world_size(g) == len(evens)
        x = torch.full((2,), float(r)) if r == evens[-1] else torch.zeros(2)
        dist.broadcast(x, evens[-1], group=g)  # global rank as root
        assert (x == evens[-1]).all()


def test_avg_of_integers_raises_on_every_rank_before_sending(pg):
    with pytest.raises((TypeError, ValueError), match="avg"):
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=R.AVG)
    dist.barrier()  # nothing was left in flight


def test_async_every_collective(pg):
    """async_op=True on every collective: the work's future and wait() give the results."""
    p, r = dist.get_world_size(), dist.get_rank()
    works = []
    t = torch.full((5,), float(r + 1))
    works.append(dist.all_reduce(t, op=R.MAX, async_op=True))
    b = torch.arange(4, dtype=torch.int16) if r == p - 1 else torch.zeros(4, dtype=torch.int16)
    works.append(dist.broadcast(b, p - 1, async_op=True))
    outs = [torch.empty(2, dtype=torch.bfloat16) for _ in range(p)]
    works.append(dist.all_gather(outs, torch.full((2,), float(r), dtype=torch.bfloat16), async_op=True))
    flat = torch.empty(2 * p, dtype=torch.float64)
    works.append(dist.all_gather_into_tensor(flat, torch.full((2,), float(r), dtype=torch.float64), async_op=True))
    rs = torch.empty(3, dtype=torch.int32)
    works.append(dist.reduce_scatter_tensor(rs, torch.arange(3 * p, dtype=torch.int32) * (r + 1), async_op=True))
    rl = torch.empty(3)
    works.append(dist.reduce_scatter(rl, [torch.full((3,), float(q + r)) for q in range(p)], async_op=True))
    red = torch.full((3,), float(r + 1))
    works.append(dist.reduce(red, 0, async_op=True))
    gl = [torch.empty(2) for _ in range(p)] if r == 0 else None
    works.append(dist.gather(torch.full((2,), float(r)), gl, dst=0, async_op=True))
    sc = torch.empty(2, dtype=torch.complex64)
    works.append(dist.scatter(sc, [torch.full((2,), complex(q, 1)) for q in range(p)] if r == 0 else None, src=0,
                              async_op=True))
    a2a = torch.empty(p, dtype=torch.int64)
    works.append(dist.all_to_all_single(a2a, torch.arange(p) + 10 * r, async_op=True))
    lst = [torch.empty(1, dtype=torch.int8) for _ in range(p)]
    works.append(dist.all_to_all(lst, [torch.full((1,), q + r, dtype=torch.int8) for q in range(p)], async_op=True))
    works.append(dist.barrier(async_op=True))
    futs = [w.get_future() for w in works[::2]]
    for w in works[1::2]:
        assert w.wait()
    torch.futures.wait_all(futs)
    assert all(w.is_completed() for w in works)
    assert (t == p).all()
    assert torch.equal(b, torch.arange(4, dtype=torch.int16))
    assert [o[0].item() for o in outs] == list(range(p))
    assert flat[::2].tolist() == [float(q) for q in range(p)]
    assert torch.equal(rs, (torch.arange(3 * r, 3 * r + 3, dtype=torch.int32) * sum(range(1, p + 1))))
    assert (rl == sum(r + q for q in range(p))).all()
    if r == 0:
        assert (red == p * (p + 1) / 2).all() and [g[0].item() for g in gl] == list(range(p))
    assert (sc == complex(r, 1)).all()
    assert a2a.tolist() == [r + 10 * q for q in range(p)]
    assert [x.item() for x in lst] == [r + q for q in range(p)]


def test_empty_and_short_tensors(pg):
    """Zero elements, and fewer elements than ranks, through every reducing collective."""
    p, r = dist.get_world_size(), dist.get_rank()
    e = torch.empty(0)
    dist.all_reduce(e)
    dist.broadcast(e, 0)
    outs = [torch.empty(0) for _ in range(p)]
    dist.all_gather(outs, e)
    dist.all_gather_into_tensor(torch.empty(0), e)
    dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0))
    one = torch.tensor([float(r)])
    dist.all_reduce(one, op=R.MIN)
    assert one.item() == 0.0
    short = torch.full((max(1, p - 1),), float(r + 1), dtype=torch.float16)
    dist.all_reduce(short)
    assert (short == p * (p + 1) / 2).all()


def test_view_cache_follows_the_tensor(pg):
    """The cached numpy view of a small tensor is not reused once the tensor's
    memory, shape or dtype changes in place, nor for another tensor."""
    p = dist.get_world_size()
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t)
    assert (t == p ** 3).all()
    t.data = torch.ones(6)  # new storage, new shape
    dist.all_reduce(t)
    assert t.shape == (6,) and (t == p).all()
    t.resize_(2)
    t.fill_(1)
    dist.all_reduce(t)
    assert (t == p).all()
    t.data = torch.ones(2, dtype=torch.int32)
    dist.all_reduce(t)
    assert t.dtype is torch.int32 and (t == p).all()
    u = torch.ones(2, dtype=torch.int32)
    dist.all_reduce(u, op=R.MAX)
    dist.all_reduce(t, op=R.MAX)
    assert (u == 1).all() and (t == p).all()


def test_process_group_timeout_becomes_the_deadline(pg):
    from datetime import timedelta

    from mpicoll.torch.communicators import deadline_of
    from torch.distributed.constants import default_pg_timeout

    assert deadline_of(default_pg_timeout) is None
    assert deadline_of(timedelta(seconds=7)) == 7.0
    assert dist.group.WORLD.timeout is None  # torch's default: no deadline, the fast path
    g = dist.new_group(list(range(dist.get_world_size())), timeout=timedelta(seconds=30))
    assert g.timeout == 30.0
    t = torch.full((3,), 2.0)
    dist.all_reduce(t, group=g)
    work = dist.all_reduce(t, group=g, async_op=True)
    work.wait()
    assert (t == 2.0 * dist.get_world_size() ** 2).all()


@pytest.mark.parametrize("np_dtype", [np.uint16, np.uint32, np.uint64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR],
                         ids=lambda o: str(o).split(".")[-1])
def test_all_reduce_wide_unsigned(pg, np_dtype, op):
    """torch's uint16/32/64 (few torch ops, so the reference is numpy's); sums wrap like numpy's."""
    p, r = dist.get_world_size(), dist.get_rank()
    info = np.iinfo(np_dtype)

    def mine(q):
        g = np.random.default_rng([7, q])
        if op == R.PRODUCT:
            return g.choice(np.array([1, 2, 3], np_dtype), 9)
        v = g.integers(0, 8, 9).astype(np_dtype)
        v[0] = info.max - q  # sums wrap around
        return v

    t = torch.from_numpy(mine(r).copy())
    dist.all_reduce(t, op=op)
    ref = {R.SUM: np.add, R.PRODUCT: np.multiply, R.MIN: np.minimum, R.MAX: np.maximum, R.BAND: np.bitwise_and,
           R.BOR: np.bitwise_or, R.BXOR: np.bitwise_xor}[op].reduce(np.stack([mine(q) for q in range(p)]), axis=0)
    np.testing.assert_array_equal(t.numpy(), ref.astype(np_dtype))


def test_futures_complete_in_any_order(pg):
    """A future completes when its work does, even while the waiter thread is
    still waiting for an earlier work that depends on it (here a receive
    that the sender satisfies only after this rank's all-reduce future)."""
    import time

    p, r = dist.get_world_size(), dist.get_rank()
    if p < 2:
        pytest.skip("needs a peer")
    got = torch.zeros(1)
    first = dist.irecv(got, src=(r - 1) % p, tag=9).get_future()  # handed to the waiter first
    t = torch.ones(3)
    second = dist.all_reduce(t, async_op=True).get_future()
    deadline = time.monotonic() + 20
    while not second.done():  # not second.wait(): a hang must fail the test, not stall it
        assert time.monotonic() < deadline, "the all-reduce's future waited behind the receive"
        time.sleep(0.001)
    assert (t == p).all()
    dist.send(torch.full((1,), float(r)), dst=(r + 1) % p, tag=9)
    first.wait()
    assert got.item() == (r - 1) % p


def test_work_wait_timeout(pg):
    """Work.wait(timeout) raises once the time is up and the work is not
    complete (here a receive nobody sends to), and returns when it is."""
    from datetime import timedelta

    import mpicoll

    t = torch.ones(4)
    assert dist.all_reduce(t, async_op=True).wait(timeout=timedelta(seconds=30))
    if dist.get_world_size() < 2:
        return
    got = torch.zeros(1)
    r = dist.get_rank()
    work = dist.irecv(got, src=(r + 1) % dist.get_world_size(), tag=11)
    with pytest.raises(mpicoll.CollectiveTimeout, match="Work.wait"):
        work.wait(timeout=timedelta(seconds=0.2))
    dist.barrier()
    dist.send(torch.full((1,), float(r)), dst=(r - 1) % dist.get_world_size(), tag=11)
    assert work.wait() and got.item() == (r + 1) % dist.get_world_size()
