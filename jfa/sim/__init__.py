"""jfa.sim: a CPU simulator of TLX (Triton Low-level Extensions) on Triton's numpy interpreter.

It runs the production TLX kernels unmodified, through their own host launchers, on CPU tensors, and
reports deadlocks, races (happens-before, vector clocks), out-of-range buffer and barrier indices,
reads of never-written shared memory and pointer accesses outside the launch's tensors, each with the
kernel's source lines. See docs/simulator.md for what it models and what it does not.

    from jfa.sim import launch, Schedule, simulated

    report = launch(kernel, (grid,), *args, schedule=Schedule.seeded(7), trace=True, **kwargs)

    with simulated(arch=(9, 0), sm_count=3) as session:    # CPU tensors' TLX launches run here
        out = jfa_op_that_launches_tlx_kernels(...)
    assert session.launches > 0

Importing it checks the pinned versions (triton 3.8.0, triton-utlx 3.8.0.post16) and that the
interpreter is on (TRITON_INTERPRET=1 before triton is imported); SimSetupError says what is wrong.
"""
from __future__ import annotations

from ._env import PINS, check as _check

_check()

from .errors import (  # noqa: E402
    DeadlockError,
    KernelError,
    OutOfBoundsError,
    ProtocolError,
    ProxyRaceError,
    RaceError,
    SimError,
    SimSetupError,
    StepLimitError,
    UninitialisedReadError,
    UnsupportedError,
)
from .launch import DEFAULT_MAX_STEPS, DEFAULT_TIMEOUT_S, LaunchReport, launch  # noqa: E402
from .sched import Schedule  # noqa: E402
from .target import SimSession, install, simulated, uninstall  # noqa: E402
from jfa.kernels.triton._interpreter import install_bf16_dot_fix  # noqa: E402

# the simulator runs kernels on Triton's interpreter: with the same bf16 fixes the portable kernels install
# (a simulation must not depend on whether a portable kernel was imported first)
install_bf16_dot_fix()

__all__ = [
    "launch", "LaunchReport", "Schedule", "simulated", "install", "uninstall", "SimSession", "PINS",
    "DEFAULT_MAX_STEPS", "DEFAULT_TIMEOUT_S",
    "SimError", "DeadlockError", "RaceError", "ProxyRaceError", "OutOfBoundsError", "UninitialisedReadError",
    "ProtocolError", "StepLimitError", "KernelError", "UnsupportedError", "SimSetupError",
]
