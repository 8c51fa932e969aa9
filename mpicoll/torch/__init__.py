"""PyTorch integration: the ``mpi://`` rendezvous, the ``"mpicoll"`` backend
of ``torch.distributed``, and DDP communication hooks.

    import mpicoll.torch                      # registers both (needs torch; nothing else in mpicoll does)
    import torch.distributed as dist
    dist.init_process_group("mpicoll", init_method="mpi://")   # under mpiexec
    dist.all_reduce(t)                        # runs mpicoll's all-reduce on t's memory

PyTorch's pip wheels have no "mpi" backend (``dist.is_mpi_available()`` is
False: it exists only in source builds on a host with MPI), and under
``mpiexec`` the ``env://`` rendezvous fails for want of RANK and WORLD_SIZE.
``mpi://`` takes both from MPI; it works for gloo too.
"""
from __future__ import annotations

try:
    import torch  # noqa: F401
    import torch.distributed as _dist
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("mpicoll.torch needs PyTorch; the CPU build is enough: "
                      "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu") from exc

if not _dist.is_available():  # pragma: no cover
    raise ImportError("mpicoll.torch needs a PyTorch built with torch.distributed")

from .rendezvous import register_rendezvous  # noqa: E402
from .backend import BACKEND_NAME, ProcessGroupMpicoll, register_backend  # noqa: E402
from . import hooks  # noqa: E402,F401

register_rendezvous()
register_backend()

__all__ = ["BACKEND_NAME", "ProcessGroupMpicoll", "hooks", "register_backend", "register_rendezvous"]
