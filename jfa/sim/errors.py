"""The simulator's errors: one class per kind of finding, each rendering a report a kernel engineer can
read without a GPU.

Every error names the kernel's source line (``file:line in function``, innermost kernel frame first), the
CTA and the task it happened in, and then the sections that explain it (the state of every task and
barrier for a deadlock, both accesses for a race, ...). With tracing on (``trace=True``) the last events
before the failure are appended.

    SimError
    +-- DeadlockError           no task can run and no copy is in flight
    +-- RaceError               two accesses to shared memory not ordered by happens-before
    |   +-- ProxyRaceError      a generic-proxy store read by the async proxy without fence_async_shared
    +-- OutOfBoundsError        buffer/barrier index out of range, pointer access outside every tensor
    +-- UninitialisedReadError  a read of shared memory nothing has written
    +-- ProtocolError           a misuse of a TLX object: over-arrival, tx underflow, mismatched shapes, ...
    +-- StepLimitError          a livelock or runaway loop (step limit or wall-clock limit)
    +-- KernelError             the kernel code itself raised (a Python error inside the interpreter)
    +-- UnsupportedError        an op or feature the simulator does not model (multi-CTA CLC, aliasing, ...)

``SimSetupError`` (an ImportError) is raised at import when the environment cannot run the simulator.
"""
from __future__ import annotations

from typing import Optional, Sequence


class SimSetupError(ImportError):
    """The environment cannot run the simulator (wrong Triton / triton-utlx, interpreter off)."""


class SimError(Exception):
    """A finding of the simulator. ``summary`` is one line; ``site`` the kernel source location of the op
    that found it; ``sections`` (title, lines) explain it. The launch fills in ``kernel``, ``cta``,
    ``task`` and, with tracing, ``events`` (rendered trace lines)."""

    kind = "error"

    def __init__(self, summary: str, *, site=None, sections: Sequence = (), hint: Optional[str] = None):
        super().__init__(summary)
        self.summary = summary
        self.site = site
        self.sections = [(title, list(lines)) for title, lines in sections]
        self.hint = hint
        self.kernel: Optional[str] = None
        self.cta: Optional[tuple] = None
        self.grid: Optional[tuple] = None
        self.task: Optional[str] = None
        self.schedule: Optional[str] = None
        self.events: list = []  # rendered trace lines (tracing on)

    def add_section(self, title: str, lines) -> None:
        self.sections.append((title, list(lines)))

    def report(self) -> str:
        """The full, multi-line report."""
        out = [f"{type(self).__name__}: {self.summary}"]
        where = []
        if self.kernel:
            where.append(f"kernel {self.kernel}")
        if self.cta is not None:
            where.append(f"CTA {self.cta[0] if len(self.cta) == 1 or self.cta[1:] == (0, 0) else self.cta}"
                         + (f" of grid {self.grid}" if self.grid else ""))
        if self.task:
            where.append(f"task {self.task}")
        if self.schedule:
            where.append(f"schedule {self.schedule}")
        if where:
            out.append("  in " + ", ".join(where))
        if self.site:
            out.append("  at " + self.site.format(indent="     "))
        for title, lines in self.sections:
            out.append(f"{title}:")
            out.extend("  " + line for line in lines)
        if self.hint:
            out.append(f"hint: {self.hint}")
        if self.events:
            out.append(f"last {len(self.events)} events (oldest first):")
            out.extend("  " + line for line in self.events)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.report()


class DeadlockError(SimError):
    """No task can run and no copy is in flight, yet some task has not finished."""


class RaceError(SimError):
    """Two accesses to the same shared memory, at least one a write, not ordered by happens-before
    (or an async result used before its wait)."""


class ProxyRaceError(RaceError):
    """A generic-proxy write (``local_store``) read by the async proxy (wgmma, TMA store) with no
    ``fence_async_shared`` ordering the two."""


class OutOfBoundsError(SimError):
    """A buffer or barrier index out of range, a slice outside its buffer, or a pointer / TMA access
    outside every tensor of the launch."""


class UninitialisedReadError(SimError):
    """A read of shared memory that nothing has written."""


class ProtocolError(SimError):
    """A misuse of a TLX object: over-arrival, tx-count underflow, mismatched thread counts, shapes or
    dtypes, a CTA that ends with a copy in flight, ..."""


class StepLimitError(SimError):
    """A CTA ran past its step limit or the launch past its wall-clock limit (a livelock or a runaway
    loop)."""


class KernelError(SimError):
    """The kernel code raised an ordinary Python exception inside the interpreter (the original is the
    ``__cause__``)."""


class UnsupportedError(SimError):
    """An op or a feature the simulator does not model on this architecture."""


__all__ = ["SimSetupError", "SimError", "DeadlockError", "RaceError", "ProxyRaceError", "OutOfBoundsError",
           "UninitialisedReadError", "ProtocolError", "StepLimitError", "KernelError", "UnsupportedError"]
