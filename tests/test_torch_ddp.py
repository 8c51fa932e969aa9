"""DDP on the mpicoll backend: equal to DDP on gloo, hooks, without the progress thread."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from torch_helpers import sha, skip_if_too_many_ranks, torch  # noqa: F401  (skips without torch)

import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def gloo():
    skip_if_too_many_ranks()
    import mpicoll.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group("mpicoll", init_method="mpi://")
    group = dist.new_group(backend="gloo")
    yield group
    dist.destroy_process_group()


def train(process_group=None, hook=None, state=None, steps=6, seed=0, bucket_cap_mb=0.05):
    """A small MLP trained for a few SGD steps on rank-dependent data; returns its flat weights."""
    p, r = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    # Small buckets, so that several all-reduces are in flight per step.
    model = DDP(net, process_group=process_group, bucket_cap_mb=bucket_cap_mb)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1000 + r)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        y = torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return torch.cat([q.detach().reshape(-1) for q in net.parameters()])


def identical_on_all_ranks(w) -> bool:
    return len(set(MPI.COMM_WORLD.allgather(sha(w)))) == 1


def test_ddp_equals_gloo(gloo):
    a = train()
    b = train(process_group=gloo)
    assert identical_on_all_ranks(a) and identical_on_all_ranks(b)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["allreduce", "fp16", "bf16", "topk"])
def test_hooks_keep_ranks_identical_and_train(gloo, name):
    from mpicoll.torch import hooks

    ref = train(process_group=gloo)
    w = train(hook=hooks.HOOKS[name], state=hooks.State(topk_ratio=0.5))
    assert identical_on_all_ranks(w)
    tol = {"allreduce": 1e-5, "fp16": 1e-2, "bf16": 5e-2, "topk": 0.5}[name]
    torch.testing.assert_close(w, ref, rtol=tol, atol=tol)


def test_hooks_with_gloo_use_comm_world(gloo):
    from mpicoll.torch import hooks

    ref = train(process_group=gloo)
    w = train(process_group=gloo, hook=hooks.allreduce_hook, state=hooks.State(gloo))
    assert identical_on_all_ranks(w)
    torch.testing.assert_close(w, ref, rtol=1e-5, atol=1e-6)


def test_reproducible_hook_is_independent_of_algorithm(gloo):
    from mpicoll.torch import hooks

    a = train(hook=hooks.allreduce_hook, state=hooks.State(reproducible=True))
    b = train(hook=hooks.allreduce_hook, state=hooks.State(reproducible=True, algorithm="ring"))
    assert torch.equal(a, b) and identical_on_all_ranks(a)


def test_without_progress_thread(gloo):
    """DDP waits for the hook's future in C++: it must complete although nobody calls wait()."""
    from mpicoll.torch import hooks

    import mpicoll

    ref = train(process_group=gloo)
    mpicoll.set_progress_thread(False)
    try:
        w1 = train(hook=hooks.allreduce_hook, state=hooks.State())
        w2 = train()  # the backend's own all-reduce work, through get_future()
    finally:
        mpicoll.set_progress_thread(True)
    torch.testing.assert_close(w1, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2, ref, rtol=1e-5, atol=1e-6)
