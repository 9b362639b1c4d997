"""What rewritten kernel code calls into: the trampoline (``__jfa_sim`` in rewritten code) and the
launch in progress.

One launch runs at a time in a process (Triton's interpreter keeps its grid index and its patched
``triton.language`` process-wide); ``ACTIVE`` is that launch while it runs, else None.
"""
from __future__ import annotations

ACTIVE = None  # the Launch in progress


class _Trampoline:
    """``__jfa_sim`` of rewritten code: builds task specs and runs async_tasks regions on the active CTA."""

    @staticmethod
    def task(region, index, line, *args, fn, **kwargs):
        from .cta import TaskSpec
        return TaskSpec(region, index, line, args, kwargs, fn)

    @staticmethod
    def run_tasks(specs):
        ACTIVE.cta.run_tasks(specs)


TRAMPOLINE = _Trampoline()
