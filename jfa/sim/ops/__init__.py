"""The op table: which ``tlx.*`` functions the simulator implements, per architecture.

An ``OpTable`` maps a TLX op name to its implementation ``fn(cta, *args, **kwargs)``. Tables inherit:
``CORE`` holds what every NVIDIA architecture shares (shared memory, mbarriers, named barriers, TMA,
proxy fences, the small helpers), ``HOPPER`` adds wgmma (``async_dot``/``async_dot_wait`` with register
or shared-memory A). ``BLACKWELL`` starts from ``CORE`` and adds TMEM allocations and tcgen05 MMA
completing on mbarriers (an ``AsyncOp`` landing on barriers, like a TMA load), tcgen05_commit and
single-CTA cluster launch control, 2-CTA MMA and commit (``blackwell``). Cluster ops (ranks, remote arrives and
stores, the cluster barrier, multicast and 2-CTA TMA loads) are in ``CORE``; ``jfa.sim.cluster`` runs them.

During a launch every op of the table replaces the function of that name on the ``tlx`` module; every
other TLX builtin is replaced by a stub that raises UnsupportedError naming it, so a kernel never runs
a compiler builtin by accident. ``sync=True`` ops are TLX synchronisation points: they count as a step
and may switch tasks in a seeded schedule.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpSpec:
    name: str
    fn: Callable
    sync: bool


class OpTable:
    def __init__(self, name: str, parent: "OpTable" = None):
        self.name = name
        self.ops: dict = dict(parent.ops) if parent is not None else {}

    def op(self, name: str = None, *, sync: bool = True):
        def register(fn):
            key = name or fn.__name__
            self.ops[key] = OpSpec(key, fn, sync)
            return fn
        return register

    def alias(self, name: str, target: str) -> None:
        spec = self.ops[target]
        self.ops[name] = OpSpec(name, spec.fn, spec.sync)

    def __contains__(self, name) -> bool:
        return name in self.ops


def table_for(arch: tuple) -> OpTable:
    """The op table of compute capability ``arch`` ((9, 0): Hopper)."""
    from ..errors import UnsupportedError
    from . import blackwell, core, hopper  # noqa: F401 - registers the ops

    major = int(arch[0])
    if major == 9:
        return hopper.HOPPER
    if major == 10:
        return blackwell.BLACKWELL
    raise UnsupportedError(f"architecture sm_{arch[0]}{arch[1]} is not simulated (Hopper sm_90 and Blackwell "
                           "sm_100: tensor memory, tcgen05 MMA (1- and 2-CTA), single-CTA CLC)")
