"""Hopper (sm_90) ops: wgmma as ``async_dot`` / ``async_dot_wait``.

An ``async_dot`` is one wgmma group of its task. Its product is computed when it is issued (float32
accumulation of operands widened exactly to float32; fp32 operands are multiplied in fp32, not tf32),
but until an ``async_dot_wait`` retires its group:

* its shared-memory operands count as being read by the async proxy (overwriting them is a race), and
* its result is *pending*: computing with it raises RaceError (the registers are still being written).
  Passing it as ``acc`` of the next ``async_dot`` is fine: wgmma groups of a warpgroup accumulate in
  issue order. Groups retire in issue order: ``async_dot_wait(n, x)`` retires all but the newest ``n``.
"""
from __future__ import annotations

import numpy as np
import torch
import triton.language as tl

from .. import source
from ..errors import ProtocolError, RaceError, UnsupportedError
from ..smem import View
from ..values import as_bool, make_tensor, to_f32, unwrap
from . import OpTable
from .core import CORE, _data

HOPPER = OpTable("hopper", CORE)


class _Pending(np.ndarray):
    """The data of an async_dot result whose group has not retired: any computation with it raises."""

    def __array_finalize__(self, obj):
        if isinstance(obj, _Pending):
            _use_before_wait(obj)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        _use_before_wait(self if isinstance(self, _Pending) else next(i for i in inputs if isinstance(i, _Pending)))

    def __array_function__(self, func, types, args, kwargs):
        _use_before_wait(self)


def _use_before_wait(arr):
    group = arr.__dict__.get("_jfa_group")
    issued = group.site.short() if group is not None else "?"
    raise RaceError(f"the result of the async_dot issued at {issued} is used before an async_dot_wait retired "
                    "its group (its registers are still being written by the wgmma)", site=source.capture(2),
                    hint="retire it first: x = tlx.async_dot_wait(0, x), or a count that leaves only newer groups "
                         "in flight")


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 a @ b through torch (one intra-op thread during a launch: see launch.py): a multi-threaded BLAS
    on a loaded machine took milliseconds for one 64x128x128 product."""
    return torch.matmul(torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)),
                        torch.from_numpy(np.ascontiguousarray(b, dtype=np.float32))).numpy()


class WgmmaGroup:
    """One issued async_dot: its operand reads in flight and its pending result."""

    __slots__ = ("task", "site", "reads", "handle")

    def __init__(self, task, site):
        self.task, self.site, self.reads, self.handle = task, site, [], None

    def describe(self) -> str:
        return f"the async_dot issued by {self.task.name} at {self.site.short()}"

    def wait_hint(self) -> str:
        return "retire the wgmma first (tlx.async_dot_wait) and only then hand its operand buffers back"

    def retire(self, cta, task, site) -> None:
        for shadow, rec in self.reads:
            cta.smem.retire(shadow, rec, task, "async_dot_wait", site)
        h = self.handle
        if h is not None and isinstance(h.data, _Pending):
            h.data = h.data.view(np.ndarray)


def _operand(cta, x, which, task, group, site, smem_only):
    if isinstance(x, View) or hasattr(x, "shadows"):
        view = cta.view(x, site, f"async_dot operand {which}")
        group.reads.append(cta.smem.read(view, task, f"async_dot operand {which}", site, async_proxy=True,
                                         inflight=group))
        return to_f32(view.read(), view.dtype), view.dtype, view.name()
    if smem_only:
        raise ProtocolError(f"async_dot: operand {which} must be in shared memory on Hopper (wgmma reads B from "
                            f"shared memory), got {type(x).__name__}", site=site)
    data = _data(x, f"async_dot operand {which}", site)
    if not x.type.is_block() or len(x.shape) != 2:
        raise ProtocolError(f"async_dot: operand {which} must be a 2-d tensor", site=site)
    return to_f32(data, x.dtype.scalar), x.dtype.scalar, "registers"


@HOPPER.op()
def async_dot(cta, A, B, acc=None, use_acc=None, pred=None, mBarriers=None, two_ctas=False, force_async=False,
              input_precision=None, out_dtype=tl.float32):
    site = source.capture(2)
    task = cta.task
    if mBarriers:
        raise UnsupportedError("async_dot(mBarriers=...) is tcgen05 MMA (Blackwell), which is not simulated yet",
                               site=site)
    if unwrap(two_ctas):
        raise UnsupportedError("async_dot(two_ctas=True): 2-CTA MMA is not simulated yet", site=site)
    out_dtype = unwrap(out_dtype)
    group = WgmmaGroup(task, site)
    a, a_dt, a_name = _operand(cta, A, "A", task, group, site, False)
    b, b_dt, b_name = _operand(cta, B, "B", task, group, site, True)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ProtocolError(f"async_dot: shapes {list(a.shape)} x {list(b.shape)} do not chain", site=site)
    m, k = a.shape
    n = b.shape[1]
    if m < 64 or k < 16 or n < 32:  # TLX's own checks: such a wgmma does not compile
        raise ProtocolError(f"async_dot of [{m}, {k}] x [{k}, {n}]: TLX needs M >= 64, K >= 16, N >= 32", site=site)
    if a_dt != b_dt:
        raise ProtocolError(f"async_dot: operands of different types ({a_dt} A from {a_name}, {b_dt} B from {b_name})",
                            site=site)
    acc_data = None
    if acc is not None and (use_acc is None or as_bool(use_acc)):
        if not isinstance(acc, tl.tensor):
            raise ProtocolError(f"async_dot: acc must be a register tensor, got {type(acc).__name__}", site=site)
        acc_data = acc.handle.data
        if isinstance(acc_data, _Pending):  # an earlier group of this task: accumulation in issue order
            acc_data = acc_data.view(np.ndarray)
        if list(acc_data.shape) != [m, n]:
            raise ProtocolError(f"async_dot: acc of shape {list(acc_data.shape)} for a [{m}, {n}] product", site=site)
    if pred is not None and not as_bool(pred):
        out = np.zeros((m, n), np.float32) if acc_data is None else np.array(acc_data, dtype=np.float32)
    else:
        out = _matmul(a, b)
        if acc_data is not None:
            out += acc_data
    if out_dtype == tl.float16:
        out = out.astype(np.float16)
    elif out_dtype != tl.float32:
        raise ProtocolError(f"async_dot: out_dtype {out_dtype} is not simulated (float32 or float16)", site=site)
    pending = out.view(_Pending)
    pending.__dict__["_jfa_group"] = group
    result = make_tensor(pending, out_dtype)
    group.handle = result.handle
    task.dots.append(group)
    cta.trace(task, "async_dot", f"[{m}x{k}]x[{k}x{n}] A {a_name}, B {b_name}"
                                 f"{' +acc' if acc_data is not None else ''} (group {len(task.dots)} in flight)", site)
    return result


@HOPPER.op()
def async_dot_wait(cta, pendings, inp):
    task = cta.task
    keep = int(unwrap(pendings))
    n = 0
    if len(task.dots) > keep:
        site = source.capture(2)
        while len(task.dots) > keep:
            task.dots.pop(0).retire(cta, task, site)
            n += 1
    if cta.tracer is not None:
        cta.trace(task, "async_dot_wait", f"({keep}): {n} group(s) retired, {len(task.dots)} in flight",
                  source.capture(2))
    return inp
