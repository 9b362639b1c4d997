"""Output allocation for every kernel launcher, with an opt-in NaN poison for tests.

Launchers allocate outputs with :func:`empty`. Inside :func:`poisoned_outputs` new floating-point
buffers are filled with NaN instead of left uninitialised, so a row a kernel never wrote shows up
as NaN in the comparison instead of passing by luck (DESIGN.md section 4).
"""
from __future__ import annotations

import contextlib
import threading

import torch

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
