"""Output allocation for every kernel launcher, with an opt-in NaN poison for tests.

Launchers allocate outputs with :func:`empty`. Inside :func:`poisoned_outputs` new floating-point
buffers are filled with NaN instead of left uninitialised, so a row a kernel never wrote shows up
as NaN in the comparison instead of passing by luck (DESIGN.md section 4).
"""
from __future__ import annotations

import contextlib
import threading

import torch

from jfa.kernels.schedule import output_offsets

_state = threading.local()


def poisoning() -> bool:
    return getattr(_state, "poison", False)


@contextlib.contextmanager
def poisoned_outputs(enabled: bool = True):
    """Fill every output the kernels allocate in this thread with NaN while the block runs."""
    previous = poisoning()
    _state.poison = enabled
    try:
        yield
    finally:
        _state.poison = previous


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    if poisoning() and dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def forward_outputs(q, cu_q, num_seqs: int, len_q_bcast: int, broadcast_q: bool, dtype: torch.dtype = None) -> tuple:
    """``(out_cu, rows, out, lse)`` of a forward launch: the offsets of the output's rows (``cu_q``, or a
    broadcast Q's virtual ones) and their count, out ``[rows, H, D]`` in ``dtype`` (default q's) and lse
    ``[rows, H]`` float32, both from :func:`empty` (unwritten)."""
    out_cu = output_offsets(cu_q, num_seqs, len_q_bcast, broadcast_q, q.device)
    rows = num_seqs * len_q_bcast if broadcast_q else q.shape[0]
    out = empty((rows, q.shape[1], q.shape[-1]), q.dtype if dtype is None else dtype, q.device)
    lse = empty((rows, q.shape[1]), torch.float32, q.device)
    return out_cu, rows, out, lse


def unseen(out: torch.Tensor, lse: torch.Tensor) -> tuple:
    """``(out, lse)`` written as the contract has rows that see no key: out 0, lse -inf (for launchers that
    have no row or no key to launch on)."""
    out.zero_()
    lse.fill_(float("-inf"))
    return out, lse
