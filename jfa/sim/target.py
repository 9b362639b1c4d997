"""The simulator as the launch target of CPU tensors (``jfa.kernels.tlx.common.target``).

``simulated(...)`` registers a ``LaunchTarget("tlx-sim", arch, sm_count, ...)`` for CPU tensors for the
duration of a block and puts the previous target back on exit; ``install(...)`` registers one for the
rest of the process. Either way every launch's LaunchReport is kept in the ``SimSession``, so a test
can assert that the simulator really ran (and what it ran).
"""
from __future__ import annotations

import contextlib
from typing import Optional

from jfa.kernels.tlx.common import target as _target

from .launch import DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_S, LaunchReport, launch
from .sched import Schedule

DEVICE_TYPE = "cpu"


class SimSession:
    """The simulator registered as a target: its settings and the reports of the launches it ran."""

    def __init__(self, arch=(9, 0), sm_count: int = 3, schedule: Optional[Schedule] = None, trace=False,
                 max_steps: int = DEFAULT_MAX_STEPS, timeout_s: float = DEFAULT_TIMEOUT_S, clc: bool = True,
                 cta_pair: bool = False):
        if sm_count < 1:
            raise ValueError("simulated: sm_count must be at least 1")
        self.arch = tuple(arch)
        self.sm_count = int(sm_count)
        self.schedule = schedule or Schedule.deterministic()
        self.trace = trace
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self.reports: list = []
        # the simulator models cluster launch control on sm_100 whatever the toolchain lowers
        self.clc = bool(clc) and self.arch[0] >= 10
        self.cta_pair = bool(cta_pair) and self.arch[0] >= 10
        self.target = _target.LaunchTarget("tlx-sim", self.arch, self.sm_count, self._launch, self.clc,
                                           cta_pair_backward=self.cta_pair)

    def _launch(self, kernel, grid, args, kwargs) -> None:
        report = launch(kernel, grid, *args, schedule=self.schedule, trace=self.trace, arch=self.arch,
                        max_steps=self.max_steps, timeout_s=self.timeout_s, sm_count=self.sm_count, **kwargs)
        self.reports.append(report)

    @property
    def launches(self) -> int:
        return len(self.reports)

    def kernels(self) -> list:
        """Names of the kernels launched, in order."""
        return [r.kernel for r in self.reports]

    def last(self) -> LaunchReport:
        if not self.reports:
            raise AssertionError("the simulator ran no launch in this session")
        return self.reports[-1]

    def __repr__(self) -> str:
        return (f"SimSession(arch={self.arch}, sm_count={self.sm_count}, schedule={self.schedule.describe()}, "
                f"{len(self.reports)} launches)")


@contextlib.contextmanager
def simulated(arch=(9, 0), sm_count: int = 3, schedule: Optional[Schedule] = None, trace=False,
              max_steps: int = DEFAULT_MAX_STEPS, timeout_s: float = DEFAULT_TIMEOUT_S, clc: bool = True,
              cta_pair: bool = False):
    """Run TLX launches on CPU tensors in the simulator while the block runs; yields the SimSession. ``clc``:
    on sm_100, kernels run their cluster-launch-control builds (False: the static builds a GPU runs where the
    toolchain does not lower CLC, ``TOOLCHAIN_LOWERS_CLC``). ``cta_pair``: on sm_100 the backward runs its
    2-CTA dK/dV build (clusters of two CTAs; no GPU runs it yet)."""
    session = SimSession(arch, sm_count, schedule, trace, max_steps, timeout_s, clc, cta_pair)
    previous = _target.register_target(DEVICE_TYPE, session.target)
    try:
        yield session
    finally:
        _target.register_target(DEVICE_TYPE, previous)


_installed: Optional[SimSession] = None


def install(arch=(9, 0), sm_count: int = 3, schedule: Optional[Schedule] = None, trace=False,
            max_steps: int = DEFAULT_MAX_STEPS, timeout_s: float = DEFAULT_TIMEOUT_S, clc: bool = True) -> SimSession:
    """Make the simulator the target of CPU tensors for the rest of the process (``uninstall`` undoes it);
    the arguments are ``simulated``'s."""
    global _installed
    session = SimSession(arch, sm_count, schedule, trace, max_steps, timeout_s, clc)
    _target.register_target(DEVICE_TYPE, session.target)
    _installed = session
    return session


def uninstall() -> None:
    """Remove the target ``install`` registered (a target registered since by someone else stays)."""
    global _installed
    import torch

    if _installed is not None and _target.target_for(torch.device(DEVICE_TYPE)) is _installed.target:
        _target.register_target(DEVICE_TYPE, None)
    _installed = None
