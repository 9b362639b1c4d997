"""Call plans: what a call's structure decides, worked out once and reused by later calls of that structure.

A training step calls the op once per layer with tensors of the same shapes, strides and dtypes and the
same offsets tensors, forward and backward, step after step. Everything validation and the launchers
derive from that structure (the checks' verdict, the backend, the tile lists, the launch signature, the
compiled kernel and its bound arguments) is the same for all those calls; only the data pointers of the
inputs and the fresh outputs differ. A :class:`CallPlan` keeps it, keyed by:

- q, k, v: plain ``torch.Tensor`` s (no subclass, NestedTensor or MXTensor), their shape, strides,
  dtype, device and 16-byte alignment (what the checks and the TMA layout rules read);
- the offsets tensors by identity, version counter and data pointer (as ``jfa.kernels.cache``: an
  in-place write makes a new key, a new tensor another), alive (weak references);
- every other argument with its type (``causal=1`` is not ``causal=True``: one raises, the other runs);
- ``jfa.knobs.fingerprint()`` (a setting changed by a scope or the environment makes a new key).

A plan is made only after a call with that key passed every check, so a hit skips them without
changing what any call raises: a call that would raise never has a plan. Under CUDA-graph capture, or
while torch.compile traces, no plan is used or made (the capture must record the offsets' work, the
tracer sees the custom ops). Launchers keep their own prepared launches in ``CallPlan.memo``.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Optional

import torch

from jfa import knobs
from jfa.kernels.cache import capturing

_Tensor = torch.Tensor


class CallPlan:
    """What validation decided for one call structure (``problem``: the fields of ``jfa.dispatch.Problem``
    besides the tensors), and ``memo``: the launchers' own prepared work for it, by launcher."""

    __slots__ = ("problem", "memo", "_refs")

    def __init__(self, problem: tuple, offsets: tuple):
        self.problem = problem
        self.memo: dict = {}
        self._refs = tuple(None if t is None else weakref.ref(t) for t in offsets)

    def holds(self, offsets: tuple) -> bool:
        """Whether the offsets tensors it was made for are still these very objects."""
        return all((ref is None and t is None) or (ref is not None and ref() is t) for ref, t in zip(self._refs, offsets))


def _tensor_key(t) -> Optional[tuple]:
    if t.__class__ is not _Tensor or t.is_nested:  # (a strided NestedTensor is a plain Tensor with no sizes)
        return None
    return t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16


def _offsets_key(cu) -> Optional[tuple]:
    if cu is None:
        return (None,)
    if cu.__class__ is not _Tensor:
        return None
    return id(cu), cu._version, cu.data_ptr(), cu.dtype, cu.shape


def _types(options: tuple) -> tuple:
    """The class of every option, and of every item of a tuple or list option: with the options themselves,
    equal keys mean equal arguments of equal types (``causal=1`` is not ``causal=True``)."""
    return tuple([o.__class__ if o.__class__ is not tuple and o.__class__ is not list
                  else (o.__class__, *[x.__class__ for x in o]) for o in options])


def call_key(q, k, v, cu_q, cu_k, options: tuple) -> Optional[tuple]:
    """The plan key of a call (the module docstring), or None when the call takes no plan: a tensor
    that is not a plain ``torch.Tensor``, a trace or a capture (an option that cannot be hashed makes a
    key no plan is ever found or made for).
    ``options``: every other argument of the call, in a fixed order."""
    if torch.compiler.is_compiling():  # (first: a tracer must not read data pointers)
        return None
    parts = []
    for t in (q, k, v):
        key = _tensor_key(t)
        if key is None:
            return None
        parts.append(key)
    for cu in (cu_q, cu_k):
        key = _offsets_key(cu)
        if key is None:
            return None
        parts.append(key)
    if q.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    parts.append(tuple(options) if options.__class__ is not tuple else options)
    parts.append(_types(options))
    parts.append(knobs.fingerprint())
    return tuple(parts)


def gradient_key(kind: str, dout: torch.Tensor, dlse: Optional[torch.Tensor] = None) -> tuple:
    """The ``CallPlan.memo`` key of a backward's choices that depend on the incoming gradients (``kind``: whose
    choices): their shape, strides, dtype and 16-byte alignment (what the layout rules and TMA read), and the
    settings (a backward may run under other settings than its forward's)."""
    return (kind, dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16,
            None if dlse is None else (dlse.shape, dlse.stride(), dlse.dtype), knobs.fingerprint())


class PlanCache:
    """Plans by call key, the oldest dropped past ``capacity`` (a model has a few call structures per
    batch: forward and backward of each distinct layer shape)."""

    def __init__(self, capacity: int = 256):
        self._capacity = capacity
        self._plans: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Optional[tuple], offsets: tuple) -> Optional[CallPlan]:
        """The plan made for ``key`` with these offsets tensors, or None."""
        if key is None:
            return None
        try:
            plan = self._plans.get(key)  # (a dict read is atomic; plans are replaced, never removed mid-call)
        except TypeError:  # an unhashable option: the checks run every time
            return None
        return plan if plan is not None and plan.holds(offsets) else None

    def make(self, key: Optional[tuple], offsets: tuple, problem: tuple) -> Optional[CallPlan]:
        """A new plan for ``key`` (None for a call that takes none), kept for later calls."""
        if key is None or capturing(offsets):
            return None
        try:
            hash(key)
        except TypeError:
            return None
        plan = CallPlan(problem, offsets)
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self._capacity:
                self._plans.popitem(last=False)
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


plans = PlanCache()
