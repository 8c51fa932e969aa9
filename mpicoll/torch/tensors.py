"""Tensors as numpy views, and torch's reduce ops as mpicoll's.

A contiguous tensor's memory is handed to mpicoll as a numpy view
(``t.numpy()``; bfloat16, which numpy lacks, as its uint16 bits with
``dtype="bfloat16"``), so nothing is copied; a non-contiguous tensor is
copied to a contiguous one (and back, by the caller).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

_RED = dist.ReduceOp.RedOpType
# Keyed by the op's int value: hashing the pybind enum itself costs more.
OPS = {int(_RED.SUM): "sum", int(_RED.PRODUCT): "prod", int(_RED.MIN): "min", int(_RED.MAX): "max",
       int(_RED.AVG): "avg", int(_RED.BAND): "band", int(_RED.BOR): "bor", int(_RED.BXOR): "bxor"}
# bool tensors are reduced as uint8 0/1: sum is "any", product is "all" (NCCL's choice too).
BOOL_OPS = {int(_RED.SUM): "max", int(_RED.PRODUCT): "min", int(_RED.MIN): "min", int(_RED.MAX): "max",
            int(_RED.BAND): "band", int(_RED.BOR): "bor", int(_RED.BXOR): "bxor"}


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
